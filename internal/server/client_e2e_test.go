package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/poll"
)

// These tests run the client SDK against a real 3-node cluster: writes go
// through the admin REST API of one node and reach a sidecar connected to
// another; stopping the node a sidecar is connected to makes it fail over
// without a full resend.

// sdkRun is an SDK client running against the cluster until the test ends.
type sdkRun struct {
	*client.Client
	mu          sync.Mutex
	transitions []string
	updates     []client.Update
	done        chan error
}

func startSDK(t *testing.T, cfg client.Config) *sdkRun {
	t.Helper()
	s := &sdkRun{done: make(chan error, 1)}
	cfg.OnStateChange = func(from, to client.State) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.transitions = append(s.transitions, fmt.Sprintf("%s->%s", from, to))
	}
	cfg.OnUpdate = func(u client.Update) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.updates = append(s.updates, u)
	}
	cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	c, err := client.New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	s.Client = c
	ctx, cancel := context.WithCancel(context.Background())
	go func() { s.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-s.done:
			if err != nil && !errors.Is(err, client.ErrRevoked) {
				t.Errorf("SDK Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("SDK Run did not return")
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatalf("SDK never ready: %v", err)
	}
	return s
}

func (s *sdkRun) counts() (transitions []string, updates int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.transitions), len(s.updates)
}

// hasPolicy waits until the SDK holds policy name.
func (s *sdkRun) hasPolicy(t *testing.T, name string) {
	t.Helper()
	poll.Eventually(t, "the SDK to receive "+name, func() error {
		for _, p := range s.Policies() {
			if p.Name == name {
				return nil
			}
		}
		return fmt.Errorf("SDK holds %d policies, not %s", len(s.Policies()), name)
	}, poll.Within(10*time.Second))

}

// connectedNode returns the index of the node whose address addrOf gives
// the SDK's current server.
func connectedNode(t *testing.T, c *cluster, s *sdkRun, addrOf func(*Node) string) int {
	t.Helper()
	server := s.Stats().Server
	for i, n := range c.nodes {
		if n != nil && strings.Contains(server, addrOf(n)) {
			return i
		}
	}
	t.Fatalf("SDK connected to %q, which is no running node", server)
	return -1
}

// failover stops node i and waits for the SDK to go disconnected and back
// to ready on another node, within a few seconds.
func failover(t *testing.T, c *cluster, s *sdkRun, i int) {
	t.Helper()
	before, _ := s.counts()
	start := time.Now()
	c.stop(i)
	poll.Eventually(t, "the SDK to fail over and be ready", func() error {
		tr, _ := s.counts()
		if got := tr[len(before):]; !slices.Equal(got, []string{"ready->disconnected", "disconnected->ready"}) {
			return fmt.Errorf("transitions since the stop: %v", got)
		}
		return nil
	}, poll.Within(5*time.Second))

	t.Logf("failover took %v (including the node's shutdown)", time.Since(start))
}

func TestSDKGRPCFailoverWithoutResend(t *testing.T) {
	c := newCluster(t, 3, nil)
	var servers []string
	for _, n := range c.nodes {
		servers = append(servers, n.GRPCAddr())
	}
	s := startSDK(t, client.Config{Servers: servers, Scope: client.Scope{Org: "acme", Team: "red"}, ClientAddress: "e2e-grpc"})
	on := connectedNode(t, c, s, (*Node).GRPCAddr)

	// A policy written through another node reaches the sidecar.
	apiFor(t, c.nodes[(on+1)%3]).putPolicy("acme.deny-shell", "acme", "no shell")
	apiFor(t, c.nodes[(on+1)%3]).putPolicy("globex.deny-shell", "globex", "not for acme")
	s.hasPolicy(t, "acme.deny-shell")
	if reason, blocked := s.IsBlocked("Bash", map[string]any{"command": "rm -rf /"}); !blocked || reason != "no shell" {
		t.Fatalf("IsBlocked = (%q, %v)", reason, blocked)
	}
	if _, blocked := s.IsBlocked("Bash", map[string]any{"command": "ls"}); blocked {
		t.Fatal("ls is blocked")
	}
	for _, p := range s.Policies() {
		if p.Scope.Org == "globex" {
			t.Fatalf("the sidecar of acme received %s", p.Name)
		}
	}
	c.waitConverged()

	version, stats := s.Version(), s.Stats()
	_, updates := s.counts()
	failover(t, c, s, on)
	after := s.Stats()
	if after.Server == stats.Server {
		t.Fatalf("still on %s", after.Server)
	}
	if after.FullSyncs != stats.FullSyncs || after.Unchanged != stats.Unchanged+1 {
		t.Fatalf("stats before %+v, after %+v: want one unchanged answer and no full resend", stats, after)
	}
	if _, u := s.counts(); u != updates || s.Version() != version {
		t.Fatalf("the failover applied a new set (%d updates, was %d; version %s, was %s)", u, updates, s.Version(), version)
	}

	// Changes keep coming on the new node.
	survivor := c.running()[0]
	apiFor(t, survivor).putPolicy("acme.deny-curl", "acme", "no curl")
	s.hasPolicy(t, "acme.deny-curl")
	if s.State() != client.StateReady {
		t.Fatalf("state %s", s.State())
	}
}

