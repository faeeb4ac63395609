package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/server/servertest"
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

// TestWatchServersFromEnv: POLICYD_WATCH_SERVERS is the default of
// --servers.
func TestWatchServersFromEnv(t *testing.T) {
	t.Setenv("POLICYD_WATCH_SERVERS", " a:1 , b:2 ")
	if got := fmt.Sprint(envList("POLICYD_WATCH_SERVERS")); got != "[a:1 b:2]" {
		t.Fatalf("envList = %s", got)
	}
}

// TestWatchPrinterFormats: each --output form of a state change.
func TestWatchPrinterFormats(t *testing.T) {
	tests := []struct {
		format string
		want   []string // in the output, in order
	}{
		{"text", []string{"state connecting -> current"}},
		{"json", []string{`{"event":"state",`, `"from":"connecting","to":"current"}`}},
		{"yaml", []string{"---\n", "event: state\n", "from: connecting\n", "to: current\n"}},
	}
	for _, tc := range tests {
		t.Run(tc.format, func(t *testing.T) {
			var b strings.Builder
			p := &watchPrinter{w: &b, format: tc.format}
			p.state("connecting", "current")
			out := b.String()
			for _, w := range tc.want {
				i := strings.Index(out, w)
				if i < 0 {
					t.Fatalf("output %q lacks %q", b.String(), w)
				}
				out = out[i+len(w):]
			}
		})
	}
}

// TestWatchMarksShadowPolicies: update lines mark shadow policies:
// name(shadow) in text, a "shadow" list in json.
func TestWatchMarksShadowPolicies(t *testing.T) {
	u := client.Update{Version: "v9", Server: "n1", Policies: []client.Policy{
		{Name: "acme.enforced"}, {Name: "acme.shadow", Enforcement: client.EnforcementShadow},
	}}
	var text, js strings.Builder
	(&watchPrinter{w: &text, format: "text"}).update(u)
	(&watchPrinter{w: &js, format: "json"}).update(u)
	if !strings.Contains(text.String(), "policies=acme.enforced,acme.shadow(shadow) ") {
		t.Errorf("text line %q does not mark the shadow policy", text.String())
	}
	var ev updateEvent
	if err := json.Unmarshal([]byte(js.String()), &ev); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ev.Policies, []string{"acme.enforced", "acme.shadow"}) || !slices.Equal(ev.Shadow, []string{"acme.shadow"}) {
		t.Errorf("json line policies %v shadow %v", ev.Policies, ev.Shadow)
	}
	js.Reset()
	(&watchPrinter{w: &js, format: "json"}).update(client.Update{Policies: []client.Policy{{Name: "a"}}})
	if strings.Contains(js.String(), `"shadow"`) {
		t.Errorf("json line without shadow policies has a shadow list: %s", js.String())
	}
}

// TestSidecarFlagsUnknownIdentityGrace: watch and authz share
// --unknown-identity-grace, which sets the SDK's bound; its zero means no
// retry, not the SDK's default.
func TestSidecarFlagsUnknownIdentityGrace(t *testing.T) {
	for _, cmd := range []*cobra.Command{watchCommand(), authzCommand()} {
		f := cmd.Flags().Lookup("unknown-identity-grace")
		if f == nil {
			t.Fatalf("%s has no --unknown-identity-grace", cmd.Name())
		}
		if got, want := f.DefValue, client.DefaultUnknownIdentityGrace.String(); got != want {
			t.Errorf("%s: default %s, want %s", cmd.Name(), got, want)
		}
	}
	tests := []struct {
		args []string
		want time.Duration
	}{
		{nil, client.DefaultUnknownIdentityGrace},
		{[]string{"--unknown-identity-grace", "2m"}, 2 * time.Minute},
		{[]string{"--unknown-identity-grace", "0"}, time.Nanosecond},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			sf := sidecarFlags{env: "POLICYD_TEST", cmd: "watch"}
			fs := pflag.NewFlagSet("watch", pflag.ContinueOnError)
			sf.register(fs)
			if err := fs.Parse(append([]string{"--servers", "a:1"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			cfg, err := sf.config(&cobra.Command{})
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.UnknownIdentityGrace; got != tc.want {
				t.Errorf("UnknownIdentityGrace = %v, want %v", got, tc.want)
			}
		})
	}
}
