package server

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/raftnode"
)

// TestRemovedNodeKnowsIt: once the configuration no longer holds a node,
// its /readyz answers 503 within a few seconds, the remaining nodes see no
// vote request from it, and its sidecars reconnect to other nodes and keep
// receiving changes.
func TestRemovedNodeKnowsIt(t *testing.T) {
	// Without the staleness bound, only knowing it was removed moves the
	// node's sidecars.
	c := newCluster(t, 3, func(cfg *config.Config) { cfg.Setup.MaxStaleness = 0 })
	leader := c.leader()
	a := apiFor(t, leader)
	if r := a.do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	a.putPolicy("acme.deny-shell", "acme", "no shell")
	c.waitConverged()

	victim := c.follower()
	var others []*Node
	grpcAddrs, httpAddrs := []string{victim.GRPCAddr()}, []string{victim.HTTPAddr()}
	for _, n := range c.nodes {
		if n != victim {
			others = append(others, n)
			grpcAddrs, httpAddrs = append(grpcAddrs, n.GRPCAddr()), append(httpAddrs, n.HTTPAddr())
		}
	}
	grpcSidecar := startSDK(t, client.Config{Servers: grpcAddrs, Scope: client.Scope{Org: "acme", Team: "red"}, ClientAddress: "removed-grpc"})
	wsSidecar := startSDK(t, client.Config{Servers: httpAddrs, Transport: client.TransportWS, Employee: "alice"})
	for _, s := range []*sdkRun{grpcSidecar, wsSidecar} {
		s.hasPolicy(t, "acme.deny-shell")
	}
	poll.Eventually(t, "both sidecars on the victim", func() error {
		if g, w := len(victim.discovery.Clients()), len(victim.feed.Clients()); g != 1 || w != 1 {
			return fmt.Errorf("victim serves %d gRPC and %d WebSocket sidecars", g, w)
		}
		return nil
	}, poll.Within(10*time.Second))

	votes := make(chan any, 16)
	for _, n := range others {
		o := raft.NewObserver(nil, false, func(o *raft.Observation) bool {
			var from []byte
			switch v := o.Data.(type) {
			case raft.RequestVoteRequest:
				from = v.ID
			case raft.RequestPreVoteRequest:
				from = v.ID
			}
			if string(from) == victim.ID() {
				select {
				case votes <- o.Data:
				default:
				}
			}
			return false
		})
		n.consensus.Raft().RegisterObserver(o)
		t.Cleanup(func() { n.consensus.Raft().DeregisterObserver(o) })
	}

	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := leader.Remove(ctx, victim.ID()); err != nil {
		t.Fatal(err)
	}
	va := apiFor(t, victim)
	poll.Eventually(t, "the removed node's /readyz to answer 503", func() error {
		if r := va.do(http.MethodGet, "/readyz", nil, nil); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "removed from the cluster") {
			return fmt.Errorf("/readyz %d %s", r.status, r.body)
		}
		return nil
	}, poll.Within(10*time.Second))

	t.Logf("removed node not ready %v after the remove was requested", time.Since(start).Round(time.Millisecond))

	poll.Eventually(t, "the sidecars to move to other nodes", func() error {
		if g, w := len(victim.discovery.Clients()), len(victim.feed.Clients()); g+w > 0 {
			return fmt.Errorf("the removed node still serves %d gRPC and %d WebSocket sidecars", g, w)
		}
		var g, w int
		for _, n := range others {
			g, w = g+len(n.discovery.Clients()), w+len(n.feed.Clients())
		}
		if g != 1 || w != 1 {
			return fmt.Errorf("other nodes serve %d gRPC and %d WebSocket sidecars", g, w)
		}
		return nil
	}, poll.Within(15*time.Second))

	apiFor(t, leader).putPolicy("acme.after-remove", "acme", "still served")
	for _, s := range []*sdkRun{grpcSidecar, wsSidecar} {
		s.hasPolicy(t, "acme.after-remove")
	}

	// Ten election timeouts without a vote request from the removed node.
	quiet := 10 * c.cfgs[0].Raft.ElectionTimeout
	select {
	case v := <-votes:
		t.Fatalf("the removed node asked for a vote: %+v", v)
	case <-time.After(quiet):
	}
	if r := va.do(http.MethodGet, "/readyz", nil, nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d after %v", r.status, quiet)
	}
	if !slices.ContainsFunc(others, func(n *Node) bool { return n.IsLeader() }) {
		t.Fatal("no remaining node leads")
	}
	if got := victim.refusal(); got != raftnode.RemovedRefusal {
		t.Fatalf("refusal %q, want %q", got, raftnode.RemovedRefusal)
	}
}
