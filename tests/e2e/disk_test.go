package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/store/boltcheck"
)

// Damaged or full disks (docs/operations.md): real `policyd serve`
// processes on a data directory damaged while they were stopped, or on a
// small tmpfs that fills up.

// putPolicies writes names through base's REST API and returns those the
// node acknowledged (200 or 201); it stops at the first failure when stop is
// set.
func putPolicies(base string, names []string, reason string, stop bool) []string {
	api, err := adminclient.New(adminclient.Config{Servers: []string{base}, HTTPClient: &http.Client{Timeout: 5 * time.Second}})
	if err != nil {
		panic(err)
	}
	var acked []string
	for _, name := range names {
		body := fmt.Sprintf(`{"name": %q, "kind": "ToolPolicy", "scope": {"org": "acme"},
 "spec": {"tool_name": "Bash", "action": "deny", "reason": %q}}`, name, reason)
		if _, err := api.PutPolicy(context.Background(), name, []byte(body), adminclient.AnyRevision); err == nil {
			acked = append(acked, name)
			continue
		}
		if stop {
			break
		}
	}
	return acked
}

func policyNamesN(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("acme.%s-%03d", prefix, i)
	}
	return names
}

// waitHolds waits until node i of c holds every name.
func (c *procCluster) waitHolds(i int, names []string) {
	c.t.Helper()
	poll.Eventually(c.t, fmt.Sprintf("%s to hold the %d acknowledged policies", c.ids[i], len(names)), func() error {
		got, err := c.policyNames(i)
		if err != nil {
			return err
		}
		for _, n := range names {
			if !slices.Contains(got, n) {
				return fmt.Errorf("%s lacks %s (has %d)", c.ids[i], n, len(got))
			}
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

}

// refusal is how a node that must not run ended.
type refusal struct {
	out    string
	code   int
	served bool // its HTTP port answered meanwhile
}

// startRefused starts `policyd serve args...` in dir, probes base while it
// runs, and waits for it to exit.
func startRefused(t *testing.T, dir, base string, args ...string) refusal {
	t.Helper()
	d := startDaemon(t, dir, args...)
	return waitEnd(t, d, base, 30*time.Second)
}

// waitEnd waits for d to exit within timeout, probing base meanwhile.
func waitEnd(t *testing.T, d *daemon, base string, timeout time.Duration) refusal {
	t.Helper()
	var r refusal
	hc := &http.Client{Timeout: 100 * time.Millisecond}
	poll.Eventually(t, "the node to exit", func() error {
		select {
		case err := <-d.done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				r.code = ee.ExitCode()
			}
			return nil
		default:
		}
		if base != "" {
			if resp, err := hc.Get(base + "/readyz"); err == nil {
				resp.Body.Close()
				r.served = true
			}
		}
		return fmt.Errorf("still running:\n%s", d.logs)
	}, poll.Within(timeout), poll.Every(20*time.Millisecond))
	r.out = d.logs.String()
	return r
}

// checkLastLine requires that the process ended with exit code 1 and one
// ERROR line, its last, that names file and says each of want; and no
// panic, stack trace or served listener.
func checkLastLine(t *testing.T, r refusal, file string, want ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.out, "\n"), "\n")
	last := lines[len(lines)-1]
	switch {
	case r.code != 1:
		t.Errorf("exit code %d, want 1", r.code)
	case strings.Count(r.out, "level=ERROR") != 1 || !strings.Contains(last, "level=ERROR"):
		t.Errorf("want exactly one ERROR line, the last; last line: %s", last)
	case !strings.Contains(last, "file="+file+" "):
		t.Errorf("last line does not name file=%s: %s", file, last)
	}
	for _, w := range want {
		if !strings.Contains(last, w) {
			t.Errorf("last line does not say %q: %s", w, last)
		}
	}
	for _, bad := range []string{"panic", "goroutine ", "fatal error", "[signal "} {
		if strings.Contains(r.out, bad) {
			t.Errorf("output holds %q", bad)
		}
	}
	if r.served {
		t.Error("the node answered HTTP")
	}
	if t.Failed() {
		t.Logf("output:\n%s", r.out)
	}
}

