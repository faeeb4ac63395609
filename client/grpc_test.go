package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// fakeDiscovery is a minimal PolicyDiscoveryService: it sends the full set
// (or unchanged) on a stream's first request, pushes every change, and
// records every request, health check and authorization header.
type fakeDiscovery struct {
	discoveryv1.UnimplementedPolicyDiscoveryServiceServer

	mu       sync.Mutex
	version  string
	policies []*discoveryv1.Policy
	nonce    int
	requests []*discoveryv1.PolicyDiscoveryRequest
	health   []string // client addresses
	auth     []string // authorization metadata of streams and health checks
	streams  map[*fakeStream]struct{}
	opened   int
	// refuse, when set, ends every new stream with this code (refuseN
	// times, or forever when refuseN is 0).
	refuse  codes.Code
	refuseN int
	// refuseReason, when set, rides on the refusals as an ErrorInfo of
	// policyd's domain.
	refuseReason string
	// healthCode, when set, fails every health check with this code.
	healthCode codes.Code
	// batches are the decision batches taken, in order; decisionCalls
	// counts every ReportDecisions, taken or not, and decisionAuth their
	// authorization metadata. decisionsCode, when set, refuses them
	// with this code.
	batches       []*discoveryv1.DecisionBatch
	decisionCalls int
	decisionAuth  []string
	decisionsCode codes.Code
}

type fakeStream struct {
	push chan struct{}
	end  chan error
}

func newFakeDiscovery(version string, policies ...Policy) *fakeDiscovery {
	f := &fakeDiscovery{streams: map[*fakeStream]struct{}{}}
	f.set(version, policies...)
	return f
}

func toProto(p Policy) *discoveryv1.Policy {
	return &discoveryv1.Policy{Name: p.Name, Kind: p.Kind, Spec: p.Spec, Revision: p.Revision, Labels: p.Labels,
		Scope: &discoveryv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee}}
}

// set changes the set without pushing it.
func (f *fakeDiscovery) set(version string, policies ...Policy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version = version
	f.policies = nil
	for _, p := range policies {
		f.policies = append(f.policies, toProto(p))
	}
}

// publish changes the set and pushes it to every stream.
func (f *fakeDiscovery) publish(version string, policies ...Policy) {
	f.set(version, policies...)
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		select {
		case s.push <- struct{}{}:
		default:
		}
	}
}

// endStreams ends every open stream with err.
func (f *fakeDiscovery) endStreams(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		select {
		case s.end <- err:
		default:
		}
	}
}

func (f *fakeDiscovery) reqs() []*discoveryv1.PolicyDiscoveryRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*discoveryv1.PolicyDiscoveryRequest(nil), f.requests...)
}

func (f *fakeDiscovery) counts() (opened, health int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opened, len(f.health)
}

func (f *fakeDiscovery) response(unchanged bool) *discoveryv1.PolicyDiscoveryResponse {
	f.nonce++
	r := &discoveryv1.PolicyDiscoveryResponse{VersionInfo: f.version, Nonce: "n" + strconv.Itoa(f.nonce), Unchanged: unchanged}
	if !unchanged {
		r.Policies = f.policies
	}
	return r
}

