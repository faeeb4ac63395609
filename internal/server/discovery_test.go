package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/adminapi"
	"github.com/policyd/policyd/internal/server/proxystatus"
	"github.com/policyd/policyd/internal/server/servertest"
)

// The tests in this file speak the discovery protocol by hand over real gRPC
// to real nodes, so that every response a client receives is counted. The
// SDK's own end-to-end tests are in client_e2e_test.go.

// recvTimeout bounds one wait for a response that must come.
const recvTimeout = 10 * time.Second

func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// dstream is one hand-driven discovery stream. A goroutine receives into
// resps, so a test can both count responses and wait with a deadline.
type dstream struct {
	t      *testing.T
	client string
	scope  *discoveryv1.Scope
	stream grpc.BidiStreamingClient[discoveryv1.PolicyDiscoveryRequest, discoveryv1.PolicyDiscoveryResponse]
	cancel context.CancelFunc
	resps  chan *discoveryv1.PolicyDiscoveryResponse
	ended  chan error
}

type streamOpt func(*streamOpts)

type streamOpts struct {
	version, nonce string
	ctx            context.Context
}

func withVersion(v string) streamOpt { return func(o *streamOpts) { o.version = v } }
func withNonce(n string) streamOpt   { return func(o *streamOpts) { o.nonce = n } }
func withCtx(ctx context.Context) streamOpt {
	return func(o *streamOpts) { o.ctx = ctx }
}

// openStream opens a stream and sends the initial request.
func openStream(t *testing.T, cc *grpc.ClientConn, client string, scope policy.Scope, opts ...streamOpt) *dstream {
	t.Helper()
	o := streamOpts{ctx: context.Background()}
	for _, f := range opts {
		f(&o)
	}
	ctx, cancel := context.WithCancel(o.ctx)
	s, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).StreamPolicies(ctx)
	if err != nil {
		cancel()
		t.Fatalf("open stream: %v", err)
	}
	d := &dstream{
		t: t, client: client, stream: s, cancel: cancel,
		scope: &discoveryv1.Scope{Org: scope.Org, Team: scope.Team, Employee: scope.Employee},
		resps: make(chan *discoveryv1.PolicyDiscoveryResponse, 1024),
		ended: make(chan error, 1),
	}
	go func() {
		for {
			r, err := s.Recv()
			if err != nil {
				d.ended <- err
				close(d.resps)
				return
			}
			d.resps <- r
		}
	}()
	t.Cleanup(d.close)
	d.send(o.version, o.nonce, nil)
	return d
}

func (d *dstream) close() {
	d.cancel()
	for range d.resps { //nolint:revive // drain until the receiver ends
	}
}

func (d *dstream) send(version, nonce string, nack *discoveryv1.ErrorDetail) {
	d.t.Helper()
	err := d.stream.Send(&discoveryv1.PolicyDiscoveryRequest{
		ClientAddress: d.client, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: nack, Scope: d.scope,
	})
	if err != nil && !errors.Is(err, io.EOF) {
		d.t.Fatalf("send: %v", err)
	}
}

func (d *dstream) ack(r *discoveryv1.PolicyDiscoveryResponse) {
	d.t.Helper()
	d.send(r.GetVersionInfo(), r.GetNonce(), nil)
}

// next waits for the next response.
func (d *dstream) next() *discoveryv1.PolicyDiscoveryResponse {
	d.t.Helper()
	select {
	case r, ok := <-d.resps:
		if !ok {
			d.t.Fatalf("stream %s ended: %v", d.client, <-d.ended)
		}
		return r
	case <-time.After(recvTimeout):
		d.t.Fatalf("stream %s: no response within %v", d.client, recvTimeout)
		return nil
	}
}

// untilVersion ACKs responses until one carries version, and returns how
// many responses that took.
func (d *dstream) untilVersion(version string) int {
	d.t.Helper()
	for n := 1; ; n++ {
		r := d.next()
		d.ack(r)
		if r.GetVersionInfo() == version {
			return n
		}
	}
}

// end waits for the stream to end and returns its status.
func (d *dstream) end() *status.Status {
	d.t.Helper()
	deadline := time.After(recvTimeout)
	for {
		select {
		case _, ok := <-d.resps:
			if !ok {
				return status.Convert(<-d.ended)
			}
		case <-deadline:
			d.t.Fatalf("stream %s did not end within %v", d.client, recvTimeout)
			return nil
		}
	}
}

func names(r *discoveryv1.PolicyDiscoveryResponse) []string {
	out := []string{}
	for _, p := range r.GetPolicies() {
		out = append(out, p.GetName())
	}
	return out
}

// versionOf is the policy-set version node n serves to identity id.
func versionOf(t *testing.T, n *Node, id policy.Identity) string {
	t.Helper()
	set, err := n.store.PolicySet(id)
	if err != nil {
		t.Fatal(err)
	}
	return set.Version
}

