package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// These tests run the built binary exactly as the README tells a user to:
// `policyd serve` in a clean directory, then the CLI against it, and the
// 3-node walkthrough with examples/cluster.

const examplePolicy = `# YAML works as well as JSON
name: acme.deny-shell
kind: ToolPolicy
scope: {org: acme}
spec:
  tool_name: Bash
  action: deny
  reason: Shell commands blocked
  conditions: {patterns: ["rm -rf"]}
`

// TestReadmeSingleNode: `policyd serve` with no config in a clean directory,
// a PUT and GET through the CLI, Ctrl-C, restart: the policy is still there.
func TestReadmeSingleNode(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(examplePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, dir)
	waitReady(t, "http://127.0.0.1:8080")
	if out := cli(t, dir, "policy", "apply", "-f", "policy.yaml"); !strings.Contains(out, "policy/acme.deny-shell applied") {
		t.Fatalf("apply output: %s", out)
	}
	var p struct {
		Name     string `json:"name"`
		Revision uint64 `json:"revision"`
	}
	if err := json.Unmarshal([]byte(cli(t, dir, "policy", "get", "acme.deny-shell")), &p); err != nil || p.Revision == 0 {
		t.Fatalf("get: %+v %v", p, err)
	}
	if out := cli(t, dir, "policy", "list"); !strings.Contains(out, "org=acme") {
		t.Fatalf("list: %s", out)
	}
	// events watch prints each new event as a JSON line.
	watch := exec.Command(policydBinary(t), "events", "watch", "--after", strconv.FormatUint(p.Revision, 10))
	watch.Env = servertest.CleanEnv()
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if out, err := cliInput(t, dir, `{"id": "alice", "org": "acme", "team": "red"}`, "employee", "apply", "-f", "-", "--if-match", "0"); err != nil {
		t.Fatalf("employee apply: %v %s", err, out)
	}
	select {
	case line := <-lines:
		var ev struct {
			EntityType string `json:"entity_type"`
			EntityID   string `json:"entity_id"`
			Action     string `json:"action"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.EntityType != "employee" || ev.EntityID != "alice" || ev.Action != "CREATE" {
			t.Fatalf("watch printed %q (%v)", line, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("events watch printed nothing")
	}
	_ = watch.Process.Kill()
	_ = watch.Wait()
	if out, err := cliErr(t, dir, "policy", "get", "missing"); err == nil || !strings.Contains(out, "404 not_found") {
		t.Fatalf("get missing: %v %s", err, out)
	}
	// raft's go-metrics are bridged into the same registry as ours.
	resp, err := http.Get("http://127.0.0.1:8080/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"policyd_raft_apply", "policyd_http_requests_total", "policyd_store_applied_index", "go_goroutines"} {
		if !bytes.Contains(metrics, []byte(m)) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	// The README's console URL, on the default with no config: auth is
	// off, so the Overview renders with its banner.
	resp, err = http.Get("http://127.0.0.1:8080/ui/")
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(page, []byte(`id="auth-off"`)) || !bytes.Contains(page, []byte("<h1>Overview</h1>")) {
		t.Errorf("GET /ui/: %d\n%.400s", resp.StatusCode, page)
	}
	took := d.interrupt(t)
	t.Logf("shutdown took %v", took)
	logs := d.logs.String()
	// Listeners first, then raft and bbolt: "shut down" is the last step.
	if i, j := strings.Index(logs, "shutting down"), strings.Index(logs, "msg=\"shut down\""); i < 0 || j < i {
		t.Fatalf("no ordered shutdown in logs:\n%s", logs)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "state.db")); err != nil {
		t.Fatalf("embedded default did not use ./data: %v", err)
	}

	d2 := startDaemon(t, dir)
	waitReady(t, "http://127.0.0.1:8080")
	var again struct {
		Revision uint64 `json:"revision"`
	}
	if err := json.Unmarshal([]byte(cli(t, dir, "policy", "get", "acme.deny-shell")), &again); err != nil || again.Revision != p.Revision {
		t.Fatalf("after restart: %+v %v", again, err)
	}
	if out := cli(t, dir, "events", "list"); !strings.Contains(out, "acme.deny-shell") {
		t.Fatalf("events list: %s", out)
	}

	// A crash leaves state.db, written without fsync (raft.state_fsync off),
	// marked dirty: the next start discards it and rebuilds it from the
	// raft log, losing nothing.
	statePath := filepath.Join(dir, "data", "state.db")
	if _, err := os.Stat(statePath + ".dirty"); err != nil {
		t.Fatalf("running node's state.db is not marked dirty: %v", err)
	}
	d2.kill(t)
	d3 := startDaemon(t, dir)
	waitReady(t, "http://127.0.0.1:8080")
	poll.Eventually(t, "the policy back after a crash", func() error {
		out, err := cliErr(t, dir, "policy", "get", "acme.deny-shell")
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		if err := json.Unmarshal([]byte(out), &again); err != nil {
			return fmt.Errorf("got %s: %w", out, err)
		}
		if again.Revision != p.Revision {
			return fmt.Errorf("got %s, want revision %d", out, p.Revision)
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	if !strings.Contains(d3.logs.String(), "not closed cleanly: discarded") {
		t.Errorf("no discard logged after the crash:\n%s", d3.logs)
	}
	d3.interrupt(t)
	if _, err := os.Stat(statePath + ".dirty"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("state.db still marked dirty after a clean stop: %v", err)
	}
}

// TestReadmeClusterWalkthrough: the three example configs form a cluster;
// a write through one node is read on another; membership changes at run
// time.
func TestReadmeClusterWalkthrough(t *testing.T) {
	dir := t.TempDir()
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("node%d.yaml", i)
		b, err := os.ReadFile(filepath.Join(repoRoot, "examples", "cluster", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(examplePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	var ds []*daemon
	for i := 1; i <= 3; i++ {
		ds = append(ds, startDaemon(t, dir, "--config", fmt.Sprintf("node%d.yaml", i)))
	}
	for i := 1; i <= 3; i++ {
		waitReady(t, fmt.Sprintf("http://127.0.0.1:808%d", i))
	}
	cli(t, dir, "--server", "http://127.0.0.1:8082", "policy", "apply", "-f", "policy.yaml")
	resp, err := http.Get("http://127.0.0.1:8083/v1/policies/acme.deny-shell?consistent=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("consistent read on node3: %d", resp.StatusCode)
	}
	var st struct {
		LeaderID string `json:"leader_id"`
		Members  []struct {
			ID       string `json:"id"`
			HTTPAddr string `json:"http_addr"`
		} `json:"members"`
	}
	poll.Eventually(t, "three registered members", func() error {
		if err := json.Unmarshal([]byte(cli(t, dir, "--server", "http://127.0.0.1:8081", "-o", "json", "cluster", "status")), &st); err != nil {
			return err
		}
		if len(st.Members) != 3 {
			return fmt.Errorf("%d members", len(st.Members))
		}
		for _, m := range st.Members {
			if m.HTTPAddr == "" {
				return fmt.Errorf("%s has not registered", m.ID)
			}
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	// kill -9 the leader: a survivor takes writes once a new leader is
	// elected, and the killed node catches up when it comes back.
	leaderNum := int(st.LeaderID[len(st.LeaderID)-1] - '0')
	ds[leaderNum-1].kill(t)
	survivor := fmt.Sprintf("http://127.0.0.1:808%d", leaderNum%3+1)
	poll.Eventually(t, "a write through a survivor", func() error {
		_, err := cliErr(t, dir, "--server", survivor, "policy", "apply", "-f", "policy.yaml")
		return err
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	ds[leaderNum-1] = startDaemon(t, dir, "--config", fmt.Sprintf("node%d.yaml", leaderNum))
	restarted := fmt.Sprintf("http://127.0.0.1:808%d", leaderNum)
	waitReady(t, restarted)
	poll.Eventually(t, "the restarted node to catch up", func() error {
		local, err := getRevision(restarted + "/v1/policies/acme.deny-shell")
		if err != nil {
			return err
		}
		latest, err := getRevision(survivor + "/v1/policies/acme.deny-shell?consistent=true")
		if err != nil {
			return err
		}
		if local != latest {
			return fmt.Errorf("restarted node at revision %d, cluster at %d", local, latest)
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	// A fourth node, started with flags only and bootstrap off, joins at
	// run time and receives the existing state.
	ds = append(ds, startDaemon(t, dir, "--node-id", "node4", "--data-dir", "data/node4", "--bootstrap=false",
		"--http-addr", "127.0.0.1:8084", "--grpc-addr", "127.0.0.1:9094", "--raft-addr", "127.0.0.1:7004"))
	if out := cli(t, dir, "--server", "http://127.0.0.1:8081", "cluster", "join", "--id", "node4", "--raft-addr", "127.0.0.1:7004"); !strings.Contains(out, "node4 joined") {
		t.Fatalf("join: %s", out)
	}
	poll.Eventually(t, "node4 to receive the policy", func() error {
		_, err := getRevision("http://127.0.0.1:8084/v1/policies/acme.deny-shell")
		return err
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	waitReady(t, "http://127.0.0.1:8084")
	cli(t, dir, "--server", "http://127.0.0.1:8084", "cluster", "remove", "node4")

	if err := json.Unmarshal([]byte(cli(t, dir, "--server", "http://127.0.0.1:8081", "-o", "json", "cluster", "status")), &st); err != nil {
		t.Fatal(err)
	}
	victim := "node3"
	if st.LeaderID == victim {
		victim = "node2"
	}
	cli(t, dir, "--server", "http://127.0.0.1:8081", "cluster", "remove", victim)
	poll.Eventually(t, "two members", func() error {
		if err := json.Unmarshal([]byte(cli(t, dir, "--server", "http://127.0.0.1:8081", "-o", "json", "cluster", "status")), &st); err != nil {
			return err
		}
		if len(st.Members) != 2 {
			return fmt.Errorf("%d members", len(st.Members))
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	for _, d := range ds {
		d.interrupt(t)
	}
}

// getRevision reads the revision of the policy at url (a node's base URL
// with the policy's path and query).
func getRevision(url string) (uint64, error) {
	var p struct {
		Revision uint64 `json:"revision"`
	}
	return p.Revision, getJSON(url, &p)
}

// TestCLIUsageErrors: bad invocations fail with a message, not a panic.
func TestCLIUsageErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		args    []string
		mention string
	}{
		{[]string{"policy", "apply"}, "-f"},
		{[]string{"policy", "get"}, "arg"},
		{[]string{"nope"}, "unknown command"},
		{[]string{"serve", "--config", "missing.yaml"}, "missing.yaml"},
		{[]string{"--server", "http://127.0.0.1:1", "policy", "list"}, "127.0.0.1:1"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := cliErr(t, dir, tc.args...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("want a non-zero exit, got %v: %s", err, out)
			}
			if !strings.Contains(out, tc.mention) || strings.Contains(out, "panic") {
				t.Fatalf("output %q does not mention %q", out, tc.mention)
			}
		})
	}
	if out := cli(t, dir, "version", "--client"); !strings.HasPrefix(out, "policyd ") {
		t.Fatalf("version: %q", out)
	}
}

// TestEnvConfigAndCLIToken: the daemon configured only through POLICYD_*
// variables, with admin tokens; the CLI finds it through POLICYD_SERVER and
// authenticates with POLICYD_TOKEN or --token.
func TestEnvConfigAndCLIToken(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("admin admin-token-0123456789 ops\nread read-token-0123456789 ci\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemonEnv(t, dir, []string{
		"POLICYD_HTTP_ADDR=127.0.0.1:18181", "POLICYD_GRPC_ADDR=127.0.0.1:19191", "POLICYD_RAFT_ADDR=127.0.0.1:17171",
		"POLICYD_DATA_DIR=state", "POLICYD_NODE_ID=envnode", "POLICYD_AUTH_ADMIN_TOKENS_FILE=" + tokens,
	})
	waitReady(t, "http://127.0.0.1:18181")
	if _, err := os.Stat(filepath.Join(dir, "state", "state.db")); err != nil {
		t.Fatalf("POLICYD_DATA_DIR ignored: %v", err)
	}

	run := func(env []string, args ...string) (string, error) {
		c := exec.Command(policydBinary(t), args...)
		c.Dir = dir
		c.Env = append(servertest.CleanEnv(), env...)
		c.Stdin = strings.NewReader(`{"name": "p", "kind": "ToolPolicy", "spec": {"tool_name": "Bash", "action": "audit"}}`)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	server := "POLICYD_SERVER=http://127.0.0.1:18181"
	tests := []struct {
		name    string
		env     []string
		args    []string
		ok      bool
		mention string
	}{
		{"no token", []string{server}, []string{"policy", "list"}, false, "401 unauthorized"},
		{"read token reads", []string{server, "POLICYD_TOKEN=read-token-0123456789"}, []string{"policy", "list"}, true, "NAME"},
		{"read token cannot write", []string{server, "POLICYD_TOKEN=read-token-0123456789"}, []string{"policy", "apply", "-f", "-"}, false, "403 forbidden"},
		{"admin flag writes", []string{server}, []string{"--token", "admin-token-0123456789", "policy", "apply", "-f", "-"}, true, "policy/p applied"},
		{"flag beats env", []string{server, "POLICYD_TOKEN=wrong-token-0123456789"}, []string{"--token", "read-token-0123456789", "policy", "get", "p"}, true, `"name": "p"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(tc.env, tc.args...)
			if (err == nil) != tc.ok || !strings.Contains(out, tc.mention) {
				t.Fatalf("ok=%v (%v), want %v; output %q should mention %q", err == nil, err, tc.ok, out, tc.mention)
			}
		})
	}
	d.interrupt(t)
}