func (f *fakeDiscovery) StreamPolicies(stream grpc.BidiStreamingServer[discoveryv1.PolicyDiscoveryRequest, discoveryv1.PolicyDiscoveryResponse]) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	s := &fakeStream{push: make(chan struct{}, 1), end: make(chan error, 1)}
	f.mu.Lock()
	f.auth = append(f.auth, strings.Join(md.Get("authorization"), ","))
	f.opened++
	if f.refuse != codes.OK && (f.refuseN == 0 || f.opened <= f.refuseN) {
		reason := f.refuseReason
		f.mu.Unlock()
		if reason != "" {
			st, err := status.New(f.refuse, `employee "alice": unknown employee`).WithDetails(
				&errdetails.ErrorInfo{Domain: discoveryv1.ErrorDomain, Reason: reason})
			if err != nil {
				return err
			}
			return st.Err()
		}
		return status.Error(f.refuse, "employee alice is not active")
	}
	f.streams[s] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.streams, s)
		f.mu.Unlock()
	}()

	reqs := make(chan *discoveryv1.PolicyDiscoveryRequest)
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case reqs <- r:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	for {
		var resp *discoveryv1.PolicyDiscoveryResponse
		select {
		case r := <-reqs:
			f.mu.Lock()
			f.requests = append(f.requests, r)
			if r.GetResponseNonce() == "" {
				resp = f.response(r.GetVersionInfo() == f.version)
			}
			f.mu.Unlock()
		case <-s.push:
			f.mu.Lock()
			resp = f.response(false)
			f.mu.Unlock()
		case err := <-s.end:
			return err
		case err := <-errc:
			return err
		case <-stream.Context().Done():
			return nil
		}
		if resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

func (f *fakeDiscovery) HealthCheck(ctx context.Context, req *discoveryv1.HealthCheckRequest) (*discoveryv1.HealthCheckResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.auth = append(f.auth, strings.Join(md.Get("authorization"), ","))
	f.health = append(f.health, req.GetClientAddress())
	if f.healthCode != codes.OK {
		return nil, status.Error(f.healthCode, "unhealthy")
	}
	return &discoveryv1.HealthCheckResponse{NodeId: "fake"}, nil
}

// ReportDecisions takes every batch, unless decisionsCode refuses it.
func (f *fakeDiscovery) ReportDecisions(ctx context.Context, b *discoveryv1.DecisionBatch) (*discoveryv1.DecisionBatchResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decisionCalls++
	f.decisionAuth = append(f.decisionAuth, strings.Join(md.Get("authorization"), ","))
	if f.decisionsCode != codes.OK {
		return nil, status.Error(f.decisionsCode, "not now")
	}
	f.batches = append(f.batches, b)
	return &discoveryv1.DecisionBatchResponse{Accepted: uint32(len(b.GetRecords()))}, nil
}

// decisionState is what ReportDecisions saw so far.
func (f *fakeDiscovery) decisionState() (batches []*discoveryv1.DecisionBatch, calls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*discoveryv1.DecisionBatch(nil), f.batches...), f.decisionCalls
}

// refuseDecisions makes ReportDecisions answer code (codes.OK: take them).
func (f *fakeDiscovery) refuseDecisions(code codes.Code) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decisionsCode = code
}

// grpcNode serves a fakeDiscovery on a loopback port.
type grpcNode struct {
	addr string
	srv  *grpc.Server
}

func serveDiscovery(t testing.TB, f *fakeDiscovery, addr string) *grpcNode {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return serveDiscoveryOn(t, f, ln)
}

