package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/tlsfiles/testca"
)

// TestSIGHUPReload runs `policyd serve` with mutual TLS on its HTTP listener,
// admin tokens and an HS256 JWT secret, changes the files and the config,
// and sends SIGHUP: the new token, JWT secret, log level and certificate are
// in force without a restart, the removed token and secret are refused, and
// a changed restart-only key is reported. The CLI talks to it over mutual
// TLS throughout.
func TestSIGHUPReload(t *testing.T) {
	dir := t.TempDir()
	ports := freePorts(t, 3)
	base := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	ca := testca.New(t, "policyd-ca")
	node := ca.WriteFiles(t, dir, "node", "node1", "127.0.0.1")
	admin := ca.WriteFiles(t, dir, "admin", "admin")
	tlsFlags := []string{"--server", base, "--ca-file", admin.CA, "--cert-file", admin.Cert, "--key-file", admin.Key}

	const (
		tokA = "admin-token-a-0123456789"
		tokB = "admin-token-b-0123456789"
	)
	secretA, secretB := []byte(strings.Repeat("a", 40)), []byte(strings.Repeat("b", 40))
	tokens, secret := filepath.Join(dir, "tokens"), filepath.Join(dir, "jwt-secret")
	writeTestFile(t, tokens, "admin "+tokA+" a\n")
	writeTestFile(t, secret, string(secretA))
	cfgPath := filepath.Join(dir, "policyd.yaml")
	config := func(level, electionTimeout string) string {
		return fmt.Sprintf(`node_id: node1
data_dir: data
log: {level: %s}
http:
  addr: 127.0.0.1:%d
  tls: {cert_file: %s, key_file: %s, client_ca_file: %s}
grpc: {addr: 127.0.0.1:%d}
raft: {addr: 127.0.0.1:%d, bootstrap: true, election_timeout: %s}
auth:
  mode: jwt
  admin_tokens_file: %s
  jwt: {hmac_secret_file: %s}
`, level, ports[0], node.Cert, node.Key, node.CA, ports[1], ports[2], electionTimeout, tokens, secret)
	}
	writeTestFile(t, cfgPath, config("info", "1s"))

	d := startDaemon(t, dir, "--config", cfgPath)
	tc, err := client.TLSFiles(admin.CA, admin.Cert, admin.Key)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer hc.CloseIdleConnections()
	poll.Eventually(t, "the node to be ready over TLS", func() error {
		resp, err := hc.Get(base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	adminCLI := func(token string, args ...string) (string, error) {
		return cliInput(t, dir, `{"id": "alice", "org": "acme", "team": "red"}`, append(append(tlsFlags, "--token", token), args...)...)
	}
	if out, err := adminCLI(tokA, "employee", "apply", "-f", "-"); err != nil {
		t.Fatalf("employee apply over mutual TLS: %v\n%s", err, out)
	}
	if out, err := cliErr(t, dir, "--server", base, "--ca-file", admin.CA, "--token", tokA, "policy", "list"); err == nil {
		t.Fatalf("the CLI without a client certificate was served:\n%s", out)
	}
	// feed dials the WebSocket feed with a JWT and returns the HTTP status.
	feed := func(key []byte) int {
		t.Helper()
		tok := signJWT(t, key)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(base, "https")+feedv1.Path, &websocket.DialOptions{ //nolint:bodyclose // Dial owns the body
			HTTPClient: hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}},
		})
		if err == nil {
			_ = c.CloseNow()
			return http.StatusSwitchingProtocols
		}
		if resp == nil {
			t.Fatalf("feed dial: %v", err)
		}
		return resp.StatusCode
	}
	serverCN := func() string {
		t.Helper()
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", strings.TrimPrefix(base, "https://"), tc)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}

	// Before the reload.
	if out, err := adminCLI(tokB, "policy", "list"); err == nil || !strings.Contains(out, "401") {
		t.Fatalf("token B before it is in the file: %v\n%s", err, out)
	}
	if got := feed(secretA); got != http.StatusSwitchingProtocols {
		t.Fatalf("JWT with secret A: %d", got)
	}
	if got := feed(secretB); got != http.StatusUnauthorized {
		t.Fatalf("JWT with secret B before the reload: %d", got)
	}
	if strings.Contains(d.logs.String(), "feed handshake refused") {
		t.Fatal("a debug message was logged at level info")
	}

	// Change everything at once, then SIGHUP.
	writeTestFile(t, tokens, "admin "+tokB+" b\n")
	writeTestFile(t, secret, string(secretB))
	writeTestFile(t, cfgPath, config("debug", "2s"))
	certPEM, keyPEM := ca.Issue(t, "node1-rotated", "127.0.0.1")
	writeTestFile(t, node.Cert, string(certPEM))
	writeTestFile(t, node.Key, string(keyPEM))
	hup(t, d, 1)

	if out, err := adminCLI(tokB, "policy", "list"); err != nil {
		t.Errorf("token B after SIGHUP: %v\n%s", err, out)
	}
	if out, err := adminCLI(tokA, "policy", "list"); err == nil || !strings.Contains(out, "401") {
		t.Errorf("token A, removed from the file, after SIGHUP: %v\n%s", err, out)
	}
	if got := feed(secretB); got != http.StatusSwitchingProtocols {
		t.Errorf("JWT with the new secret B after SIGHUP: %d", got)
	}
	if got := feed(secretA); got != http.StatusUnauthorized {
		t.Errorf("JWT with the removed secret A after SIGHUP: %d", got)
	}
	poll.Eventually(t, "a debug message after the level changed to debug", func() error {
		if !strings.Contains(d.logs.String(), "feed handshake refused") {
			return fmt.Errorf("no debug line in the logs")
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	if got := serverCN(); got != "node1-rotated" {
		t.Errorf("after SIGHUP the HTTP listener presents %q, want node1-rotated", got)
	}
	// `policyd watch` follows the feed over mutual TLS with the new JWT.
	jwtFile := filepath.Join(dir, "watch.jwt")
	writeTestFile(t, jwtFile, signJWT(t, secretB))
	w := startWatch(t, "wss", append([]string{"--transport", "ws", "--servers", base, "--token-file", jwtFile}, tlsFlags[2:]...)...)
	w.expect(t, "connecting -> ready", stateChange("connecting", "ready"))
	if out, err := cliInput(t, dir, policyDoc("acme.over-tls"), append(tlsFlags, "--token", tokB, "policy", "apply", "-f", "-")...); err != nil {
		t.Fatalf("policy apply: %v\n%s", err, out)
	}
	w.expect(t, "the update with acme.over-tls", func(ev watchEventLine) bool {
		return ev.Event == "update" && slices.Contains(ev.Policies, "acme.over-tls")
	})

	logs := d.logs.String()
	if !strings.Contains(logs, "needs a restart") || !strings.Contains(logs, "raft.election_timeout") {
		t.Errorf("the changed restart-only key is not reported:\n%s", logs)
	}

	// A file that does not load changes nothing, and the process lives on.
	writeTestFile(t, cfgPath, "log: [not, a, mapping]\n")
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, "the refused reload to be logged", func() error {
		if !strings.Contains(d.logs.String(), "configuration not reloaded") {
			return fmt.Errorf("not logged yet")
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	if out, err := adminCLI(tokB, "policy", "list"); err != nil {
		t.Errorf("token B after a refused reload: %v\n%s", err, out)
	}
	d.interrupt(t)
}

// hup sends SIGHUP and waits until the node has logged its nth reload.
func hup(t *testing.T, d *daemon, nth int) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, "the reload to be logged", func() error {
		if got := strings.Count(d.logs.String(), `msg="configuration reloaded"`); got < nth {
			return fmt.Errorf("%d reloads logged", got)
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

}

// signJWT mints an HS256 sidecar token for alice of acme.
func signJWT(t *testing.T, key []byte) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "org": "acme", "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