// scopedPolicy is a valid ToolPolicy with the given scope.
func scopedPolicy(name string, scope policy.Scope, reason string) []byte {
	return []byte(fmt.Sprintf(`{"name":%q,"kind":"ToolPolicy","scope":{"org":%q,"team":%q,"employee":%q},
		"spec":{"tool_name":"Bash","action":"deny","reason":%q}}`, name, scope.Org, scope.Team, scope.Employee, reason))
}

func (a *api) put(path string, body []byte) response {
	a.t.Helper()
	r := a.do(http.MethodPut, path, body, nil)
	if r.status != http.StatusOK {
		a.t.Fatalf("PUT %s: %d %s", path, r.status, r.body)
	}
	return r
}

func (a *api) del(path string) {
	a.t.Helper()
	if r := a.do(http.MethodDelete, path, nil, nil); r.status != http.StatusOK && r.status != http.StatusNoContent {
		a.t.Fatalf("DELETE %s: %d %s", path, r.status, r.body)
	}
}

func (a *api) proxyStatus(query string) proxystatus.Status {
	a.t.Helper()
	r := a.do(http.MethodGet, "/v1/proxy-status"+query, nil, nil)
	if r.status != http.StatusOK {
		a.t.Fatalf("GET /v1/proxy-status: %d %s", r.status, r.body)
	}
	var ro proxystatus.Status
	r.decode(a.t, &ro)
	return ro
}

func (a *api) clients() adminapi.ClientsView {
	a.t.Helper()
	r := a.do(http.MethodGet, "/v1/clients", nil, nil)
	if r.status != http.StatusOK {
		a.t.Fatalf("GET /v1/clients: %d %s", r.status, r.body)
	}
	var v adminapi.ClientsView
	r.decode(a.t, &v)
	return v
}