// serveDiscoveryOn serves f on ln until the test ends.
func serveDiscoveryOn(t testing.TB, f *fakeDiscovery, ln net.Listener) *grpcNode {
	t.Helper()
	s := grpc.NewServer()
	discoveryv1.RegisterPolicyDiscoveryServiceServer(s, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	n := &grpcNode{addr: ln.Addr().String(), srv: s}
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return n
}

// stop ends the node the way a shutdown does: listener closed, streams
// ended.
func (n *grpcNode) stop() { n.srv.Stop() }

var cmpProto = cmp.Comparer(proto.Equal)

// TestGRPCAckNackAndLastGoodVersion: an accepted set is ACKed with its
// version and nonce; a set the Apply hook refuses is NACKed with the hook's
// error and the last good version, and the previous set stays in force;
// every request carries client_address and scope.
func TestGRPCAckNackAndLastGoodVersion(t *testing.T) {
	f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "from v1"))
	n := serveDiscovery(t, f, "")
	scope := Scope{Org: "acme", Team: "red", Employee: "alice"}
	c := runClient(t, Config{
		Servers: []string{n.addr}, ClientAddress: "sidecar-1", Scope: scope,
		Apply: func(set []Policy) error {
			for _, p := range set {
				if strings.HasPrefix(p.Name, "bad") {
					return fmt.Errorf("cannot load %s", p.Name)
				}
			}
			return nil
		},
	})
	c.waitState(t, StateReady)
	waitForRequests := func(n int) []*discoveryv1.PolicyDiscoveryRequest {
		t.Helper()
		var reqs []*discoveryv1.PolicyDiscoveryRequest
		poll.Eventually(t, fmt.Sprintf("%d requests", n), func() error {
			if reqs = f.reqs(); len(reqs) < n {
				return fmt.Errorf("%d requests", len(reqs))
			}
			return nil
		})

		return reqs
	}
	f.publish("v2", tp("a", "Bash", "deny", "from v2"), tp("bad-one", "Write", "deny", ""))
	waitForRequests(3)
	f.publish("v3", tp("a", "Bash", "deny", "from v3"), tp("b", "Bash", "deny", "", "a(b"))
	waitForRequests(4)
	f.publish("v4", tp("a", "Bash", "deny", "from v4"))
	reqs := waitForRequests(5)

	ps := &discoveryv1.Scope{Org: "acme", Team: "red", Employee: "alice"}
	want := []*discoveryv1.PolicyDiscoveryRequest{
		{ClientAddress: "sidecar-1", Scope: ps, Capabilities: []string{"rollouts", "shadow"}}, // the first request only
		{ClientAddress: "sidecar-1", Scope: ps, VersionInfo: "v1", ResponseNonce: "n1"},
		{ClientAddress: "sidecar-1", Scope: ps, VersionInfo: "v1", ResponseNonce: "n2", ErrorDetail: &discoveryv1.ErrorDetail{Message: "apply hook: cannot load bad-one"}},
		{ClientAddress: "sidecar-1", Scope: ps, VersionInfo: "v1", ResponseNonce: "n3"}, // error checked below
		{ClientAddress: "sidecar-1", Scope: ps, VersionInfo: "v4", ResponseNonce: "n4"},
	}
	if msg := reqs[3].GetErrorDetail().GetMessage(); !strings.Contains(msg, "policy b: spec.conditions.patterns[0]") {
		t.Errorf("NACK of a bad pattern: %q", msg)
	}
	reqs[3].ErrorDetail = nil
	if diff := cmp.Diff(want, reqs, cmpProto); diff != "" {
		t.Fatalf("requests (-want +got):\n%s", diff)
	}
	if got, want := c.Version(), "v4"; got != want {
		t.Fatalf("version %q, want %q", got, want)
	}
	if reason, _ := c.IsBlocked("Bash", nil); reason != "from v4" {
		t.Fatalf("reason %q: v4 not in force", reason)
	}
	var versions []string
	for _, u := range c.rec.allUpdates() {
		versions = append(versions, u.Version)
	}
	if diff := cmp.Diff([]string{"v1", "v4"}, versions); diff != "" {
		t.Fatalf("OnUpdate versions (-want +got):\n%s", diff)
	}
	if got := c.Stats().Rejected; got != 2 {
		t.Fatalf("rejected = %d, want 2", got)
	}
}

// TestGRPCNackOfFirstSetStaysConnecting: with nothing accepted yet, a
// rejected first set leaves the client connecting (block all) with an empty
// last good version, and the next pushed set makes it ready.
func TestGRPCNackOfFirstSetStaysConnecting(t *testing.T) {
	f := newFakeDiscovery("v1", tp("bad", "Bash", "deny", "", "("))
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}})
	poll.Eventually(t, "the NACK", func() error {
		if r := f.reqs(); len(r) < 2 {
			return fmt.Errorf("%d requests", len(r))
		}
		return nil
	})

	nack := f.reqs()[1]
	if nack.GetVersionInfo() != "" || nack.GetErrorDetail() == nil || nack.GetResponseNonce() != "n1" {
		t.Fatalf("NACK = %v", nack)
	}
	if c.State() != StateConnecting || !c.ShouldBlockAll() {
		t.Fatalf("state %s after a rejected first set", c.State())
	}
	f.publish("v2", tp("good", "Bash", "deny", "ok"))
	c.waitState(t, StateReady)
}

