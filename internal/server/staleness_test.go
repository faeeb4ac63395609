package server

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
)

func TestLastHeard(t *testing.T) {
	t0 := time.Unix(1_000, 0)
	prev, now := t0, t0.Add(5*time.Second)
	for _, tc := range []struct {
		name        string
		leading     bool
		leaderKnown bool
		lastContact time.Time
		want        time.Time
	}{
		{name: "leader", leading: true, want: now},
		{name: "leader, old contact from its follower days", leading: true, lastContact: t0.Add(-time.Hour), want: now},
		{name: "follower that heard its leader", leaderKnown: true, lastContact: t0.Add(4 * time.Second), want: t0.Add(4 * time.Second)},
		{name: "follower whose last contact predates the previous answer", leaderKnown: true, lastContact: t0.Add(-time.Second), want: prev},
		// A vote granted sets Raft's last contact too; without a known
		// leader it must not count.
		{name: "candidate with a fresh contact", lastContact: now, want: prev},
		{name: "no leader, no contact", want: prev},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := lastHeard(prev, now, tc.leading, tc.leaderKnown, tc.lastContact); !got.Equal(tc.want) {
				t.Fatalf("lastHeard = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestIsolatedNodeDropsItsSidecars: a node that has lost the rest of the
// cluster closes its gRPC streams and WebSocket connections after
// setup.max_staleness and refuses new ones, so sidecars that know no other
// node fail closed after their grace period instead of enforcing a state
// that may have been revoked meanwhile; once the node hears a leader again
// it serves them, current, again.
func TestIsolatedNodeDropsItsSidecars(t *testing.T) {
	const bound = time.Second
	c := newCluster(t, 3, func(cfg *config.Config) { cfg.Setup.MaxStaleness = bound })
	leaderAPI := apiFor(t, c.leader())
	if r := leaderAPI.do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	leaderAPI.putPolicy("acme.deny-shell", "acme", "no shell")
	c.waitConverged()

	island := c.follower()
	idx := slices.Index(c.nodes, island)
	const grace = 300 * time.Millisecond
	sidecars := map[string]*sdkRun{
		"grpc": startSDK(t, client.Config{Servers: []string{island.GRPCAddr()}, Scope: client.Scope{Org: "acme", Team: "red"},
			ClientAddress: "stale-grpc", Grace: grace}),
		"websocket": startSDK(t, client.Config{Servers: []string{island.HTTPAddr()}, Transport: client.TransportWS,
			Employee: "alice", Grace: grace}),
	}
	for _, s := range sidecars {
		s.hasPolicy(t, "acme.deny-shell")
	}

	var others []int
	for i := range c.nodes {
		if i != idx {
			others = append(others, i)
			c.crash(i)
		}
	}
	poll.Eventually(t, "the isolated node to close its sidecars' streams and the sidecars to block everything", func() error {
		if !island.stale.Load() {
			return fmt.Errorf("%s not stale yet", island.ID())
		}
		if g, w := len(island.discovery.Clients()), len(island.feed.Clients()); g+w > 0 {
			return fmt.Errorf("%s still serves %d gRPC and %d WebSocket sidecars", island.ID(), g, w)
		}
		for name, s := range sidecars {
			if s.State() != client.StateDisconnected || !s.ShouldBlockAll() {
				tr, _ := s.counts()
				return fmt.Errorf("%s sidecar: state %s, blocks all %v, transitions %v", name, s.State(), s.ShouldBlockAll(), tr)
			}
		}
		return nil
	}, poll.Within(10*bound))

	// A new connection is refused at once, before any set-up.
	resp, err := http.Get("http://" + island.HTTPAddr() + feedv1.Path + "?employee=alice")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "max_staleness") {
		t.Fatalf("feed handshake on the isolated node: %d %s", resp.StatusCode, body)
	}

	for _, i := range others {
		c.restart(i)
	}
	c.leader()
	apiFor(t, c.nodes[others[0]]).putPolicy("acme.deny-curl", "acme", "no curl")
	for name, s := range sidecars {
		s.hasPolicy(t, "acme.deny-curl")
		// The SDK puts a received set in force a moment before it marks
		// the sync ready (install, then synced).
		poll.Eventually(t, name+" sidecar to be ready after the cluster came back", func() error {
			if s.State() != client.StateReady || s.ShouldBlockAll() {
				return fmt.Errorf("state %s, blocks all %v", s.State(), s.ShouldBlockAll())
			}
			return nil
		}, poll.Within(10*time.Second))

		tr, _ := s.counts()
		t.Logf("%s sidecar transitions: %v", name, tr)
	}
	if island.stale.Load() {
		t.Fatalf("%s still stale", island.ID())
	}
}