// TestDiscoveryProtocol walks the request table of docs/sidecars.md on a 3-node
// cluster. Each case uses its own org, so cases don't see each other's
// writes.
func TestDiscoveryProtocol(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader, follower := c.leader(), c.follower()
	lapi, fapi := apiFor(t, leader), apiFor(t, follower)
	fcc := dialGRPC(t, follower.GRPCAddr())
	lcc := dialGRPC(t, leader.GRPCAddr())

	t.Run("initial request gets the snapshot and an ACK gets nothing", func(t *testing.T) {
		org := policy.Scope{Org: "initial"}
		lapi.put("/v1/policies/initial.a", scopedPolicy("initial.a", org, "a"))
		c.waitConverged()
		s := openStream(t, fcc, "c-initial", org)
		r := s.next()
		if got := names(r); !slices.Equal(got, []string{"initial.a"}) || r.GetUnchanged() || r.GetNonce() == "" {
			t.Fatalf("first response = %v unchanged=%v nonce=%q, want [initial.a], a full snapshot with a nonce", got, r.GetUnchanged(), r.GetNonce())
		}
		s.ack(r)
		// The ACK must not be answered: the next response is the next change.
		lapi.put("/v1/policies/initial.b", scopedPolicy("initial.b", org, "b"))
		r2 := s.next()
		if got := names(r2); !slices.Equal(got, []string{"initial.a", "initial.b"}) {
			t.Fatalf("response after ACK = %v, want the next change [initial.a initial.b]", got)
		}
	})

	t.Run("NACK is recorded with its message, not resent, others unaffected", func(t *testing.T) {
		org := policy.Scope{Org: "nack"}
		lapi.put("/v1/policies/nack.a", scopedPolicy("nack.a", org, "a"))
		c.waitConverged()
		v1 := versionOf(t, follower, org)
		bad := openStream(t, fcc, "c-nack-bad", org)
		good := openStream(t, lcc, "c-nack-good", org)
		r := bad.next()
		bad.send("", r.GetNonce(), &discoveryv1.ErrorDetail{Message: "cannot compile nack.a"})
		good.ack(good.next())

		ro := fapi.proxyStatus("?wait=5s")
		var found bool
		for _, v := range ro.Versions {
			if v.Version != v1 {
				continue
			}
			for _, n := range v.Nacked {
				if n.Client == "c-nack-bad" && n.Message == "cannot compile nack.a" && n.LastGoodVersion == "" {
					found = true
				}
			}
			if !slices.ContainsFunc(v.Acked, func(r proxystatus.ClientRef) bool { return r.Client == "c-nack-good" }) {
				t.Errorf("rollout of %.8s: c-nack-good not acked: %+v", v1, v)
			}
		}
		if !found {
			t.Fatalf("rollout does not show the NACK of %.8s with its message: %+v", v1, ro)
		}
		// Not resent: the next response on the NACKing stream is the next
		// change, and the other client gets it too.
		lapi.put("/v1/policies/nack.b", scopedPolicy("nack.b", org, "b"))
		c.waitConverged()
		v2 := versionOf(t, follower, org)
		if r := bad.next(); r.GetVersionInfo() != v2 {
			t.Fatalf("NACKing client got %.8s after the NACK, want the next version %.8s", r.GetVersionInfo(), v2)
		}
		if n := good.untilVersion(v2); n != 1 {
			t.Fatalf("other client needed %d responses to reach %.8s, want 1", n, v2)
		}
	})

	t.Run("a client that ACKed and went quiet still receives every later version", func(t *testing.T) {
		org := policy.Scope{Org: "quiet"}
		s := openStream(t, fcc, "c-quiet", org)
		s.ack(s.next())
		for i := range 3 {
			lapi.put(fmt.Sprintf("/v1/policies/quiet.p%d", i), scopedPolicy(fmt.Sprintf("quiet.p%d", i), org, "x"))
			c.waitConverged()
			want := versionOf(t, follower, org)
			// No request is sent between versions: each one is pushed.
			if r := s.next(); r.GetVersionInfo() != want || len(r.GetPolicies()) != i+1 {
				t.Fatalf("push %d: version %.8s with %d policies, want %.8s with %d", i, r.GetVersionInfo(), len(r.GetPolicies()), want, i+1)
			}
		}
	})

	t.Run("a superseded nonce is ignored", func(t *testing.T) {
		org := policy.Scope{Org: "superseded"}
		s := openStream(t, fcc, "c-superseded", org)
		s.ack(s.next())
		lapi.put("/v1/policies/superseded.a", scopedPolicy("superseded.a", org, "a"))
		older := s.next()
		lapi.put("/v1/policies/superseded.b", scopedPolicy("superseded.b", org, "b"))
		newer := s.next()
		// The client answers the older one late, then the newer one.
		s.ack(older)
		s.ack(newer)
		// A barrier change: if the late ACK had been answered, its answer
		// would arrive before this push.
		lapi.put("/v1/policies/superseded.c", scopedPolicy("superseded.c", org, "c"))
		c.waitConverged()
		if r := s.next(); !slices.Equal(names(r), []string{"superseded.a", "superseded.b", "superseded.c"}) {
			t.Fatalf("after a superseded ACK the next response holds %v, want the barrier change", names(r))
		}
	})

	t.Run("unknown nonce gets unchanged when current, else the snapshot", func(t *testing.T) {
		org := policy.Scope{Org: "unknown"}
		lapi.put("/v1/policies/unknown.a", scopedPolicy("unknown.a", org, "a"))
		c.waitConverged()
		onLeader := openStream(t, lcc, "c-unknown-1", org)
		first := onLeader.next()
		onLeader.ack(first)

		// The same client moves to another node with the leader's nonce and
		// its current version: nothing is resent.
		moved := openStream(t, fcc, "c-unknown-1", org, withVersion(first.GetVersionInfo()), withNonce(first.GetNonce()))
		r := moved.next()
		if !r.GetUnchanged() || len(r.GetPolicies()) != 0 || r.GetVersionInfo() != first.GetVersionInfo() {
			t.Fatalf("unknown nonce with current version: unchanged=%v policies=%d version=%.8s, want unchanged %.8s",
				r.GetUnchanged(), len(r.GetPolicies()), r.GetVersionInfo(), first.GetVersionInfo())
		}
		if strings.HasPrefix(r.GetNonce(), leader.ID()+".") || r.GetNonce() == first.GetNonce() {
			t.Fatalf("nonce %q is not the follower's own", r.GetNonce())
		}
		moved.ack(r)
		// An unknown nonce on an open stream with a stale version: the
		// full snapshot.
		moved.send("stale-version", "some-other-node.123-7", nil)
		if r := moved.next(); r.GetUnchanged() || !slices.Equal(names(r), []string{"unknown.a"}) {
			t.Fatalf("unknown nonce with a stale version: unchanged=%v %v, want the full snapshot", r.GetUnchanged(), names(r))
		}
	})

	t.Run("rapid sequential updates end on the final version", func(t *testing.T) {
		org := policy.Scope{Org: "rapid"}
		s := openStream(t, fcc, "c-rapid", org)
		s.ack(s.next())
		const writes = 20
		for i := range writes {
			lapi.put("/v1/policies/rapid.p", scopedPolicy("rapid.p", org, fmt.Sprintf("r%d", i)))
		}
		c.waitConverged()
		final := versionOf(t, follower, org)
		n := s.untilVersion(final)
		if n > writes {
			t.Fatalf("%d responses for %d writes: pushes were not coalesced or were repeated", n, writes)
		}
		ro := fapi.proxyStatus("?wait=5s")
		idx := slices.IndexFunc(ro.Versions, func(v proxystatus.Version) bool {
			return slices.ContainsFunc(v.Acked, func(r proxystatus.ClientRef) bool { return r.Client == "c-rapid" })
		})
		if idx < 0 || ro.Versions[idx].Version != final {
			t.Fatalf("rollout does not show c-rapid acked on the final version %.8s: %+v", final, ro)
		}
	})

	t.Run("versions are the same on every replica and in the REST API", func(t *testing.T) {
		org := policy.Scope{Org: "replicas"}
		lapi.put("/v1/policies/replicas.a", scopedPolicy("replicas.a", org, "a"))
		c.waitConverged()
		var got []string
		for i, n := range c.running() {
			s := openStream(t, dialGRPC(t, n.GRPCAddr()), fmt.Sprintf("c-replicas-%d", i), org)
			got = append(got, s.next().GetVersionInfo())
		}
		var list struct {
			Version string `json:"version"`
		}
		fapi.do(http.MethodGet, "/v1/policies?org=replicas", nil, nil).decode(t, &list)
		got = append(got, list.Version)
		for _, v := range got {
			if v != got[0] || len(v) != 64 {
				t.Fatalf("versions differ or are not SHA-256 hex: %v", got)
			}
		}
	})
}

