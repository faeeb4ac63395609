package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/server/servertest"
)

// watchProc is a running `policyd watch --output json`.
type watchProc struct {
	name  string
	cmd   *exec.Cmd
	lines chan string
	seen  []string
	logs  *servertest.LogBuffer
	done  chan error
	// exited is set once wait has seen the process end.
	exited bool
}

// watchEventLine is one line of `policyd watch --output json`.
type watchEventLine struct {
	Event    string   `json:"event"`
	From     string   `json:"from"`
	To       string   `json:"to"`
	Version  string   `json:"version"`
	Policies []string `json:"policies"`
	Count    *int     `json:"count"`
}

func startWatch(t *testing.T, name string, args ...string) *watchProc {
	t.Helper()
	cmd := exec.Command(policydBinary(t), append([]string{"watch", "--output", "json"}, args...)...)
	cmd.Env = servertest.CleanEnv()
	w := &watchProc{name: name, cmd: cmd, lines: make(chan string, 100), logs: &servertest.LogBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = w.logs
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
		w.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if !w.exited {
			_ = cmd.Process.Kill()
			_ = w.wait(t)
		}
		if t.Failed() {
			t.Logf("watch %s stdout:\n%s\nstderr:\n%s", name, strings.Join(w.seen, "\n"), w.logs)
		}
	})
	return w
}

// expect reads lines until one satisfies match, failing after 20s or when
// the process ends first.
func (w *watchProc) expect(t *testing.T, what string, match func(watchEventLine) bool) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				t.Fatalf("watch %s ended before %s", w.name, what)
			}
			w.seen = append(w.seen, line)
			var ev watchEventLine
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("watch %s printed a line that is not JSON: %q", w.name, line)
			}
			if ev.Event == "update" && (ev.Count == nil || *ev.Count != len(ev.Policies) || ev.Version == "") {
				t.Fatalf("watch %s: malformed update line %q", w.name, line)
			}
			if match(ev) {
				return
			}
		case <-timeout:
			t.Fatalf("watch %s: no line showing %s within 20s", w.name, what)
		}
	}
}

func stateChange(from, to string) func(watchEventLine) bool {
	return func(ev watchEventLine) bool { return ev.Event == "state" && ev.From == from && ev.To == to }
}

// wait waits for the process to exit and returns its error.
func (w *watchProc) wait(t *testing.T) error {
	t.Helper()
	for range w.lines {
		// drain stdout so the process can exit
	}
	select {
	case err := <-w.done:
		w.done <- err
		w.exited = true
		return err
	case <-time.After(15 * time.Second):
		t.Fatalf("watch %s did not exit", w.name)
		return nil
	}
}

// TestWatchFollowsUpdatesAndDisconnects: `policyd watch --output json` over
// gRPC and over WebSocket against a daemon prints ready, then the update
// when a policy is applied; a deactivated employee's WebSocket watch exits 1
// as revoked; and stopping the daemon prints ready -> disconnected.
func TestWatchFollowsUpdatesAndDisconnects(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(examplePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemonEnv(t, dir, []string{
		"POLICYD_HTTP_ADDR=127.0.0.1:18281", "POLICYD_GRPC_ADDR=127.0.0.1:19291", "POLICYD_RAFT_ADDR=127.0.0.1:17271",
		"POLICYD_DATA_DIR=state", "POLICYD_NODE_ID=watchnode",
	})
	const admin = "http://127.0.0.1:18281"
	waitReady(t, admin)
	if out, err := cliInput(t, dir, `{"id": "alice", "org": "acme", "team": "red"}`, "--server", admin, "employee", "apply", "-f", "-"); err != nil {
		t.Fatalf("employee apply: %v %s", err, out)
	}

	grpcW := startWatch(t, "grpc", "--servers", "127.0.0.1:19291", "--org", "acme", "--team", "red", "--employee", "alice", "--grace", "1m")
	wsW := startWatch(t, "ws", "--transport", "ws", "--servers", "127.0.0.1:18281", "--employee", "alice")
	for _, w := range []*watchProc{grpcW, wsW} {
		w.expect(t, "connecting -> ready", stateChange("connecting", "ready"))
	}

	cli(t, dir, "--server", admin, "policy", "apply", "-f", "policy.yaml")
	for _, w := range []*watchProc{grpcW, wsW} {
		w.expect(t, "the update with acme.deny-shell", func(ev watchEventLine) bool {
			return ev.Event == "update" && slices.Contains(ev.Policies, "acme.deny-shell")
		})
	}

	// Deactivating alice revokes the feed connection: watch exits 1.
	if out, err := cliInput(t, dir, `{"id": "alice", "org": "acme", "team": "red", "status": "inactive"}`, "--server", admin, "employee", "apply", "-f", "-"); err != nil {
		t.Fatalf("employee deactivate: %v %s", err, out)
	}
	wsW.expect(t, "ready -> revoked", stateChange("ready", "revoked"))
	err := wsW.wait(t)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(wsW.logs.String(), "access revoked") {
		t.Fatalf("revoked watch exited with %v; stderr:\n%s", err, wsW.logs)
	}

	d.interrupt(t)
	grpcW.expect(t, "ready -> disconnected", stateChange("ready", "disconnected"))

	// SIGINT ends watch cleanly.
	if err := grpcW.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := grpcW.wait(t); err != nil {
		t.Fatalf("watch after SIGINT: %v", err)
	}
}

// TestWatchUsageErrors: bad invocations exit 2 with a message.
func TestWatchUsageErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		args    []string
		mention string
	}{
		{[]string{"watch"}, "--servers"},
		{[]string{"watch", "--servers", "a:1", "--output", "xml"}, "--output"},
		{[]string{"watch", "--servers", "a:1", "--transport", "tcp"}, `transport "tcp"`},
		{[]string{"watch", "--servers", "a:1", "--transport", "ws"}, "--employee"},
		{[]string{"watch", "--servers", "a:1", "--token-file", "missing-token"}, "missing-token"},
		{[]string{"watch", "--servers", "a:1", "--grace", "soon"}, "grace"},
		{[]string{"watch", "--servers", "a:1", "--unknown-identity-grace", "-1s"}, "--unknown-identity-grace"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := cliErr(t, dir, tc.args...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("want exit 2, got %v: %s", err, out)
			}
			if !strings.Contains(out, tc.mention) {
				t.Fatalf("output %q does not mention %q", out, tc.mention)
			}
		})
	}
}
