package discovery

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/store"
)

// TestRegisterRechecksEmployee: a stream verifies its token, waits to catch
// up, resolves its identity and registers at its first request. A change to
// the employee committed and dispatched before registration finds no
// registered stream to move or end, so the stream must see it in the store:
// it is served its new team's policies instead of its old team's, or
// refused (revoked, or moved to another org). CaughtUp holds the stream in
// that window.
func TestRegisterRechecksEmployee(t *testing.T) {
	tests := []struct {
		name   string
		change func(b *store.Batch, m store.Meta) error
		want   codes.Code
		policy string // served when want is OK
	}{
		{"moved to another team: served the new team", func(b *store.Batch, m store.Meta) error {
			_, _, err := b.PutEmployee(m, &policy.Employee{ID: "e1", Org: "o1", Team: "t2", Status: policy.StatusActive}, nil)
			return err
		}, codes.OK, "p-t2"},
		{"moved to another org", func(b *store.Batch, m store.Meta) error {
			_, _, err := b.PutEmployee(m, &policy.Employee{ID: "e1", Org: "o2", Team: "t1", Status: policy.StatusActive}, nil)
			return err
		}, codes.PermissionDenied, ""},
		{"deactivated", func(b *store.Batch, m store.Meta) error {
			_, _, err := b.PutEmployee(m, &policy.Employee{ID: "e1", Org: "o1", Team: "t1", Status: policy.StatusInactive}, nil)
			return err
		}, codes.PermissionDenied, ""},
		// Looked up after the wait, a deleted employee is as unknown as
		// one never created.
		{"deleted", func(b *store.Batch, m store.Meta) error {
			return b.DeleteEmployee(m, "e1", nil)
		}, codes.Unauthenticated, ""},
		{"unchanged: served", nil, codes.OK, "p-t1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newRegisterHarness(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.authenticated: // the identity is resolved: team t1
			case <-ctx.Done():
				t.Fatal("the stream never reached the catch-up wait")
			}
			if tt.change != nil {
				h.apply(t, 2, tt.change)
			}
			close(h.release)
			// A refused stream may end before the request is sent: Send
			// then says io.EOF, and Recv has the status.
			if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1"}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("send the first request: %v", err)
			}
			resp, err := gs.Recv()
			if got := status.Code(err); got != tt.want {
				t.Fatalf("first receive: %v (code %v, response %v), want code %v", err, got, resp, tt.want)
			}
			if tt.want != codes.OK {
				return
			}
			if n := len(resp.GetPolicies()); n != 1 || resp.GetPolicies()[0].GetName() != tt.policy {
				t.Errorf("served %d policies (%v), want only %s", n, resp.GetPolicies(), tt.policy)
			}
		})
	}
}

// registerHarness is a discovery service over a real store, policy index,
// JWT verifier and gRPC connection, whose catch-up wait signals
// authenticated (the token verified) and then waits for release.
type registerHarness struct {
	st            *store.Store
	sub           *store.Subscription
	index         *policyset.Index
	svc           *Service
	addr          string
	client        discoveryv1.PolicyDiscoveryServiceClient
	reg           *prometheus.Registry
	token         string
	authenticated chan struct{}
	authOnce      sync.Once
	release       chan struct{}
	// catchUpErr, when set, is what the catch-up wait returns once
	// released: a node that could not confirm it is current.
	catchUpErr atomic.Pointer[error]
	// serverWrites counts the writes on the server's connections, a
	// syscall each.
	serverWrites atomic.Int64
	// refusal is the service's Deps.Refusal; nil: none.
	refusal atomic.Pointer[string]
}

// countingListener counts the writes on the connections it accepts.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func newRegisterHarness(t *testing.T) *registerHarness {
	t.Helper()
	return newRegisterHarnessWith(t, config.Default().Discovery)
}