// TestDiscoveryEmptySet: a client that connects before any policy exists
// gets an empty snapshot, then updates.
func TestDiscoveryEmptySet(t *testing.T) {
	n, a := singleNode(t, nil)
	s := openStream(t, dialGRPC(t, n.GRPCAddr()), "c-empty", policy.Scope{})
	r := s.next()
	const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	if len(r.GetPolicies()) != 0 || r.GetVersionInfo() != emptySHA256 || r.GetUnchanged() {
		t.Fatalf("first response: %d policies, version %s, unchanged=%v; want an empty snapshot", len(r.GetPolicies()), r.GetVersionInfo(), r.GetUnchanged())
	}
	s.ack(r)
	a.put("/v1/policies/g.a", scopedPolicy("g.a", policy.Scope{}, "a"))
	if r := s.next(); !slices.Equal(names(r), []string{"g.a"}) {
		t.Fatalf("after the first write: %v", names(r))
	}
	a.del("/v1/policies/g.a")
	if r := s.next(); len(r.GetPolicies()) != 0 || r.GetVersionInfo() != emptySHA256 {
		t.Fatalf("after deleting the only policy: %d policies, version %s; want the empty set again", len(r.GetPolicies()), r.GetVersionInfo())
	}
}

// TestDiscoveryFailoverGetsUnchanged: the node a client streams from stops;
// the client reconnects to another node with its version and nonce and is
// told `unchanged`, not sent the whole set again.
func TestDiscoveryFailoverGetsUnchanged(t *testing.T) {
	c := newCluster(t, 3, nil)
	org := policy.Scope{Org: "fo"}
	apiFor(t, c.leader()).put("/v1/policies/fo.a", scopedPolicy("fo.a", org, "a"))
	c.waitConverged()
	fi := slices.Index(c.nodes, c.follower())
	s := openStream(t, dialGRPC(t, c.nodes[fi].GRPCAddr()), "c-fo", org)
	r := s.next()
	s.ack(r)
	c.stop(fi)
	if st := s.end(); st.Code() != codes.Unavailable {
		t.Fatalf("stream on the stopped node ended with %v, want Unavailable", st)
	}
	other := c.running()[0]
	s2 := openStream(t, dialGRPC(t, other.GRPCAddr()), "c-fo", org, withVersion(r.GetVersionInfo()), withNonce(r.GetNonce()))
	if r2 := s2.next(); !r2.GetUnchanged() || len(r2.GetPolicies()) != 0 || r2.GetVersionInfo() != r.GetVersionInfo() {
		t.Fatalf("after failover: unchanged=%v policies=%d version=%.8s, want unchanged %.8s", r2.GetUnchanged(), len(r2.GetPolicies()), r2.GetVersionInfo(), r.GetVersionInfo())
	}
}

// TestDiscoveryRefusedWhenNotCurrent: a node that cannot confirm it holds
// every committed write (here: it lost its quorum) refuses new streams with
// Unavailable instead of serving a set that may be older than the one the
// sidecar already holds; once quorum returns it serves again.
func TestDiscoveryRefusedWhenNotCurrent(t *testing.T) {
	c := newCluster(t, 3, nil)
	org := policy.Scope{Org: "cu"}
	apiFor(t, c.leader()).put("/v1/policies/cu.a", scopedPolicy("cu.a", org, "a"))
	c.waitConverged()
	survivor := slices.Index(c.nodes, c.follower())
	var stopped []int
	for i := range c.nodes {
		if i != survivor {
			c.stop(i)
			stopped = append(stopped, i)
		}
	}
	s := openStream(t, dialGRPC(t, c.nodes[survivor].GRPCAddr()), "c-cu", org)
	if st := s.end(); st.Code() != codes.Unavailable {
		t.Fatalf("stream on a node without quorum ended with %v, want Unavailable", st)
	}
	c.restart(stopped[0])
	c.leader()
	s2 := openStream(t, dialGRPC(t, c.nodes[survivor].GRPCAddr()), "c-cu2", org)
	if got := names(s2.next()); !slices.Equal(got, []string{"cu.a"}) {
		t.Fatalf("after quorum returned: policies %v, want [cu.a]", got)
	}
}

