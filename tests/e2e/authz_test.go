package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/loopback"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/tlsfiles/testca"
)

// TestAuthzUsageErrors: bad invocations exit 2 with a message, and a
// listener outside loopback without mutual TLS is refused before anything
// listens.
func TestAuthzUsageErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		args    []string
		mention string
	}{
		{[]string{"authz"}, "--servers"},
		{[]string{"authz", "--servers", "a:1", "--grpc-addr", "0.0.0.0:9191"}, `"0.0.0.0:9191" is not loopback`},
		{[]string{"authz", "--servers", "a:1", "--http-addr", ":9192"}, `":9192" is not loopback`},
		{[]string{"authz", "--servers", "a:1", "--serve-cert-file", "c.pem"}, "go together"},
		{[]string{"authz", "--servers", "a:1", "--serve-cert-file", "c", "--serve-key-file", "k", "--serve-client-ca-file", "ca"}, "listener TLS"},
		{[]string{"authz", "--servers", "a:1", "--grpc-addr", "nohost"}, `listen address "nohost"`},
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

// TestAuthzProcess runs `policyd authz` as its own process against a node,
// with mutual TLS on its listeners: a caller without a certificate is
// refused, one with a certificate gets decisions that follow a write, and
// SIGTERM ends it with exit 0.
func TestAuthzProcess(t *testing.T) {
	dir := t.TempDir()
	ports, err := loopback.FreePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	admin := "http://" + loopback.Addr(ports[0])
	startDaemonEnv(t, dir, []string{
		"POLICYD_HTTP_ADDR=" + loopback.Addr(ports[0]), "POLICYD_GRPC_ADDR=" + loopback.Addr(ports[1]),
		"POLICYD_RAFT_ADDR=" + loopback.Addr(ports[2]), "POLICYD_DATA_DIR=state", "POLICYD_NODE_ID=authznode",
	})
	waitReady(t, admin)

	ca := testca.New(t, "authz-ca")
	srv := ca.WriteFiles(t, dir, "authz", "authz", "127.0.0.1")
	caller := ca.WriteFiles(t, dir, "caller", "envoy")
	httpAddr := loopback.Addr(ports[4])
	cmd, _, done := startAuthzProcess(t, "--servers", loopback.Addr(ports[1]), "--org", "acme",
		"--grpc-addr", loopback.Addr(ports[3]), "--http-addr", httpAddr, "--probe-addr", loopback.Addr(ports[5]),
		"--serve-cert-file", srv.Cert, "--serve-key-file", srv.Key, "--serve-client-ca-file", srv.CA)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	pair, err := tls.LoadX509KeyPair(caller.Cert, caller.Key)
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	base := "https://" + httpAddr
	get := func(c *http.Client, method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if poll.Until(context.Background(), 20*time.Second, poll.Holds(func() bool { code, _ := get(withCert, "GET", "/readyz", ""); return code == 200 })) != nil {
		t.Fatal("authz /readyz never answered 200")
	}
	if code, msg := get(noCert, "GET", "/healthz", ""); code != 0 {
		t.Fatalf("a caller without a certificate got %d %s; want the handshake refused", code, msg)
	}
	// The probe listener answers without TLS, and serves nothing but the
	// probes.
	probe := "http://" + loopback.Addr(ports[5])
	for _, tc := range []struct {
		method, path string
		want         int
	}{{"GET", "/readyz", 200}, {"GET", "/healthz", 200}, {"POST", "/v1/check", 404}, {"GET", "/metrics", 404}} {
		req, _ := http.NewRequest(tc.method, probe+tc.path, strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("probe listener %s %s = %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
		}
	}

	check := `{"tool":"Bash","input":{"command":"rm -rf /"}}`
	if code, body := get(withCert, "POST", "/v1/check", check); code != 200 || !strings.Contains(body, `"allowed":true`) {
		t.Fatalf("before the policy: %d %s", code, body)
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(examplePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cli(t, dir, "--server", admin, "policy", "apply", "-f", "policy.yaml")
	if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool {
		code, body := get(withCert, "POST", "/v1/check", check)
		return code == 200 && strings.Contains(body, `"policy":"acme.deny-shell"`) && strings.Contains(body, `"allowed":false`)
	})) !=
		nil {
		_, body := get(withCert, "POST", "/v1/check", check)
		t.Fatalf("the write did not change the decision: %s", body)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("authz after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("authz did not exit after SIGTERM")
	}
}

// startAuthzProcess runs `policyd authz args...` until the test ends, with
// its output logged if the test fails. done receives Wait's error; a test
// that takes it puts a value back for the cleanup.
func startAuthzProcess(t *testing.T, args ...string) (cmd *exec.Cmd, logs *servertest.LogBuffer, done chan error) {
	t.Helper()
	cmd = exec.Command(policydBinary(t), append([]string{"authz"}, args...)...)
	cmd.Env = servertest.CleanEnv()
	logs = &servertest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done = make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if err := <-done; t.Failed() {
			t.Logf("authz exited with %v, output:\n%s", err, logs)
		}
	})
	return cmd, logs, done
}