// TestGRPCFailoverCarriesVersion: when the node the client streams from
// stops, it fails over to the next one, whose first request carries the
// version it holds; that node answers unchanged, which is ACKed, and no new
// set is applied.
func TestGRPCFailoverCarriesVersion(t *testing.T) {
	set := []Policy{tp("a", "Bash", "deny", "cached")}
	fa, fb := newFakeDiscovery("v1", set...), newFakeDiscovery("v1", set...)
	na, nb := serveDiscovery(t, fa, ""), serveDiscovery(t, fb, "")
	c := runClient(t, Config{Servers: []string{na.addr, nb.addr}, ClientAddress: "sc"})
	c.waitState(t, StateReady)
	if got := c.Stats().Server; got != na.addr {
		t.Fatalf("connected to %s, want the first server %s", got, na.addr)
	}
	na.stop()
	poll.Eventually(t, "the ACK on the second node", func() error {
		if r := fb.reqs(); len(r) < 2 {
			return fmt.Errorf("%d requests", len(r))
		}
		return nil
	})

	want := []*discoveryv1.PolicyDiscoveryRequest{
		{ClientAddress: "sc", VersionInfo: "v1", Scope: &discoveryv1.Scope{}, Capabilities: []string{"rollouts", "shadow"}},
		{ClientAddress: "sc", VersionInfo: "v1", ResponseNonce: "n1", Scope: &discoveryv1.Scope{}},
	}
	if diff := cmp.Diff(want, fb.reqs(), cmpProto); diff != "" {
		t.Fatalf("requests to the second node (-want +got):\n%s", diff)
	}
	c.waitTransitions(t, "connecting->ready", "ready->disconnected", "disconnected->ready")
	st := c.Stats()
	if st.FullSyncs != 1 || st.Unchanged != 1 || st.Connects != 2 || st.Server != nb.addr {
		t.Fatalf("stats %+v: want one full sync, one unchanged, two connects, on %s", st, nb.addr)
	}
	if got := len(c.rec.allUpdates()); got != 1 {
		t.Fatalf("%d updates, want 1 (unchanged applies nothing)", got)
	}
}

// TestGRPCStreamEndReconnects: a stream ended with Unavailable,
// DeadlineExceeded (inactivity flush) or ResourceExhausted is reconnected.
func TestGRPCStreamEndReconnects(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted} {
		t.Run(code.String(), func(t *testing.T) {
			f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "x"))
			n := serveDiscovery(t, f, "")
			c := runClient(t, Config{Servers: []string{n.addr}})
			c.waitState(t, StateReady)
			f.endStreams(status.Error(code, "bye"))
			poll.Eventually(t, "a second stream", func() error {
				if opened, _ := f.counts(); opened < 2 {
					return errors.New("not reconnected")
				}
				return nil
			})

			c.waitTransitions(t, "connecting->ready", "ready->disconnected", "disconnected->ready")
		})
	}
}

// TestGRPCRevocation: PermissionDenied or Unauthenticated revokes: block
// all at once, Run returns ErrRevoked, no reconnect.
func TestGRPCRevocation(t *testing.T) {
	for _, code := range []codes.Code{codes.PermissionDenied, codes.Unauthenticated} {
		t.Run(code.String(), func(t *testing.T) {
			f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "x"))
			n := serveDiscovery(t, f, "")
			c := runClient(t, Config{Servers: []string{n.addr}})
			c.waitState(t, StateReady)
			f.endStreams(status.Error(code, "employee alice deactivated"))
			mustRevoked(t, c.wait(t), "employee alice deactivated")
			if c.State() != StateRevoked || !c.ShouldBlockAll() {
				t.Fatalf("state %s, block all %v", c.State(), c.ShouldBlockAll())
			}
			if reason, blocked := c.IsBlocked("Read", nil); !blocked || !strings.Contains(reason, "revoked") {
				t.Fatalf("IsBlocked = (%q, %v)", reason, blocked)
			}
			if opened, _ := f.counts(); opened != 1 {
				t.Fatalf("%d streams opened: reconnected after revocation", opened)
			}
			if diff := cmp.Diff([]string{"connecting->ready", "ready->revoked"}, c.rec.transitions()); diff != "" {
				t.Fatalf("transitions (-want +got):\n%s", diff)
			}
			if err := c.WaitReady(t.Context()); err != nil {
				t.Fatalf("WaitReady after an earlier ready: %v", err)
			}
		})
	}
}

// TestGRPCRetryUnauthorized: with RetryUnauthorized, a refusal at connect is
// retried, and the client gets ready once the server accepts it.
func TestGRPCRetryUnauthorized(t *testing.T) {
	f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "x"))
	f.refuse, f.refuseN = codes.PermissionDenied, 3
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, RetryUnauthorized: true})
	if err := c.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if opened, _ := f.counts(); opened != 4 {
		t.Fatalf("%d streams, want 3 refused and 1 accepted", opened)
	}
}