// TestDiscoveryScopedDelivery: each scope receives exactly the policies
// that apply to it (global + org + team + employee), including across moves
// of a policy between scopes.
func TestDiscoveryScopedDelivery(t *testing.T) {
	n, a := singleNode(t, nil)
	cc := dialGRPC(t, n.GRPCAddr())
	acme, beta := policy.Scope{Org: "acme"}, policy.Scope{Org: "beta"}
	sec := policy.Scope{Org: "acme", Team: "sec"}
	alice := policy.Scope{Org: "acme", Team: "sec", Employee: "alice"}
	bob := policy.Scope{Org: "acme", Team: "ops", Employee: "bob"}
	writes := []struct {
		name  string
		scope policy.Scope
	}{
		{"all.1", policy.Scope{}}, {"acme.1", acme}, {"beta.1", beta}, {"sec.1", sec},
		{"alice.1", alice}, {"bob.1", bob}, {"mover", beta},
	}
	for _, w := range writes {
		a.put("/v1/policies/"+w.name, scopedPolicy(w.name, w.scope, "x"))
	}
	streams := map[string]*dstream{}
	clients := []struct {
		name string
		id   policy.Identity
	}{
		{"global", policy.Identity{}}, {"acme", acme}, {"beta", beta}, {"sec", sec}, {"alice", alice}, {"bob", bob},
	}
	for _, cl := range clients {
		streams[cl.name] = openStream(t, cc, "c-"+cl.name, cl.id)
	}
	last := map[string]*discoveryv1.PolicyDiscoveryResponse{}
	expect := func(step string, want map[string][]string) {
		t.Helper()
		for _, cl := range clients {
			s := streams[cl.name]
			v := versionOf(t, n, cl.id)
			// A stream whose set did not change is not sent anything.
			for last[cl.name] == nil || last[cl.name].GetVersionInfo() != v {
				last[cl.name] = s.next()
				s.ack(last[cl.name])
			}
			if got := names(last[cl.name]); !slices.Equal(got, want[cl.name]) {
				t.Errorf("%s: %s holds %v, want %v", step, cl.name, got, want[cl.name])
			}
		}
	}
	expect("initial", map[string][]string{
		"global": {"all.1"},
		"acme":   {"acme.1", "all.1"},
		"beta":   {"all.1", "beta.1", "mover"},
		"sec":    {"acme.1", "all.1", "sec.1"},
		"alice":  {"acme.1", "alice.1", "all.1", "sec.1"},
		"bob":    {"acme.1", "all.1", "bob.1"},
	})
	steps := []struct {
		to   policy.Scope
		want map[string][]string
	}{
		{sec, map[string][]string{
			"global": {"all.1"}, "acme": {"acme.1", "all.1"}, "beta": {"all.1", "beta.1"},
			"sec": {"acme.1", "all.1", "mover", "sec.1"}, "alice": {"acme.1", "alice.1", "all.1", "mover", "sec.1"}, "bob": {"acme.1", "all.1", "bob.1"},
		}},
		{bob, map[string][]string{
			"global": {"all.1"}, "acme": {"acme.1", "all.1"}, "beta": {"all.1", "beta.1"},
			"sec": {"acme.1", "all.1", "sec.1"}, "alice": {"acme.1", "alice.1", "all.1", "sec.1"}, "bob": {"acme.1", "all.1", "bob.1", "mover"},
		}},
		{policy.Scope{}, map[string][]string{
			"global": {"all.1", "mover"}, "acme": {"acme.1", "all.1", "mover"}, "beta": {"all.1", "beta.1", "mover"},
			"sec": {"acme.1", "all.1", "mover", "sec.1"}, "alice": {"acme.1", "alice.1", "all.1", "mover", "sec.1"}, "bob": {"acme.1", "all.1", "bob.1", "mover"},
		}},
	}
	for _, st := range steps {
		a.put("/v1/policies/mover", scopedPolicy("mover", st.to, "x"))
		expect("mover to "+st.to.String(), st.want)
	}
}

