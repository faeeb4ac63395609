package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
)

// These tests change an employee's record while its sidecars are connected
// to every node of a real 3-node cluster in auth.mode jwt, over both
// transports (docs/sidecars.md): a team move re-scopes the
// open connections, an org change revokes them.

// identityData writes the employee alice (acme/red) and a policy for each
// scope the tests move her between, and returns the policies each of her
// identities must hold.
func identityData(t *testing.T, c *cluster) (red, blue, beta []string) {
	t.Helper()
	a := apiFor(t, c.follower())
	a.put("/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red","status":"active"}`))
	for name, scope := range map[string]policy.Scope{
		"acme.all":  {Org: "acme"},
		"acme.red":  {Org: "acme", Team: "red"},
		"acme.blue": {Org: "acme", Team: "blue"},
		"beta.all":  {Org: "beta"},
		"beta.blue": {Org: "beta", Team: "blue"},
	} {
		a.put("/v1/policies/"+name, scopedPolicy(name, scope, "deny "+name))
	}
	c.waitConverged()
	return []string{"acme.all", "acme.red"}, []string{"acme.all", "acme.blue"}, []string{"beta.all", "beta.blue"}
}

// moveAlice writes alice's record through node n.
func moveAlice(t *testing.T, n *Node, org, team string) {
	t.Helper()
	apiFor(t, n).put("/v1/employees/alice", []byte(fmt.Sprintf(`{"id":"alice","org":%q,"team":%q,"status":"active"}`, org, team)))
}

// sortedNames is the names of policies ps, sorted.
func sortedNames[P any](ps []P, name func(P) string) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, name(p))
	}
	slices.Sort(out)
	return out
}

func feedNames(ps []feedv1.Policy) []string {
	return sortedNames(ps, func(p feedv1.Policy) string { return p.Name })
}

func grpcNames(r *discoveryv1.PolicyDiscoveryResponse) []string {
	return sortedNames(r.GetPolicies(), (*discoveryv1.Policy).GetName)
}

func sdkNames(c *client.Client) []string {
	return sortedNames(c.Policies(), func(p client.Policy) string { return p.Name })
}

// TestIdentityChangesOnOpenConnections: alice has a feed connection and a
// discovery stream open on every node, and her gRPC client names her old
// team in every request, as an SDK configured with its scope does.
//
//   - A team move, written through a follower, sends every feed connection
//     an init and every stream a snapshot holding exactly the new team's
//     set; from then on they hear the new team's changes, not the old
//     team's. The token that still names the old team connects on every
//     node and is served the new team.
//   - An org change revokes every feed connection (revoke, 4403) and ends
//     every stream with PermissionDenied, on every node; the token naming
//     the old org is refused on every node, and a token for the new org is
//     served the new org's set.
func TestIdentityChangesOnOpenConnections(t *testing.T) {
	c := newCluster(t, 3, jwtMode(t))
	red, blue, beta := identityData(t, c)
	oldToken := signJWT(t, "alice", "acme", "red", time.Hour)
	oldScope := policy.Scope{Org: "acme", Team: "red", Employee: "alice"}

	type sidecar struct {
		node string
		ws   *feedE2EClient
		grpc *dstream
	}
	var sidecars []sidecar
	for _, n := range c.running() {
		ws, st := connectBoth(t, n, oldToken, oldScope, "alice-"+n.ID(), red)
		sidecars = append(sidecars, sidecar{n.ID(), ws, st})
	}

	moveAlice(t, c.follower(), "acme", "blue")
	for _, s := range sidecars {
		if got := feedNames(s.ws.nextOf(feedv1.TypeInit).Policies); !slices.Equal(got, blue) {
			t.Errorf("%s: feed init after the team move %v, want %v", s.node, got, blue)
		}
		r := s.grpc.next()
		if got := grpcNames(r); r.GetUnchanged() || !slices.Equal(got, blue) {
			t.Errorf("%s: snapshot after the team move %v (unchanged %v), want %v", s.node, got, r.GetUnchanged(), blue)
		}
		s.grpc.ack(r) // naming team red still
	}
	// The old team's change reaches no one; the new team's reaches all.
	a := apiFor(t, c.leader())
	a.put("/v1/policies/acme.red", scopedPolicy("acme.red", policy.Scope{Org: "acme", Team: "red"}, "changed"))
	a.put("/v1/policies/acme.blue", scopedPolicy("acme.blue", policy.Scope{Org: "acme", Team: "blue"}, "changed"))
	for _, s := range sidecars {
		if m := s.ws.nextOf(feedv1.TypeUpsert); m.Policy.Name != "acme.blue" {
			t.Errorf("%s: feed upsert of %s after the move, want acme.blue", s.node, m.Policy.Name)
		}
		r := s.grpc.next()
		if got := grpcNames(r); !slices.Equal(got, blue) || revision(r, "acme.blue") < 2 {
			t.Errorf("%s: snapshot %v after the blue change, want %v with acme.blue changed", s.node, got, blue)
		}
		s.grpc.ack(r)
	}
	// The token that names the old team still connects, to the new team.
	for _, n := range c.running() {
		connectBoth(t, n, oldToken, oldScope, "alice-again-"+n.ID(), blue)
	}

	moveAlice(t, c.follower(), "beta", "blue")
	for _, s := range sidecars {
		m := s.ws.nextOf(feedv1.TypeRevoke)
		select {
		case <-s.ws.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: feed connection still open after revoke", s.node)
		}
		if code := websocket.CloseStatus(s.ws.err); code != feedv1.CloseRevoked {
			t.Errorf("%s: feed closed with %v, want %d", s.node, s.ws.err, feedv1.CloseRevoked)
		}
		t.Logf("%s: feed revoked: %q", s.node, m.Reason)
		if st := s.grpc.end(); st.Code() != codes.PermissionDenied {
			t.Errorf("%s: stream ended with %v after the org change, want PermissionDenied", s.node, st)
		}
	}
	newToken := signJWT(t, "alice", "beta", "blue", time.Hour)
	for _, n := range c.running() {
		if ws, status := feedE2EDial(t, n, oldToken); ws != nil || status != http.StatusForbidden {
			t.Errorf("%s: feed with the old org's token: %d, want 403", n.ID(), status)
		}
		if st := openStream(t, dialGRPC(t, n.GRPCAddr()), "alice-old-org-"+n.ID(), policy.Scope{}, withCtx(bearer(context.Background(), oldToken))).end(); st.Code() != codes.PermissionDenied {
			t.Errorf("%s: stream with the old org's token ended with %v, want PermissionDenied", n.ID(), st)
		}
		connectBoth(t, n, newToken, policy.Scope{}, "alice-beta-"+n.ID(), beta)
	}
}

// connectBoth opens a feed connection and a discovery stream (asking for
// scope, named client) to n with token, checks that each is sent exactly
// the policies want first, and ACKs the stream's.
func connectBoth(t *testing.T, n *Node, token string, scope policy.Scope, client string, want []string) (*feedE2EClient, *dstream) {
	t.Helper()
	ws, status := feedE2EDial(t, n, token)
	if ws == nil {
		t.Fatalf("%s refused the feed connection of %s: %d", n.ID(), client, status)
	}
	if got := feedNames(ws.nextOf(feedv1.TypeInit).Policies); !slices.Equal(got, want) {
		t.Errorf("%s: feed init of %s %v, want %v", n.ID(), client, got, want)
	}
	st := openStream(t, dialGRPC(t, n.GRPCAddr()), client, scope, withCtx(bearer(context.Background(), token)))
	r := st.next()
	if got := grpcNames(r); !slices.Equal(got, want) {
		t.Errorf("%s: first snapshot of %s %v, want %v", n.ID(), client, got, want)
	}
	st.ack(r)
	return ws, st
}

// TestSDKFollowsIdentityChanges runs the SDK against every node of the
// cluster over both transports, the gRPC ones configured with alice's
// scope, team included, and a token that names her team: after a team
// move each ends with exactly the new team's set, on the connection it had
// (no reconnect) and ready. After an org change each is revoked, and an
// SDK started with the old org's token is refused at its connect.
func TestSDKFollowsIdentityChanges(t *testing.T) {
	c := newCluster(t, 3, jwtMode(t))
	red, blue, _ := identityData(t, c)
	token := signJWT(t, "alice", "acme", "red", time.Hour)

	var sdks []*sdkRun
	for _, n := range c.running() {
		sdks = append(sdks,
			startSDK(t, client.Config{Servers: []string{n.GRPCAddr()}, Token: token, ClientAddress: "sdk-grpc-" + n.ID(),
				Scope: client.Scope{Org: "acme", Team: "red", Employee: "alice"}}),
			startSDK(t, client.Config{Servers: []string{n.HTTPAddr()}, Transport: client.TransportWS, Token: token,
				ClientAddress: "sdk-ws-" + n.ID()}))
	}
	connects := map[*sdkRun]uint64{}
	for _, s := range sdks {
		poll.Eventually(t, "the SDK to hold the red team's set", func() error {
			if got := sdkNames(s.Client); !slices.Equal(got, red) {
				return fmt.Errorf("%s holds %v", s.Stats().Server, got)
			}
			return nil
		}, poll.Within(10*time.Second))

		connects[s] = s.Stats().Connects
	}

	moveAlice(t, c.follower(), "acme", "blue")
	for _, s := range sdks {
		poll.Eventually(t, "the SDK to hold exactly the blue team's set", func() error {
			if got := sdkNames(s.Client); !slices.Equal(got, blue) {
				return fmt.Errorf("%s holds %v", s.Stats().Server, got)
			}
			return nil
		}, poll.Within(10*time.Second))

	}
	// A change to the new team arrives too, which also shows that every
	// ACK naming the old team was answered without ending the stream.
	apiFor(t, c.leader()).put("/v1/policies/acme.blue-2", scopedPolicy("acme.blue-2", policy.Scope{Org: "acme", Team: "blue"}, "more"))
	for _, s := range sdks {
		s.hasPolicy(t, "acme.blue-2")
		if got, want := sdkNames(s.Client), append(slices.Clone(blue), "acme.blue-2"); !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", s.Stats().Server, got, want)
		}
		if st := s.Stats(); st.Connects != connects[s] || s.State() != client.StateReady {
			t.Errorf("%s: %d connects (was %d), state %s: want the same connection, ready", st.Server, st.Connects, connects[s], s.State())
		}
	}

	moveAlice(t, c.follower(), "beta", "blue")
	for _, s := range sdks {
		select {
		case err := <-s.done:
			if !errors.Is(err, client.ErrRevoked) {
				t.Errorf("%s: Run = %v after the org change, want ErrRevoked", s.Stats().Server, err)
			}
			s.done <- err // for the cleanup
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still running after the org change (state %s)", s.Stats().Server, s.State())
		}
		if !s.ShouldBlockAll() {
			t.Errorf("%s: a revoked SDK does not block", s.Stats().Server)
		}
	}

	// A new SDK with the old org's token is refused at its connect.
	for _, cfg := range []client.Config{
		{Servers: []string{c.nodes[0].GRPCAddr()}, Token: token, ClientAddress: "sdk-grpc-late"},
		{Servers: []string{c.nodes[1].HTTPAddr()}, Transport: client.TransportWS, Token: token, ClientAddress: "sdk-ws-late"},
	} {
		cl, err := client.New(cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = cl.Run(ctx)
		cancel()
		if !errors.Is(err, client.ErrRevoked) {
			t.Errorf("%s: a new SDK with the old org's token: Run = %v, want ErrRevoked", cfg.ClientAddress, err)
		}
		if st := cl.Stats(); st.FullSyncs != 0 || len(cl.Policies()) != 0 {
			t.Errorf("%s: refused SDK received %d sets, holds %v", cfg.ClientAddress, st.FullSyncs, sdkNames(cl))
		}
	}
}

// revision is the revision of policy name in r, 0 if r lacks it.
func revision(r *discoveryv1.PolicyDiscoveryResponse, name string) uint64 {
	for _, p := range r.GetPolicies() {
		if p.GetName() == name {
			return p.GetRevision()
		}
	}
	return 0
}
