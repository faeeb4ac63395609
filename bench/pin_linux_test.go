package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPinnedNodeAndLoad starts a real policyd node with -node-cpus 0 while
// bench's threads are pinned with -load-cpus 1, and checks every thread of
// both from /proc.
func TestPinnedNodeAndLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts policyd")
	}
	allowed, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(allowed, 0) || !slices.Contains(allowed, 1) {
		t.Skipf("needs CPUs 0 and 1; this process may use %s", formatCPUs(allowed))
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skipf("no taskset: %v", err)
	}
	before := threadsAllowed(t, "self")

	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	binary := filepath.Join(dir, "policyd")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", binary, "./cmd/policyd")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	env := &runEnv{binary: binary, workDir: dir, readyTimeout: 30 * time.Second, nodeLogLevel: "warn",
		allowedCPUs: allowed, stderr: os.Stderr, logf: t.Logf}
	var pins pinFlags
	if err := pins.node.Set("0"); err != nil {
		t.Fatal(err)
	}
	if err := pins.load.Set("1"); err != nil {
		t.Fatal(err)
	}
	unpin, err := applyPins(env, pins)
	if err != nil {
		t.Fatal(err)
	}
	unpinned := false
	defer func() {
		if !unpinned {
			_ = unpin()
		}
	}()
	for tid, cpus := range threadsAllowed(t, "self") {
		if cpus != "1" {
			t.Errorf("bench thread %s: Cpus_allowed_list %q, want 1", tid, cpus)
		}
	}

	cl, _, stop, err := startReady(t.Context(), env, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodeThreads := threadsAllowed(t, strconv.Itoa(cl.nodes[0].cmd.Process.Pid))
	var stopErr error
	stop(&stopErr)
	if stopErr != nil {
		t.Errorf("stop: %v", stopErr)
	}
	if len(nodeThreads) < 2 {
		t.Errorf("node has %d thread(s); want a Go runtime's several", len(nodeThreads))
	}
	for tid, cpus := range nodeThreads {
		if cpus != "0" {
			t.Errorf("node thread %s: Cpus_allowed_list %q, want 0", tid, cpus)
		}
	}

	unpinned = true
	if err := unpin(); err != nil {
		t.Fatalf("unpin: %v", err)
	}
	want := before[strconv.Itoa(os.Getpid())] // the main thread's
	for tid, cpus := range threadsAllowed(t, "self") {
		if cpus != want {
			t.Errorf("after unpin, bench thread %s: Cpus_allowed_list %q, want %q", tid, cpus, want)
		}
	}
}

// threadsAllowed reads Cpus_allowed_list of every thread of /proc/<pid>.
func threadsAllowed(t *testing.T, pid string) map[string]string {
	t.Helper()
	dir := filepath.Join("/proc", pid, "task")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue // the thread ended
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "Cpus_allowed_list:"); ok {
				out[e.Name()] = strings.TrimSpace(v)
			}
		}
		f.Close()
	}
	if len(out) == 0 {
		t.Fatalf("no thread of %s has a Cpus_allowed_list", dir)
	}
	return out
}