// TestDiscoveryInactiveFlush: a stream with no requests and no health
// checks is closed and forgotten; one that health-checks stays open.
func TestDiscoveryInactiveFlush(t *testing.T) {
	n, a := singleNode(t, func(cfg *config.Config) {
		cfg.Discovery.FlushInterval = 50 * time.Millisecond
		cfg.Discovery.MaxClientInactive = 500 * time.Millisecond
	})
	cc := dialGRPC(t, n.GRPCAddr())
	quiet := openStream(t, cc, "c-quiet", policy.Scope{Org: "f"})
	quiet.ack(quiet.next())
	alive := openStream(t, cc, "c-alive", policy.Scope{Org: "f"})
	alive.ack(alive.next())

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		hc := discoveryv1.NewPolicyDiscoveryServiceClient(cc)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if _, err := hc.HealthCheck(ctx, &discoveryv1.HealthCheckRequest{ClientAddress: "c-alive"}); err != nil && ctx.Err() == nil {
					t.Errorf("health check: %v", err)
				}
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	if st := quiet.end(); st.Code() != codes.DeadlineExceeded {
		t.Fatalf("quiet stream ended with %v, want DeadlineExceeded", st)
	}
	poll.Eventually(t, "the flushed stream to leave /v1/clients", func() error {
		for _, cl := range a.clients().Clients {
			if cl.ClientAddress == "c-quiet" {
				return fmt.Errorf("c-quiet still listed")
			}
		}
		return nil
	}, poll.Within(5*time.Second))

	// The health-checked stream outlived several flushes and still works.
	a.put("/v1/policies/f.a", scopedPolicy("f.a", policy.Scope{Org: "f"}, "a"))
	if r := alive.next(); !slices.Equal(names(r), []string{"f.a"}) {
		t.Fatalf("health-checked stream got %v", names(r))
	}
	hc, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).HealthCheck(context.Background(), &discoveryv1.HealthCheckRequest{ClientAddress: "nobody"})
	if err != nil || hc.GetNodeId() != n.ID() || hc.GetLeaderId() != n.ID() {
		t.Fatalf("HealthCheck of an unknown client = %v, %v; want node and leader IDs", hc, err)
	}
}

// TestDiscoveryClientsAndRolloutAcrossNodes: /v1/clients and /v1/rollout on
// any node merge every node's streams.
func TestDiscoveryClientsAndRolloutAcrossNodes(t *testing.T) {
	c := newCluster(t, 3, nil)
	org := policy.Scope{Org: "ro"}
	lapi := apiFor(t, c.leader())
	var streams []*dstream
	for i, n := range c.running() {
		streams = append(streams, openStream(t, dialGRPC(t, n.GRPCAddr()), fmt.Sprintf("c-ro-%d", i), org))
	}
	for _, s := range streams {
		s.ack(s.next())
	}
	lapi.put("/v1/policies/ro.a", scopedPolicy("ro.a", org, "a"))
	c.waitConverged()
	want := versionOf(t, c.leader(), org)
	// Nobody has answered the new version yet... then everybody does.
	for _, s := range streams {
		s.untilVersion(want)
	}
	ro := apiFor(t, c.follower()).proxyStatus("?wait=10s")
	if !ro.Done || len(ro.Unreachable) != 0 {
		t.Fatalf("rollout = %+v, want done with every node reachable", ro)
	}
	i := slices.IndexFunc(ro.Versions, func(v proxystatus.Version) bool { return v.Version == want })
	if i < 0 || len(ro.Versions[i].Acked) != 3 || len(ro.Versions[i].Pending) != 0 {
		t.Fatalf("rollout of %.8s = %+v, want 3 acked", want, ro)
	}
	cl := apiFor(t, c.follower()).clients()
	var nodes []string
	for _, x := range cl.Clients {
		if x.Org == "ro" {
			nodes = append(nodes, x.Node)
			if x.Transport != "grpc" || x.State != "acked" || x.Version != want || x.LastActive.IsZero() {
				t.Errorf("client %+v: want grpc, acked, version %.8s, a last health check time", x, want)
			}
		}
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"node1", "node2", "node3"}) {
		t.Fatalf("/v1/clients lists streams on %v, want one on each node", nodes)
	}
	// Every node counts its own streams, pushes and ACKs.
	for _, n := range c.running() {
		body := string(apiFor(t, n).do(http.MethodGet, "/metrics", nil, nil).body)
		for _, want := range []string{
			fmt.Sprintf(`policyd_discovery_streams{node=%q,scope="ro//"} 1`, n.ID()),
			fmt.Sprintf(`policyd_discovery_pushes_total{node=%q} `, n.ID()),
			fmt.Sprintf(`policyd_discovery_push_latency_seconds_count{node=%q} `, n.ID()),
			fmt.Sprintf(`policyd_discovery_acks_total{node=%q} `, n.ID()),
		} {
			if !strings.Contains(body, want) {
				t.Errorf("%s /metrics lacks %q", n.ID(), want)
			}
		}
		if strings.Contains(body, fmt.Sprintf(`policyd_discovery_acks_total{node=%q} 0`, n.ID())) {
			t.Errorf("%s counted no ACKs", n.ID())
		}
	}
	if r := lapi.do(http.MethodGet, "/v1/rollout?wait=forever", nil, nil); r.status != http.StatusBadRequest {
		t.Fatalf("rollout?wait=forever: %d, want 400", r.status)
	}
}

