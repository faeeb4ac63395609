package peer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/tlsfiles"
	"github.com/policyd/policyd/internal/tlsfiles/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	secretA = bytes.Repeat([]byte("a"), 32)
	secretB = bytes.Repeat([]byte("b"), 32)
)

func keyring(t *testing.T, secrets ...[]byte) *Keyring {
	t.Helper()
	if len(secrets) == 0 {
		return nil
	}
	k, err := NewKeyring(secrets...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func fixedID(id string) func() string { return func() string { return id } }

// reloader loads a certificate issued by ca for cn with the given SANs, as a
// mutual-TLS set trusting ca.
func reloader(t *testing.T, ca *testca.CA, name string, sans ...string) *tlsfiles.Reloader {
	t.Helper()
	f := ca.WriteFiles(t, t.TempDir(), name, name, sans...)
	r, err := tlsfiles.New(config.TLS{CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: f.CA}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// handshake runs both sides over a loopback TCP connection and returns
// what each side got.
func handshake(t *testing.T, client, server *Config, kind Kind) (ci, si Info, cerr, serr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		raw, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		defer raw.Close()
		_, si, serr = server.Server(raw)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, ci, cerr := client.Dial(ctx, ln.Addr().String(), kind)
	if c != nil {
		defer c.Close()
	}
	<-done
	return ci, si, cerr, serr
}

func TestHandshake(t *testing.T) {
	ca := testca.New(t, "cluster CA")
	other := testca.New(t, "another CA")
	node := func(id string) *tlsfiles.Reloader {
		return reloader(t, ca, id, "127.0.0.1", tlsfiles.NodeURI("policyd", id))
	}
	n1, n2 := node("n1"), node("n2")
	sidecar := reloader(t, ca, "sidecar", "127.0.0.1")
	wrongDomain := reloader(t, ca, "n1", "127.0.0.1", tlsfiles.NodeURI("elsewhere", "n1"))
	foreign := reloader(t, other, "n1", "127.0.0.1", tlsfiles.NodeURI("policyd", "n1"))

	tests := []struct {
		name           string
		client, server Config
		clientErr      []string // substrings; nil = success
		serverErr      error
	}{
		{name: "same secret",
			client: Config{NodeID: "n1", Keys: keyring(t, secretA), ClusterID: fixedID("c1")},
			server: Config{NodeID: "n2", Keys: keyring(t, secretA), ClusterID: fixedID("c1")}},
		{name: "no secret, no TLS (loopback only)",
			client: Config{NodeID: "n1"}, server: Config{NodeID: "n2"}},
		{name: "wrong secret",
			client:    Config{NodeID: "n1", Keys: keyring(t, secretB)},
			server:    Config{NodeID: "n2", Keys: keyring(t, secretA)},
			clientErr: []string{"the cluster secret does not match"}, serverErr: ErrUnauthenticated},
		{name: "dialler without a secret",
			client:    Config{NodeID: "n1"},
			server:    Config{NodeID: "n2", Keys: keyring(t, secretA)},
			clientErr: []string{"requires the cluster secret"}, serverErr: ErrUnauthenticated},
		{name: "answerer without a secret",
			client:    Config{NodeID: "n1", Keys: keyring(t, secretA)},
			server:    Config{NodeID: "n2"},
			clientErr: []string{"this node has no cluster secret"}, serverErr: ErrUnauthenticated},
		{name: "rotation: answerer holds old and new, dialler new",
			client: Config{NodeID: "n1", Keys: keyring(t, secretB)},
			server: Config{NodeID: "n2", Keys: keyring(t, secretA, secretB)}},
		{name: "rotation: answerer holds new and old, dialler old",
			client: Config{NodeID: "n1", Keys: keyring(t, secretA, secretB)},
			server: Config{NodeID: "n2", Keys: keyring(t, secretB, secretA)}},
		{name: "other cluster",
			client:    Config{NodeID: "n1", Keys: keyring(t, secretA), ClusterID: fixedID("c1")},
			server:    Config{NodeID: "n2", Keys: keyring(t, secretA), ClusterID: fixedID("c2")},
			clientErr: []string{"cluster ID mismatch: this node belongs to cluster c1, node \"n2\" to cluster c2", "policyd recover"}},
		{name: "new node without a cluster ID accepts",
			client: Config{NodeID: "n1", Keys: keyring(t, secretA), ClusterID: fixedID("c1")},
			server: Config{NodeID: "n2", Keys: keyring(t, secretA), ClusterID: fixedID("")}},
		{name: "node certificates",
			client: Config{NodeID: "n1", TrustDomain: "policyd", TLS: n1},
			server: Config{NodeID: "n2", TrustDomain: "policyd", TLS: n2}},
		{name: "node certificates and secret",
			client: Config{NodeID: "n1", TrustDomain: "policyd", TLS: n1, Keys: keyring(t, secretA)},
			server: Config{NodeID: "n2", TrustDomain: "policyd", TLS: n2, Keys: keyring(t, secretA)}},
		{name: "sidecar certificate from the cluster CA",
			client:    Config{NodeID: "n1", TrustDomain: "policyd", TLS: sidecar},
			server:    Config{NodeID: "n2", TrustDomain: "policyd", TLS: n2},
			clientErr: []string{`does not name node "n1"`}, serverErr: ErrUnauthenticated},
		{name: "node certificate claiming another node",
			client:    Config{NodeID: "n3", TrustDomain: "policyd", TLS: n1},
			server:    Config{NodeID: "n2", TrustDomain: "policyd", TLS: n2},
			clientErr: []string{`does not name node "n3"`}, serverErr: ErrUnauthenticated},
		{name: "node certificate of another trust domain",
			client:    Config{NodeID: "n1", TrustDomain: "policyd", TLS: wrongDomain},
			server:    Config{NodeID: "n2", TrustDomain: "policyd", TLS: n2},
			clientErr: []string{`does not name node "n1"`}, serverErr: ErrUnauthenticated},
		{name: "answerer with a sidecar certificate",
			client:    Config{NodeID: "n1", TrustDomain: "policyd", TLS: n1},
			server:    Config{NodeID: "n2", TrustDomain: "policyd", TLS: sidecar},
			clientErr: []string{`server certificate does not name node "n2"`}},
		{name: "certificate of another CA",
			client:    Config{NodeID: "n1", TrustDomain: "policyd", TLS: foreign},
			server:    Config{NodeID: "n2", TrustDomain: "policyd", TLS: n2},
			clientErr: []string{"tls"}, serverErr: ErrUnauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ci, si, cerr, serr := handshake(t, &tc.client, &tc.server, KindAPI)
			if tc.clientErr == nil {
				if cerr != nil || serr != nil {
					t.Fatalf("client err %v, server err %v; want success", cerr, serr)
				}
				if ci.NodeID != tc.server.NodeID || si.NodeID != tc.client.NodeID || si.Kind != KindAPI {
					t.Fatalf("client saw %+v, server saw %+v", ci, si)
				}
				return
			}
			if cerr == nil {
				t.Fatalf("client err nil, want %q", tc.clientErr)
			}
			for _, want := range tc.clientErr {
				if !strings.Contains(cerr.Error(), want) {
					t.Errorf("client err %q does not contain %q", cerr, want)
				}
			}
			if tc.serverErr != nil && !errors.Is(serr, tc.serverErr) {
				t.Errorf("server err = %v, want %v", serr, tc.serverErr)
			}
		})
	}
}

// TestServerRefusesBadInput sends what is not a valid hello, and a
// handshake that stops half-way: the answering side fails within its
// timeout and never panics.
func TestServerRefusesBadInput(t *testing.T) {
	good := (&hello{kind: KindRaft, secret: true, nodeID: "n1"}).marshal()
	tests := []struct {
		name  string
		input []byte
		want  error
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), ErrProtocol},
		{"raft without a handshake", []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, ErrProtocol},
		{"truncated hello", good[:20], ErrProtocol},
		{"unknown kind", append([]byte(magic), 9, 1), ErrProtocol},
		{"hello without a proof", good, ErrProtocol},
		{"nothing", nil, ErrProtocol},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &Config{NodeID: "n2", Keys: keyring(t, secretA), HandshakeTimeout: 200 * time.Millisecond}
			client, server := net.Pipe()
			defer client.Close()
			go func() { _, _ = client.Write(tc.input); _, _ = io.Copy(io.Discard, client) }()
			_, _, err := cfg.Server(server)
			_ = server.Close()
			if !errors.Is(err, tc.want) {
				t.Fatalf("Server() = %v, want %v", err, tc.want)
			}
		})
	}
}