// TestGRPCRefusedAtConnectRevokes: without RetryUnauthorized a refusal on
// the very first stream revokes from connecting.
func TestGRPCRefusedAtConnectRevokes(t *testing.T) {
	f := newFakeDiscovery("v1")
	f.refuse = codes.Unauthenticated
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}})
	mustRevoked(t, c.wait(t), "not active")
	if err := c.WaitReady(t.Context()); !errors.Is(err, ErrRevoked) {
		t.Fatalf("WaitReady = %v", err)
	}
}

// TestGRPCHealthChecksAndToken: health checks go to the streaming node every
// HealthInterval with the client address, and the token is sent on the
// stream and on health checks.
func TestGRPCHealthChecksAndToken(t *testing.T) {
	f := newFakeDiscovery("v1")
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sc-7", Token: "jwt-abc", HealthInterval: 10 * time.Millisecond})
	c.waitState(t, StateReady)
	poll.Eventually(t, "three health checks", func() error {
		if _, h := f.counts(); h < 3 {
			return fmt.Errorf("%d health checks", h)
		}
		return nil
	})

	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.health {
		if a != "sc-7" {
			t.Fatalf("health check for %q", a)
		}
	}
	for _, a := range f.auth {
		if a != "Bearer jwt-abc" {
			t.Fatalf("authorization %q", a)
		}
	}
}

// TestGRPCFailingHealthChecksReconnect: a node that keeps failing health
// checks with Unavailable is given up and the stream reopened.
func TestGRPCFailingHealthChecksReconnect(t *testing.T) {
	f := newFakeDiscovery("v1")
	f.healthCode = codes.Unavailable
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, HealthInterval: 10 * time.Millisecond})
	c.waitState(t, StateReady)
	poll.Eventually(t, "a new stream", func() error {
		if opened, _ := f.counts(); opened < 2 {
			return errors.New("still on the first stream")
		}
		return nil
	})

	if got := c.rec.transitions(); len(got) < 2 || got[1] != "ready->disconnected" {
		t.Fatalf("transitions %v", got)
	}
}

// TestGRPCTokenSourcePerConnect: the token source is asked on every
// connection attempt.
func TestGRPCTokenSourcePerConnect(t *testing.T) {
	f := newFakeDiscovery("v1")
	n := serveDiscovery(t, f, "")
	var mu sync.Mutex
	calls := 0
	c := runClient(t, Config{Servers: []string{n.addr}, TokenSource: func(context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return "tok-" + strconv.Itoa(calls), nil
	}})
	c.waitState(t, StateReady)
	f.endStreams(status.Error(codes.Unavailable, "bye"))
	poll.Eventually(t, "a second stream", func() error {
		if opened, _ := f.counts(); opened < 2 {
			return errors.New("not yet")
		}
		return nil
	})

	f.mu.Lock()
	defer f.mu.Unlock()
	if diff := cmp.Diff([]string{"Bearer tok-1", "Bearer tok-2"}, f.auth[:2]); diff != "" {
		t.Fatalf("tokens (-want +got):\n%s", diff)
	}
}