// newRegisterHarnessWith is newRegisterHarness with the service's config.
func newRegisterHarnessWith(t *testing.T, cfg config.Discovery) *registerHarness {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h := &registerHarness{st: st, sub: st.SubscribeWithData(), reg: prometheus.NewRegistry(),
		authenticated: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(h.sub.Close)
	h.apply(t, 1, func(b *store.Batch, m store.Meta) error {
		if _, _, err := b.PutEmployee(m, &policy.Employee{ID: "e1", Org: "o1", Team: "t1", Status: policy.StatusActive}, nil); err != nil {
			return err
		}
		for _, team := range []string{"t1", "t2"} {
			p, err := policy.DecodePolicy([]byte(`{"name":"p-` + team + `","kind":"ToolPolicy","scope":{"org":"o1","team":"` + team +
				`"},"spec":{"tool_name":"Bash","action":"deny","reason":"test"}}`))
			if err != nil {
				return err
			}
			if _, _, err := b.PutPolicy(m, p, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if h.index, err = policyset.New(st); err != nil {
		t.Fatal(err)
	}
	h.sub.Next() // the index has read the store past these

	secret := filepath.Join(dir, "jwt.secret")
	if err := os.WriteFile(secret, []byte(registerKey), 0o600); err != nil {
		t.Fatal(err)
	}
	verifier, err := auth.NewJWTVerifier(config.JWT{HMACSecretFile: secret, Issuer: "test", Leeway: time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	h.token = tokenFor(t, "e1")

	h.svc, err = New(cfg, logger, Deps{
		NodeID: "n1", LeaderID: func() string { return "n1" }, Store: st, Policies: h.index, Verifier: verifier,
		Registry: h.reg,
		Refusal: func() string {
			if p := h.refusal.Load(); p != nil {
				return *p
			}
			return ""
		},
		CaughtUp: func(ctx context.Context) error {
			h.authOnce.Do(func() { close(h.authenticated) }) // the first stream's
			select {
			case <-h.release:
				if err := h.catchUpErr.Load(); err != nil {
					return *err
				}
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions()...)
	h.svc.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(countingListener{lis, &h.serverWrites}) }()
	t.Cleanup(func() {
		h.svc.CloseAll()
		srv.Stop()
	})
	h.addr = lis.Addr().String()
	h.client = h.dial(t)
	return h
}

// dial opens another client connection to the service.
func (h *registerHarness) dial(t *testing.T) discoveryv1.PolicyDiscoveryServiceClient {
	t.Helper()
	// Fixed flow-control windows: grpc-go's BDP estimation would grow
	// them, so that a sidecar that stops reading might not block the
	// node's sends, which the writer tests count on.
	cc, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return discoveryv1.NewPolicyDiscoveryServiceClient(cc)
}

// registerKey signs the harness's tokens (HS256).
const registerKey = "register-test-secret-of-32-bytes!"

// tokenFor is a token of employee e of org o1 that the harness accepts.
func tokenFor(t *testing.T, e string) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": e, "org": "o1", "iss": "test", "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte(registerKey))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// apply commits batch index with fn and dispatches its changes as the
// node does: the policy index first, then the service.
func (h *registerHarness) apply(t *testing.T, index uint64, fn func(b *store.Batch, m store.Meta) error) {
	t.Helper()
	for _, c := range h.commit(t, index, fn) {
		h.svc.OnChange(c)
	}
}

// commit commits batch index with fn and has the policy index take its
// changes in, but not yet the service: what a stream opening in between
// sees.
func (h *registerHarness) commit(t *testing.T, index uint64, fn func(b *store.Batch, m store.Meta) error) []store.Change {
	t.Helper()
	m := store.Meta{Index: index, ProcessedAt: time.Unix(int64(index), 0), OriginatedAt: time.Unix(int64(index), 0)}
	if err := h.st.ApplyBatch(index, func(b *store.Batch) error { return fn(b, m) }); err != nil {
		t.Fatalf("apply batch %d: %v", index, err)
	}
	if h.svc == nil {
		return nil // setting up: the index reads the store when it is built
	}
	changes := h.sub.Next()
	for _, c := range changes {
		if err := h.index.Update(c); err != nil {
			t.Fatalf("index update: %v", err)
		}
	}
	return changes
}