func TestSDKWebSocketFailoverWithSince(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.leader())
	if r := a.do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	c.waitConverged()
	var servers []string
	for _, n := range c.nodes {
		servers = append(servers, n.HTTPAddr())
	}
	s := startSDK(t, client.Config{Servers: servers, Transport: client.TransportWS, Employee: "alice"})
	on := connectedNode(t, c, s, (*Node).HTTPAddr)

	apiFor(t, c.nodes[(on+1)%3]).putPolicy("acme.deny-shell", "acme", "no shell")
	s.hasPolicy(t, "acme.deny-shell")
	if reason, blocked := s.IsBlocked("Bash", map[string]any{"command": "rm -rf /"}); !blocked || reason != "no shell" {
		t.Fatalf("IsBlocked = (%q, %v)", reason, blocked)
	}
	c.waitConverged()

	stats := s.Stats()
	failover(t, c, s, on)
	// Give the new node the chance to (wrongly) send init before checking.
	survivor := c.running()[0]
	apiFor(t, survivor).putPolicy("acme.deny-curl", "acme", "no curl")
	s.hasPolicy(t, "acme.deny-curl")
	after := s.Stats()
	if after.Server == stats.Server {
		t.Fatalf("still on %s", after.Server)
	}
	if after.FullSyncs != stats.FullSyncs || after.Deltas != stats.Deltas+1 {
		t.Fatalf("stats before %+v, after %+v: want the reconnect with since to resend nothing, then one upsert", stats, after)
	}

	// Deactivating the employee revokes the sidecar at once.
	if r := apiFor(t, survivor).do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red","status":"inactive"}`), nil); r.status != http.StatusOK {
		t.Fatalf("deactivate: %d %s", r.status, r.body)
	}
	select {
	case err := <-s.done:
		s.done <- err
		if !errors.Is(err, client.ErrRevoked) {
			t.Fatalf("Run = %v, want ErrRevoked", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the SDK was not revoked")
	}
	if !s.ShouldBlockAll() || s.State() != client.StateRevoked {
		t.Fatalf("after revocation: state %s, block all %v", s.State(), s.ShouldBlockAll())
	}
}

// TestSDKGRPCDecodesOnlyChangedPolicies: a discovery response carries the
// whole set, but the SDK keeps the policies whose bytes did not change as
// it holds them (the same labels map and spec), and decodes the changed
// one. That needs the node to encode an unchanged policy with the same
// bytes in every snapshot, labels included, whatever Go's map order.
func TestSDKGRPCDecodesOnlyChangedPolicies(t *testing.T) {
	c := newCluster(t, 1, nil)
	s := startSDK(t, client.Config{Servers: []string{c.nodes[0].GRPCAddr()}, Scope: client.Scope{Org: "acme"}, ClientAddress: "e2e-reuse"})
	a := apiFor(t, c.nodes[0])
	labels := map[string]string{}
	for i := range 8 {
		labels[fmt.Sprintf("label-%d", i)] = fmt.Sprint(i)
	}
	put := func(name, reason string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{
			"name": name, "kind": "ToolPolicy", "scope": map[string]string{"org": "acme"}, "labels": labels,
			"spec": map[string]any{"tool_name": "Bash", "action": "deny", "reason": reason},
		})
		if r := a.do(http.MethodPut, "/v1/policies/"+name, body, nil); r.status != http.StatusOK {
			t.Fatalf("PUT %s: %d %s", name, r.status, r.body)
		}
	}
	// identity is where a held policy's labels and spec live.
	type identity struct{ labels, spec unsafe.Pointer }
	held := func() map[string]identity {
		out := map[string]identity{}
		for _, p := range s.Policies() {
			out[p.Name] = identity{reflect.ValueOf(p.Labels).UnsafePointer(), unsafe.Pointer(unsafe.SliceData(p.Spec))}
		}
		return out
	}
	put("acme.a", "stays")
	put("acme.b", "changes 0")
	s.hasPolicy(t, "acme.a")
	s.hasPolicy(t, "acme.b")
	before := held()
	for i := 1; i <= 3; i++ {
		version := s.Version()
		put("acme.b", fmt.Sprintf("changes %d", i))
		poll.Eventually(t, "the SDK to take the change", func() error {
			if v := s.Version(); v == version {
				return fmt.Errorf("still at version %s", v)
			}
			return nil
		}, poll.Within(10*time.Second))

		now := held()
		if now["acme.a"] != before["acme.a"] {
			t.Fatalf("change %d: the unchanged policy was decoded again", i)
		}
		if now["acme.b"] == before["acme.b"] {
			t.Fatalf("change %d: the changed policy was not decoded", i)
		}
		before = now
	}
}