// highMark is the size a bbolt file needs: pages in use times page size.
func highMark(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := boltcheck.CheckReader(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	return int64(m.HighMark) * int64(m.PageSize)
}

func overwrite(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedDataRefused: a node whose state.db or Raft log was cut short
// or overwritten while it was stopped refuses to start, with one line that
// names the file, the damage and the recovery; the recovery it names brings
// back every write the node acknowledged.
func TestDamagedDataRefused(t *testing.T) {
	// Snapshots and a short log, so that rebuilding state.db restores a
	// Raft snapshot and replays the log after it.
	const snapshots = "  snapshot_threshold: 8\n  trailing_logs: 4\n  snapshot_interval: 100ms\n"
	const wal = "  log_store: wal\n"
	// The raft.db cases damage raft-boltdb's file: they choose that log
	// store, which new data dirs no longer get by default.
	const boltdb = "  log_store: boltdb\n"
	stateDB, raftDB := "state.db", filepath.Join("raft", "raft.db")
	tests := []struct {
		name      string
		raftExtra string
		file      string // damaged, in the data directory
		damage    func(t *testing.T, path string)
		want      string
		rebuild   bool // recovery: move state.db aside (else: restore from state.db)
	}{
		{"state.db truncated", snapshots, stateDB, func(t *testing.T, p string) {
			if err := os.Truncate(p, highMark(t, p)/2); err != nil {
				t.Fatal(err)
			}
		}, "the file is truncated", true},
		{"state.db meta pages overwritten", snapshots, stateDB, func(t *testing.T, p string) {
			overwrite(t, p, 16, []byte("overwritten"))
			overwrite(t, p, 4096+16, []byte("overwritten"))
		}, "both meta pages are invalid", true},
		{"state.db pages overwritten", snapshots, stateDB, func(t *testing.T, p string) {
			for off, end := int64(2*4096), highMark(t, p); off < end; off += 4096 {
				overwrite(t, p, off, []byte("this page was overwritten by something else"))
			}
		}, "damaged bbolt file: page", true},
		{"raft.db truncated", snapshots + boltdb, raftDB, func(t *testing.T, p string) {
			if err := os.Truncate(p, highMark(t, p)-4096); err != nil {
				t.Fatal(err)
			}
		}, "the file is truncated", false},
		{"raft.db meta pages overwritten", boltdb, raftDB, func(t *testing.T, p string) {
			overwrite(t, p, 16, []byte("overwritten"))
			overwrite(t, p, 4096+16, []byte("overwritten"))
		}, "both meta pages are invalid", false},
		{"raft.db entry overwritten", boltdb, raftDB, func(t *testing.T, p string) {
			db, err := bolt.Open(p, 0o600, &bolt.Options{NoFreelistSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.Update(func(tx *bolt.Tx) error {
				k, _ := tx.Bucket([]byte("logs")).Cursor().Last()
				return tx.Bucket([]byte("logs")).Put(k, []byte{0xc1, 0xc1, 0xc1})
			}); err != nil {
				t.Fatal(err)
			}
		}, "entry", false},
		{"raft-wal segment cut short", wal, filepath.Join("raft", "wal"), func(t *testing.T, p string) {
			segs, err := filepath.Glob(filepath.Join(p, "*.wal"))
			if err != nil || len(segs) != 1 {
				t.Fatalf("segments %v (%v)", segs, err)
			}
			if err := os.Truncate(segs[0], 2048); err != nil {
				t.Fatal(err)
			}
		}, "the end of the log is lost", false},
		{"raft-wal meta db overwritten", wal, filepath.Join("raft", "wal"), func(t *testing.T, p string) {
			overwrite(t, filepath.Join(p, "wal-meta.db"), 0, make([]byte, 2*4096))
		}, "both meta pages are invalid", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newProcClusterWith(t, 1, tc.raftExtra)
			written := policyNamesN("p", 30)
			if acked := putPolicies(c.http[0], written, "r", false); len(acked) != len(written) {
				t.Fatalf("%d of %d writes acknowledged", len(acked), len(written))
			}
			if strings.HasPrefix(tc.raftExtra, snapshots) {
				poll.Eventually(t, "a raft snapshot", func() error {
					s, _ := filepath.Glob(filepath.Join(c.dataDir(0), "raft", "snapshots", "*", "meta.json"))
					if len(s) == 0 {
						return errors.New("none yet")
					}
					return nil
				}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

			}
			c.daemons[0].interrupt(t)
			rel := filepath.Join("data", c.ids[0], tc.file)
			tc.damage(t, filepath.Join(c.dir, rel))

			r := startRefused(t, c.dir, c.http[0], "--config", c.configPath(0))
			stateRel := filepath.Join("data", c.ids[0], "state.db")
			if tc.rebuild {
				checkLastLine(t, r, rel, tc.want, "mv "+stateRel+" "+stateRel+".damaged")
				if err := os.Rename(filepath.Join(c.dir, stateRel), filepath.Join(c.dir, stateRel+".damaged")); err != nil {
					t.Fatal(err)
				}
			} else {
				restore := "policyd snapshot restore --force " + stateRel
				checkLastLine(t, r, rel, tc.want, restore, "policyd cluster remove "+c.ids[0])
				if out := cli(t, c.dir, "snapshot", "restore", "--force", stateRel, "--config", c.configPath(0)); !strings.Contains(out, "restored") {
					t.Fatalf("restore: %s", out)
				}
			}
			c.start(0)
			waitReady(t, c.http[0])
			c.waitHolds(0, written)
			if acked := putPolicies(c.http[0], []string{"acme.after"}, "r", false); len(acked) != 1 {
				t.Error("the recovered node takes no write")
			}
		})
	}
}

// TestDamagedLogRejoin: a member of a 3-node cluster whose Raft log was cut
// short refuses to start and names the way back; removed, wiped and joined
// again as its line says, it holds every acknowledged write.
func TestDamagedLogRejoin(t *testing.T) {
	// raft-boltdb's raft.db is what gets cut short.
	c := newProcClusterWith(t, 3, "  log_store: boltdb\n")
	leader := c.leader(0, 1, 2)
	written := policyNamesN("c", 30)
	if acked := putPolicies(c.http[leader], written, "r", false); len(acked) != len(written) {
		t.Fatalf("%d of %d writes acknowledged", len(acked), len(written))
	}
	victim := (leader + 1) % 3
	c.waitHolds(victim, written)
	c.daemons[victim].interrupt(t)
	rel := filepath.Join("data", c.ids[victim], "raft", "raft.db")
	p := filepath.Join(c.dir, rel)
	if err := os.Truncate(p, highMark(t, p)/2); err != nil {
		t.Fatal(err)
	}

	r := startRefused(t, c.dir, c.http[victim], "--config", c.configPath(victim))
	joinCmd := fmt.Sprintf("policyd cluster join --id %s --raft-addr %s", c.ids[victim], c.raft[victim])
	checkLastLine(t, r, rel, "the file is truncated", "policyd cluster remove "+c.ids[victim], joinCmd, "raft.bootstrap false")

	healthy := (victim + 1) % 3
	c.leader(healthy, (victim+2)%3)
	c.cli(healthy, "cluster", "remove", c.ids[victim])
	if err := os.Rename(c.dataDir(victim), c.dataDir(victim)+".damaged"); err != nil {
		t.Fatal(err)
	}
	c.daemons[victim] = startDaemon(t, c.dir, "--config", c.configPath(victim), "--bootstrap=false")
	poll.Eventually(t, "the join to be accepted", func() error {
		out, err := cliErr(t, c.dir, "--server", c.http[healthy], "cluster", "join", "--id", c.ids[victim], "--raft-addr", c.raft[victim])
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	c.waitHolds(victim, written)
	c.converged(0, 1, 2)
}

// TestFullDisk: a node whose data directory fills up (a small tmpfs) ends
// with one ERROR line naming the file and "no space left on device", exit
// code 1, no panic; its data moved to a larger disk, it holds every write
// it acknowledged. With raft-boltdb the log's append fails; raft-wal
// preallocates its segment, so there state.db's commit fails.
func TestFullDisk(t *testing.T) {
	for _, tc := range []struct {
		kind, size string
		files      []string // one of them is named, in the data directory
	}{
		{"boltdb", "16m", []string{filepath.Join("raft", "raft.db"), "state.db"}},
		{"wal", "80m", []string{"state.db", filepath.Join("raft", "wal"), filepath.Join("raft", "wal", "wal-meta.db")}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			dir := t.TempDir()
			disk := mountTmpfs(t, filepath.Join(dir, "disk"), tc.size)
			base, writeConfig := soloConfig(t, dir, tc.kind)
			d := startDaemon(t, dir, "--config", writeConfig(filepath.Join(disk, "data")))
			waitReady(t, base)
			acked := putPolicies(base, policyNamesN("before", 10), "r", false)
			if len(acked) != 10 {
				t.Fatalf("%d of 10 writes acknowledged before the disk filled", len(acked))
			}

			fillDisk(t, filepath.Join(disk, "fill"))
			reason := strings.Repeat("x", 3000)
			start := time.Now()
			// Write until a write is not acknowledged: the node has ended.
			for i := range 2000 {
				more := putPolicies(base, []string{fmt.Sprintf("acme.full-%04d", i)}, reason, false)
				acked = append(acked, more...)
				if len(more) == 0 {
					break
				}
			}
			r := waitEnd(t, d, "", 30*time.Second)
			t.Logf("the node ended %v after the disk filled, %d writes acknowledged in all", time.Since(start), len(acked))
			named := ""
			for _, f := range tc.files {
				if strings.Contains(r.out, "file="+filepath.Join(disk, "data", f)+" ") {
					named = filepath.Join(disk, "data", f)
				}
			}
			if named == "" {
				t.Fatalf("the last line names none of %v:\n%s", tc.files, r.out)
			}
			checkLastLine(t, r, named, "no space left on device", "free space on the disk of")
			t.Logf("last line: %s", r.out[strings.LastIndex(strings.TrimRight(r.out, "\n"), "\n")+1:])

			// Move the data to a larger disk and start again.
			larger := filepath.Join(dir, "larger")
			if out, err := exec.Command("cp", "-a", filepath.Join(disk, "data"), larger).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v: %s", err, out)
			}
			if out, err := exec.Command("umount", disk).CombinedOutput(); err != nil {
				t.Fatalf("umount: %v: %s", err, out)
			}
			d = startDaemon(t, dir, "--config", writeConfig(larger))
			waitReady(t, base)
			c := &procCluster{t: t, dir: dir, ids: []string{"node1"}, http: []string{base}}
			c.waitHolds(0, acked)
			d.interrupt(t)
		})
	}
}

// TestWALSegmentNoSpace: a fresh node whose disk cannot hold raft-wal's
// preallocated segment stops with one line naming the segment, the size it
// needs against the space free, and what to do; given the space, it starts.
func TestWALSegmentNoSpace(t *testing.T) {
	dir := t.TempDir()
	disk := mountTmpfs(t, filepath.Join(dir, "disk"), "16m")
	base, writeConfig := soloConfig(t, dir, "wal")
	config := writeConfig(filepath.Join(disk, "data"))
	r := waitEnd(t, startDaemon(t, dir, "--config", config), "", 30*time.Second)
	segment := filepath.Join(disk, "data", "raft", "wal", "00000000000000000001-0000000000000000.wal")
	checkLastLine(t, r, segment, "preallocates 64 MiB for each log segment, and the disk has ", " MiB free",
		"no space left on device", "free space on the disk of", "raft.log_store: boltdb")

	if out, err := exec.Command("mount", "-o", "remount,size=100m", disk).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	d := startDaemon(t, dir, "--config", config)
	waitReady(t, base)
	d.interrupt(t)
}

// mountTmpfs mounts a tmpfs of size at dir, or skips the test where that is
// not allowed.
func mountTmpfs(t *testing.T, dir, size string) string {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root and mount permission): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// soloConfig picks a single node's ports and returns its base URL and a
// function that writes its config, on a data directory, to dir/node.yaml.
func soloConfig(t *testing.T, dir, logStore string) (string, func(dataDir string) string) {
	t.Helper()
	ports := freePorts(t, 3)
	return fmt.Sprintf("http://127.0.0.1:%d", ports[0]), func(dataDir string) string {
		path := filepath.Join(dir, "node.yaml")
		cfg := fmt.Sprintf("node_id: node1\ndata_dir: %s\nhttp: {addr: \"127.0.0.1:%d\"}\ngrpc: {addr: \"127.0.0.1:%d\"}\n"+
			"raft: {addr: \"127.0.0.1:%d\", bootstrap: true, log_store: %s}\n", dataDir, ports[0], ports[1], ports[2], logStore)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
}

// fillDisk writes path until the file system has no space left.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4096, 1} {
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", path, err)
				}
				break
			}
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil || st.Bavail != 0 {
		t.Fatalf("after filling, %d blocks left (%v)", st.Bavail, err)
	}
}