// TestGRPCSameVersionResentIsNotReapplied: a full response for the version
// already held is ACKed without calling Apply or OnUpdate again.
func TestGRPCSameVersionResentIsNotReapplied(t *testing.T) {
	set := []Policy{tp("a", "Bash", "deny", "x")}
	f := newFakeDiscovery("v1", set...)
	n := serveDiscovery(t, f, "")
	var mu sync.Mutex
	applied := 0
	c := runClient(t, Config{Servers: []string{n.addr}, Apply: func([]Policy) error {
		mu.Lock()
		defer mu.Unlock()
		applied++
		return nil
	}})
	c.waitState(t, StateReady)
	f.publish("v1", set...)
	poll.Eventually(t, "the ACK of the resent set", func() error {
		if r := f.reqs(); len(r) < 3 {
			return fmt.Errorf("%d requests", len(r))
		}
		return nil
	})

	if ack := f.reqs()[2]; ack.GetVersionInfo() != "v1" || ack.GetResponseNonce() != "n2" || ack.GetErrorDetail() != nil {
		t.Fatalf("answer to the resent set: %v", ack)
	}
	mu.Lock()
	defer mu.Unlock()
	if applied != 1 || len(c.rec.allUpdates()) != 1 {
		t.Fatalf("applied %d times, %d updates: want 1 and 1", applied, len(c.rec.allUpdates()))
	}
	if st := c.Stats(); st.FullSyncs != 2 {
		t.Fatalf("full syncs %d, want 2", st.FullSyncs)
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// TestGRPCSharedConn: clients given one GRPCConn open their streams and
// health checks on it (the node accepts one connection), reopen an ended
// stream on it, and leave it open when Run returns.
func TestGRPCSharedConn(t *testing.T) {
	f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "x"))
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	n := serveDiscoveryOn(t, f, ln)
	cc, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })

	var clients []*running
	for i := range 3 {
		c := runClient(t, Config{GRPCConn: cc, ClientAddress: "sc-" + strconv.Itoa(i), HealthInterval: 10 * time.Millisecond})
		c.waitState(t, StateReady)
		clients = append(clients, c)
	}
	if got := clients[0].Stats().Server; got != cc.Target() {
		t.Fatalf("Stats().Server = %q, want the connection's target %q", got, cc.Target())
	}
	f.publish("v2", tp("a", "Bash", "deny", "y"))
	f.endStreams(status.Error(codes.Unavailable, "bye"))
	for _, c := range clients {
		poll.Eventually(t, "v2 and a reopened stream", func() error {
			if v := c.Version(); v != "v2" {
				return fmt.Errorf("version %q", v)
			}
			if st := c.Stats(); st.Connects < 2 {
				return fmt.Errorf("%d connects", st.Connects)
			}
			return nil
		})

	}
	poll.Eventually(t, "health checks", func() error {
		if _, h := f.counts(); h < 3 {
			return fmt.Errorf("%d health checks", h)
		}
		return nil
	})

	if got := ln.accepted.Load(); got != 1 {
		t.Fatalf("the node accepted %d connections, want 1 shared by every client", got)
	}

	clients[0].cancel()
	if err := clients[0].wait(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	late := runClient(t, Config{GRPCConn: cc, ClientAddress: "sc-late"})
	late.waitState(t, StateReady)
	if s := cc.GetState(); s == connectivity.Shutdown {
		t.Fatal("the shared connection was closed when a client's Run returned")
	}
}

// TestGRPCNoFlowControlPings: the SDK's own connections have fixed
// flow-control windows, so receiving a response sends the node no
// bandwidth-probing PING (grpc-go's dynamic windows send one per burst of
// data received: a write on each side per change).
func TestGRPCNoFlowControlPings(t *testing.T) {
	f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "from v1"))
	var rec servertest.H2Recorder
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := serveDiscoveryOn(t, f, rec.Listener(inner))
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1"})
	c.waitState(t, StateReady)
	for i := 2; i <= 4; i++ {
		v := "v" + strconv.Itoa(i)
		f.publish(v, tp("a", "Bash", "deny", "from "+v))
		// The ACK follows any PING the response caused on the wire, so
		// once the node has it, the PING has been read too.
		poll.Eventually(t, "the ACK of "+v, func() error {
			if reqs := f.reqs(); len(reqs) < i+1 || reqs[i].GetVersionInfo() != v {
				return fmt.Errorf("%d requests", len(reqs))
			}
			return nil
		})

	}
	if got := rec.Pings(t); got != 0 {
		t.Fatalf("the client sent %d PING frames for 4 responses, want 0", got)
	}
}

// TestGRPCDeclaresCapabilities: every stream's first request declares
// "rollouts", so that the server may serve a rollout's candidate, and
// "shadow", since Evaluate keeps shadow policies apart.
func TestGRPCDeclaresCapabilities(t *testing.T) {
	f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "x"))
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1"})
	c.waitState(t, StateReady)
	reqs := f.reqs()
	if got, want := reqs[0].GetCapabilities(), []string{"rollouts", "shadow"}; !slices.Equal(got, want) {
		t.Errorf("first request capabilities %v, want %v", got, want)
	}
}
