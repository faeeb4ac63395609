package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/tlsfiles/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestNewRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "ca")
	good := ca.WriteFiles(t, dir, "good", "node", "127.0.0.1")
	other := ca.WriteFiles(t, dir, "other", "node", "127.0.0.1")
	junk := filepath.Join(dir, "junk.pem")
	write(t, junk, []byte("not pem at all\n"))
	keyAsCA := good.Key

	for _, tc := range []struct {
		name string
		cfg  config.TLS
		want string
	}{
		{"not enabled", config.TLS{}, "cert_file and key_file are required"},
		{"missing cert", config.TLS{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: good.Key}, "no such file"},
		{"key of another pair", config.TLS{CertFile: good.Cert, KeyFile: other.Key}, "private key does not match"},
		{"cert is junk", config.TLS{CertFile: junk, KeyFile: good.Key}, "key pair"},
		{"CA file is junk", config.TLS{CertFile: good.Cert, KeyFile: good.Key, ClientCAFile: junk}, "holds no PEM certificate"},
		{"CA file is a key", config.TLS{CertFile: good.Cert, KeyFile: good.Key, ClientCAFile: keyAsCA}, `is "PRIVATE KEY", want CERTIFICATE`},
		{"missing CA", config.TLS{CertFile: good.Cert, KeyFile: good.Key, ClientCAFile: filepath.Join(dir, "nope-ca.crt")}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.cfg, testLogger(t))
			if err == nil {
				t.Fatalf("New = %v, want an error containing %q", r, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// serve accepts connections on a loopback listener with cfg, completes the
// handshake on each, and closes it. It returns the address.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, cfg)
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			// One byte tells the client its certificate was accepted: under
			// TLS 1.3 the client's handshake completes before the server
			// has checked it.
			if tc.Handshake() == nil {
				_, _ = tc.Write([]byte{1})
			}
			_ = tc.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// dial handshakes with addr and returns the server's leaf certificate. Under
// TLS 1.3 the server checks the client certificate after the client has
// finished, so a refusal shows on the first read.
func dial(addr string, cfg *tls.Config) (*x509.Certificate, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return nil, err
	}
	return c.ConnectionState().PeerCertificates[0], nil
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "cluster-ca")
	rogueCA := testca.New(t, "rogue-ca")
	srv := ca.WriteFiles(t, dir, "server", "node1", "127.0.0.1", "localhost")
	cli := ca.WriteFiles(t, dir, "client", "node2", "127.0.0.1")
	rogue := rogueCA.WriteFiles(t, dir, "rogue", "intruder", "127.0.0.1")

	server, err := New(config.TLS{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: srv.CA}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if !server.MutualTLS() {
		t.Fatal("MutualTLS() = false with a client CA file")
	}
	addr := serve(t, server.ServerConfig())

	member, err := New(config.TLS{CertFile: cli.Cert, KeyFile: cli.Key, ClientCAFile: cli.CA}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	intruder, err := New(config.TLS{CertFile: rogue.Cert, KeyFile: rogue.Key, ClientCAFile: srv.CA}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	for _, tc := range []struct {
		name    string
		cfg     *tls.Config
		wantErr string
	}{
		{"member of the cluster", member.ClientConfig("127.0.0.1"), ""},
		{"member, by host name", member.ClientConfig("localhost"), ""},
		{"no client certificate", &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, "certificate required"},
		{"certificate of another CA", intruder.ClientConfig("127.0.0.1"), "unknown certificate authority"},
		{"server name not in the certificate", member.ClientConfig("node9.example"), "not node9.example"},
		{"server not trusted by the client", &tls.Config{ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, "unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf, err := dial(addr, tc.cfg)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("handshake failed: %v", err)
				}
				if leaf.Subject.CommonName != "node1" {
					t.Fatalf("server presented %q, want node1", leaf.Subject.CommonName)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("handshake error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestServerOnlyTLSAcceptsAnyClient(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "ca")
	srv := ca.WriteFiles(t, dir, "server", "node1", "127.0.0.1")
	server, err := New(config.TLS{CertFile: srv.Cert, KeyFile: srv.Key}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if server.MutualTLS() {
		t.Fatal("MutualTLS() = true without a client CA file")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := dial(serve(t, server.ServerConfig()), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}); err != nil {
		t.Fatalf("a client without a certificate was refused by a server-only TLS listener: %v", err)
	}
}

func TestALPN(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "ca")
	f := ca.WriteFiles(t, dir, "node", "node1", "127.0.0.1")
	r, err := New(config.TLS{CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: f.CA}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig("h2"))
	cfg := r.ClientConfig("127.0.0.1")
	cfg.NextProtos = []string{"h2"}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.ConnectionState().NegotiatedProtocol; got != "h2" {
		t.Fatalf("negotiated %q, want h2 (gRPC clients refuse a server without it)", got)
	}
}

// rotate replaces the pair in f with a new certificate from ca.
func rotate(t *testing.T, ca *testca.CA, f testca.Files, cn string, hosts ...string) {
	t.Helper()
	c, k := ca.Issue(t, cn, hosts...)
	write(t, f.Cert, c)
	write(t, f.Key, k)
	write(t, f.CA, ca.PEM)
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "ca")
	f := ca.WriteFiles(t, dir, "node", "node1-v1", "127.0.0.1")
	r, err := New(config.TLS{CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: f.CA}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	cn := func() string {
		t.Helper()
		leaf, err := dial(addr, r.ClientConfig("127.0.0.1"))
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		return leaf.Subject.CommonName
	}
	if got := cn(); got != "node1-v1" {
		t.Fatalf("before rotation the server presents %q", got)
	}

	t.Run("new certificate after Reload", func(t *testing.T) {
		rotate(t, ca, f, "node1-v2", "127.0.0.1")
		if err := r.Reload(); err != nil {
			t.Fatal(err)
		}
		if got := cn(); got != "node1-v2" {
			t.Fatalf("after Reload the server presents %q, want node1-v2", got)
		}
	})

	t.Run("a broken version keeps the previous certificate", func(t *testing.T) {
		other := ca.WriteFiles(t, t.TempDir(), "other", "x", "127.0.0.1")
		key, err := os.ReadFile(other.Key)
		if err != nil {
			t.Fatal(err)
		}
		write(t, f.Key, key) // a rotation caught half-way: new key, old certificate
		if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "does not match") {
			t.Fatalf("Reload of a mismatched pair = %v, want a mismatch error", err)
		}
		if got := cn(); got != "node1-v2" {
			t.Fatalf("after a failed reload the server presents %q, want node1-v2", got)
		}
		if got := r.Leaf().Subject.CommonName; got != "node1-v2" {
			t.Fatalf("Leaf() = %q after a failed reload", got)
		}
	})

	t.Run("completing the rotation is picked up", func(t *testing.T) {
		rotate(t, ca, f, "node1-v3", "127.0.0.1")
		if err := r.Reload(); err != nil {
			t.Fatal(err)
		}
		if got := cn(); got != "node1-v3" {
			t.Fatalf("the server presents %q, want node1-v3", got)
		}
	})

	t.Run("a new CA bundle is trusted for client certificates", func(t *testing.T) {
		ca2 := testca.New(t, "ca2")
		c2 := ca2.WriteFiles(t, t.TempDir(), "peer", "peer", "127.0.0.1")
		peer, err := New(config.TLS{CertFile: c2.Cert, KeyFile: c2.Key}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AddCert(ca.Cert)
		pc := peer.ClientConfig("127.0.0.1")
		pc.RootCAs = roots
		if _, err := dial(addr, pc); err == nil {
			t.Fatal("a client certificate from a CA not yet in client_ca_file was accepted")
		}
		// Trust both CAs (as during a CA rotation).
		write(t, f.CA, append(append([]byte{}, ca.PEM...), ca2.PEM...))
		if err := r.Reload(); err != nil {
			t.Fatal(err)
		}
		if _, err := dial(addr, pc); err != nil {
			t.Fatalf("after adding its CA to client_ca_file, the client is refused: %v", err)
		}
	})
}

// TestReloadOnFileChange shows that rewritten files are picked up by new
// handshakes without a Reload call.
func TestReloadOnFileChange(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "ca")
	f := ca.WriteFiles(t, dir, "node", "before", "127.0.0.1")
	r, err := New(config.TLS{CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: f.CA}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	rotate(t, ca, f, "after", "127.0.0.1")
	poll.Eventually(t, "the server to present the rotated certificate", func() error {
		leaf, err := dial(addr, r.ClientConfig("127.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		if leaf.Subject.CommonName != "after" {
			return fmt.Errorf("it presents %q", leaf.Subject.CommonName)
		}
		return nil
	}, poll.Within(30*time.Second))
}

func FuzzParseCAs(f *testing.F) {
	ca := testca.New(f, "ca")
	f.Add(ca.PEM)
	f.Add(append(append([]byte("# bundle\n"), ca.PEM...), ca.PEM...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		pool, err := ParseCAs("fuzz.pem", data)
		if (pool == nil) == (err == nil) {
			t.Fatalf("ParseCAs = (%v, %v): want exactly one of a pool and an error", pool, err)
		}
		if err != nil && bytes.Contains([]byte(err.Error()), []byte("BEGIN")) {
			t.Fatalf("error quotes the input: %v", err)
		}
	})
}

// TestNodeIDs: only spiffe://<trust domain>/node/<valid id> URI SANs name
// a node; any node URI marks a certificate as a node's.
func TestNodeIDs(t *testing.T) {
	ca := testca.New(t, "ca")
	certPEM, _ := ca.Issue(t, "x", "spiffe://policyd/node/n1", "spiffe://policyd/node/n2", "spiffe://other/node/n3",
		"spiffe://policyd/sidecar/s1", "spiffe://policyd/node/bad%20id")
	cert := leafOf(t, certPEM)
	if got, want := strings.Join(NodeIDs(cert, "policyd"), ","), "n1,n2"; got != want {
		t.Errorf("NodeIDs = %q, want %q", got, want)
	}
	if !IsNodeCertificate(cert) {
		t.Error("IsNodeCertificate = false, want true")
	}
	adminPEM, _ := ca.Issue(t, "admin", "127.0.0.1")
	plain := leafOf(t, adminPEM)
	if IsNodeCertificate(plain) {
		t.Error("IsNodeCertificate(admin) = true, want false")
	}
}

func leafOf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