// TestDiscoveryHealthAndReflection: grpc.health.v1 and server reflection
// answer on the gRPC listener (what grpcurl uses).
func TestDiscoveryHealthAndReflection(t *testing.T) {
	n, _ := singleNode(t, nil)
	cc := dialGRPC(t, n.GRPCAddr())
	h, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check = %v, %v", h, err)
	}
	rs, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = rs.CloseSend()
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	if !slices.Contains(services, "policyd.discovery.v1.PolicyDiscoveryService") {
		t.Fatalf("reflection lists %v", services)
	}
}

// TestDiscoveryBadInput: hostile or broken clients get a clear error and
// cost the node nothing lasting.
func TestDiscoveryBadInput(t *testing.T) {
	n, a := singleNode(t, func(cfg *config.Config) { cfg.Discovery.SendTimeout = 500 * time.Millisecond })
	cc := dialGRPC(t, n.GRPCAddr())
	org := policy.Scope{Org: "bad"}

	cases := []struct {
		name string
		req  *discoveryv1.PolicyDiscoveryRequest
		code codes.Code
	}{
		{"no client address", &discoveryv1.PolicyDiscoveryRequest{}, codes.InvalidArgument},
		{"garbage version_info", &discoveryv1.PolicyDiscoveryRequest{ClientAddress: "x", VersionInfo: strings.Repeat("\x01zz", 1000)}, codes.InvalidArgument},
		{"team without org", &discoveryv1.PolicyDiscoveryRequest{ClientAddress: "x", Scope: &discoveryv1.Scope{Team: "t"}}, codes.InvalidArgument},
		{"oversized message", &discoveryv1.PolicyDiscoveryRequest{ClientAddress: "x", ErrorDetail: &discoveryv1.ErrorDetail{Message: strings.Repeat("m", 5<<20)}}, codes.ResourceExhausted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).StreamPolicies(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			_ = s.Send(tc.req)
			_, err = s.Recv()
			if status.Code(err) != tc.code {
				t.Fatalf("Recv = %v, want %v", err, tc.code)
			}
		})
	}

	t.Run("a stale version with a random nonce gets the snapshot", func(t *testing.T) {
		s := openStream(t, cc, "c-garbage", org, withVersion("not-a-version"), withNonce("zzz"))
		if r := s.next(); r.GetUnchanged() {
			t.Fatal("a version the node never served was answered unchanged")
		}
	})

	t.Run("a 1 MiB NACK message is kept truncated", func(t *testing.T) {
		s := openStream(t, cc, "c-bignack", org)
		r := s.next()
		s.send("", r.GetNonce(), &discoveryv1.ErrorDetail{Message: strings.Repeat("é", 1<<19)})
		poll.Eventually(t, "the NACK to be recorded", func() error {
			for _, cl := range a.clients().Clients {
				if cl.ClientAddress == "c-bignack" && cl.State == "nacked" {
					if len(cl.NackMessage) > 1100 || !strings.HasPrefix(cl.NackMessage, "éé") {
						t.Fatalf("NACK message kept as %d bytes", len(cl.NackMessage))
					}
					return nil
				}
			}
			return fmt.Errorf("not nacked yet")
		}, poll.Within(5*time.Second))

	})

	t.Run("a client that never reads is dropped without delaying others", func(t *testing.T) {
		big := policy.Scope{Org: "big"}
		stuck, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).StreamPolicies(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := stuck.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "c-stuck", Scope: &discoveryv1.Scope{Org: "big"}}); err != nil {
			t.Fatal(err)
		}
		reader := openStream(t, cc, "c-reader", big)
		reader.ack(reader.next())
		// Each write grows the set by ~200 KB; the stuck client's flow-control
		// window fills after the first push or two.
		pad := strings.Repeat("p", 200<<10)
		for i := range 6 {
			name := fmt.Sprintf("big.p%d", i)
			a.put("/v1/policies/"+name, scopedPolicy(name, big, pad))
			want := versionOf(t, n, big)
			if k := reader.untilVersion(want); k != 1 {
				t.Fatalf("reader needed %d responses for write %d", k, i)
			}
		}
		poll.Eventually(t, "the stuck stream to be dropped", func() error {
			for _, cl := range a.clients().Clients {
				if cl.ClientAddress == "c-stuck" {
					return fmt.Errorf("c-stuck still connected")
				}
			}
			return nil
		}, poll.Within(10*time.Second))

	})

	t.Run("1000 connects and disconnects leave nothing behind", func(t *testing.T) {
		baseline := runtime.NumGoroutine()
		for i := range 1000 {
			ctx, cancel := context.WithCancel(context.Background())
			s, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).StreamPolicies(ctx)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			_ = s.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: fmt.Sprintf("churn-%d", i), Scope: &discoveryv1.Scope{Org: "churn"}})
			if i%2 == 0 {
				_, _ = s.Recv()
			}
			cancel()
		}
		poll.Eventually(t, "churned streams to be gone", func() error {
			for _, cl := range a.clients().Clients {
				if strings.HasPrefix(cl.ClientAddress, "churn-") {
					return fmt.Errorf("%s still listed", cl.ClientAddress)
				}
			}
			if g := runtime.NumGoroutine(); g > baseline+20 {
				return fmt.Errorf("%d goroutines, baseline %d", g, baseline)
			}
			return nil
		}, poll.Within(10*time.Second))

	})
}

// TestDiscoveryTeammatesShareSnapshot: employees that no policy names get
// their team's set, and a push encodes it once for all of them (one nonce);
// a policy that names one of them gives that one a set of its own, and only
// that one. When that policy goes, its set is the team's again and it is
// sent the snapshot its teammates hold, not a copy.
func TestDiscoveryTeammatesShareSnapshot(t *testing.T) {
	n, a := singleNode(t, nil)
	cc := dialGRPC(t, n.GRPCAddr())
	sec := policy.Scope{Org: "acme", Team: "sec"}
	carol := policy.Identity{Org: "acme", Team: "sec", Employee: "carol"}
	dave := policy.Identity{Org: "acme", Team: "sec", Employee: "dave"}
	a.put("/v1/policies/team", scopedPolicy("team", sec, "1"))
	streams := map[string]*dstream{"carol": openStream(t, cc, "c-carol", carol), "dave": openStream(t, cc, "c-dave", dave)}
	ids := map[string]policy.Identity{"carol": carol, "dave": dave}
	// last is what each stream holds; a stream whose set a step leaves
	// as it was is sent nothing.
	last := map[string]*discoveryv1.PolicyDiscoveryResponse{}
	catchUp := func() {
		t.Helper()
		for name, s := range streams {
			want := versionOf(t, n, ids[name])
			for last[name] == nil || last[name].GetVersionInfo() != want {
				last[name] = s.next()
				s.ack(last[name])
			}
		}
	}
	catchUp()
	steps := []struct {
		name       string
		path, body string // a PUT, or a DELETE when body is ""
		want       map[string][]string
		sameNonce  bool
	}{
		{"team policy changes", "/v1/policies/team", string(scopedPolicy("team", sec, "2")),
			map[string][]string{"carol": {"team"}, "dave": {"team"}}, true},
		{"a policy names carol", "/v1/policies/own", string(scopedPolicy("own", carol, "x")),
			map[string][]string{"carol": {"own", "team"}, "dave": {"team"}}, false},
		{"team policy changes again", "/v1/policies/team", string(scopedPolicy("team", sec, "3")),
			map[string][]string{"carol": {"own", "team"}, "dave": {"team"}}, false},
		{"carol's policy goes", "/v1/policies/own", "",
			map[string][]string{"carol": {"team"}, "dave": {"team"}}, true},
		{"shared again", "/v1/policies/team", string(scopedPolicy("team", sec, "4")),
			map[string][]string{"carol": {"team"}, "dave": {"team"}}, true},
	}
	for _, step := range steps {
		if step.body == "" {
			a.del(step.path)
		} else {
			a.put(step.path, []byte(step.body))
		}
		catchUp()
		for name := range streams {
			if g := names(last[name]); !slices.Equal(g, step.want[name]) {
				t.Errorf("%s: %s holds %v, want %v", step.name, name, g, step.want[name])
			}
		}
		if same := last["carol"].GetNonce() == last["dave"].GetNonce(); same != step.sameNonce {
			t.Errorf("%s: nonces %q and %q, shared = %v, want %v", step.name, last["carol"].GetNonce(), last["dave"].GetNonce(), same, step.sameNonce)
		}
	}
}

// TestDiscoveryNoFlowControlPings: the node's gRPC server has fixed
// flow-control windows, so a sidecar's ACKs, data the node receives, cost
// no bandwidth-probing PING from the node (grpc-go's dynamic windows send
// one per burst of data received: a write on each side per change).
func TestDiscoveryNoFlowControlPings(t *testing.T) {
	n, a := singleNode(t, nil)
	var rec servertest.H2Recorder
	// The client's windows are fixed too, so that its own PINGs do not
	// hide the node's in the exchange.
	cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(rec.Dial), grpc.WithStaticStreamWindowSize(1<<20), grpc.WithStaticConnWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	s := openStream(t, cc, "c-pings", policy.Scope{})
	s.ack(s.next())
	for i := range 3 {
		a.put("/v1/policies/g.a", scopedPolicy("g.a", policy.Scope{}, fmt.Sprint("v", i)))
		s.ack(s.next())
	}
	// The node writes a PING that an ACK causes before it answers a later
	// request: once this answer is in, every such PING has been read.
	ctx, cancel := context.WithTimeout(context.Background(), recvTimeout)
	defer cancel()
	if _, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).HealthCheck(ctx, &discoveryv1.HealthCheckRequest{ClientAddress: "c-pings"}); err != nil {
		t.Fatalf("health check: %v", err)
	}
	if got := rec.Pings(t); got != 0 {
		t.Fatalf("the node sent %d PING frames for 4 ACKs, want 0", got)
	}
}
