package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/server/proxystatus"
)

// Limits on what a request may carry. gRPC's max receive size bounds the
// message; these bound what is kept per stream.
const (
	maxClientAddress = 256
	maxVersionInfo   = 256
	// maxNackMessage is how much of a NACK's error text is kept and shown.
	maxNackMessage = 1024
	// sentNonces is how many nonces a stream remembers to tell a superseded
	// nonce from an unknown one. An ACK older than that is answered as
	// unknown, which costs one extra response, never a loop.
	sentNonces = 16
)

// response is what a stream's writer sends next.
type response struct {
	snap      *snapshot
	unchanged bool
	// push marks a response caused by a committed change (its latency is
	// measured), as opposed to an answer to a request.
	push bool
	// at is when that change was committed locally; push latency is
	// measured from it. On the response, not the snapshot: a push may
	// send a snapshot that a new scope's stream had encoded before it.
	at time.Time
	// rollouts tags the snapshot's candidates (policyset.Set.Rollouts),
	// recorded for ClientInfo when it is sent. On the response: a
	// snapshot is shared by groups whose sets have one content, and a
	// stage change keeps the content under new tags.
	rollouts []string
}

// caller is who opened a stream: the employee (jwt mode) and its identity.
type caller struct {
	employee string
	identity policy.Identity
}

// stream is one sidecar connection.
type stream struct {
	svc      *Service
	id       uint64
	employee string // from the token; "" with auth.mode none
	// opened is the identity resolved when the stream opened (the
	// employee record's; zero with auth.mode none). Its org and employee
	// are the stream's for life: an org change ends the stream.
	openedAs    policy.Identity
	peerAddr    string
	connectedAt time.Time
	lastActive  atomic.Int64

	// Set by the first request, under svc.mu. scope is written under
	// svc.mu and mu both (a team move changes it, see Service.join), so
	// either lock reads it.
	clientAddr string
	scope      policy.Identity
	// caps: what the client declared in its first request, kept for the
	// stream's life.
	caps policyset.Caps
	// key is the stream's group; written and read under svc.mu only.
	key        groupKey
	registered bool
	ended      bool // the handler has returned; never register again
	// opened: the first request registered the stream. Only the receive
	// goroutine (handle) uses it, so that an ACK, 10,000 of which follow
	// every push on a busy node, does not take svc.mu.
	opened bool
	// stuck ends a send blocked for longer than the send timeout; only
	// the writer uses it, re-armed for each send rather than allocated.
	stuck *time.Timer

	// gs is the stream's gRPC side, set before anything can be offered.
	gs      grpc.ServerStream
	sendErr chan error // a failed send, for the handler
	killed  chan error // the stream must end with this status
	// dead is set by kill: a stream ended for a revocation or an identity
	// change must not send anything more, not even a response queued
	// before the kill, because that could carry another scope's policies.
	dead atomic.Bool

	mu      sync.Mutex
	pending *response
	// writing: a writer goroutine is running (drain). closed: the handler
	// has returned, so nothing may be sent any more.
	writing, closed bool
	sent            []string // nonces sent, oldest first
	latestNonce     string
	versionSent     string
	rollouts        []string // the tags of versionSent's candidates
	state           string
	versionAcked    string
	nackMessage     string
	nackVersion     string
}

// StreamPolicies serves one sidecar. The handler goroutine supervises; one
// goroutine receives and handles requests, and a writer goroutine runs
// only while a response is waiting to be sent (drain), as the feed's write
// tasks do: an idle stream, which is most of them most of the time, costs
// two goroutines and their stacks instead of three. The handler returning
// is what ends the stream (and unblocks the others), so every reason to
// end it — the client leaving, a protocol error, a send stuck on a client
// that does not read, inactivity, revocation, shutdown — arrives here.
func (s *Service) StreamPolicies(gs grpc.BidiStreamingServer[discoveryv1.PolicyDiscoveryRequest, discoveryv1.PolicyDiscoveryResponse]) error {
	ctx := gs.Context()
	// Set-up runs on a goroutine of its own. Verifying the token's
	// signature and reading the store need a deep stack, and a goroutine
	// keeps a stack it grew: the GC halves a stack only while less than a
	// quarter of it is in use, and this handler then waits for the
	// stream's whole life about 3 KiB deep. Run here, set-up left every
	// idle stream with an 8 KiB handler stack instead of 4 KiB (bench
	// idle-memory: 22.4 → 18.6 KiB of stacks per stream with a
	// connection each).
	//
	// The token is verified first, then the replica caught up, and only
	// then is the employee looked up: a sidecar started right after its
	// employee was created, through this node or another, must find the
	// record, not be refused as unknown by a replica a commit behind.
	var who caller
	setUp := make(chan error, 1)
	go func() {
		claims, err := s.verify(ctx)
		if err != nil {
			setUp <- statusOf(err)
			return
		}
		if err := s.caughtUp(ctx); err != nil {
			setUp <- err
			return
		}
		if who, err = s.identify(claims); err != nil {
			setUp <- statusOf(err)
			return
		}
		setUp <- nil
	}()
	if err := <-setUp; err != nil {
		return err
	}
	st := &stream{
		svc:         s,
		id:          s.streamSeq.Add(1),
		employee:    who.employee,
		openedAs:    who.identity,
		connectedAt: s.now(),
		gs:          gs,
		sendErr:     make(chan error, 1),
		killed:      make(chan error, 1),
	}
	st.lastActive.Store(st.connectedAt.UnixNano())
	if p, ok := peer.FromContext(ctx); ok {
		st.peerAddr = p.Addr.String()
	}
	defer s.unregister(st)
	defer st.close()

	recvErr := make(chan error, 1)
	go func() { recvErr <- st.receive(gs) }()

	// A client must send its first request promptly; until then the stream
	// is in no tracker, so the inactivity flush cannot see it.
	first := time.NewTimer(s.cfg.MaxClientInactive)
	defer first.Stop()
	for {
		select {
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				// The client half-closed: it will send no more requests
				// but may still read pushes (grpcurl does this). The
				// stream stays until the client cancels or the
				// inactivity flush ends it.
				recvErr = nil
				continue
			}
			if status.Code(err) == codes.Canceled {
				return nil
			}
			return statusOf(err)
		case err := <-st.sendErr:
			return statusOf(err)
		case err := <-st.killed:
			return err
		case <-ctx.Done():
			return nil
		case <-first.C:
			s.mu.Lock()
			registered := st.registered
			s.mu.Unlock()
			if !registered {
				return status.Errorf(codes.DeadlineExceeded, "no request within %v of opening the stream", s.cfg.MaxClientInactive)
			}
		}
	}
}

// receive handles requests until the stream ends or one is invalid.
func (st *stream) receive(gs grpc.BidiStreamingServer[discoveryv1.PolicyDiscoveryRequest, discoveryv1.PolicyDiscoveryResponse]) error {
	for {
		req, err := gs.Recv()
		if err != nil {
			return err
		}
		if err := st.svc.handle(st, req); err != nil {
			return err
		}
	}
}

// drain is the writer: it sends the pending response until there is none
// or the handler has returned, then ends. At most one runs at a time
// (writing), so sends on the stream never overlap. A failed send leaves
// writing set, so that no other writer starts on a stream that is ending,
// and tells the handler.
func (st *stream) drain() {
	for {
		st.mu.Lock()
		r := st.pending
		st.pending = nil
		if r == nil || st.closed {
			st.writing = false
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()
		if st.dead.Load() {
			continue
		}
		if err := st.send(st.gs, r); err != nil {
			st.sendErr <- err
			return
		}
	}
}

// connHandoff is how often drainConn checks that its sends progress. A
// send blocks only on a client that does not read that stream (its
// flow-control window is full), and takes microseconds otherwise.
const connHandoff = 10 * time.Millisecond

// drainConn runs the writers (drain) of streams that share a client
// connection, each of which the caller has claimed, one after the other.
// A stream that does not read would hold up the others behind it until
// its send timeout, so if a check finds no stream begun since the one
// before (10 to 20 ms without progress), every stream not yet begun gets a
// writer goroutine of its own. The check re-arms while they progress, so a
// node short of CPU keeps them together.
func drainConn(sts []*stream) {
	var (
		next  atomic.Int64 // the next stream to take, by either side
		mu    sync.Mutex   // timer and seen
		timer *time.Timer
		seen  int64 = -1
	)
	take := func() *stream {
		if i := next.Add(1) - 1; i < int64(len(sts)) {
			return sts[i]
		}
		return nil
	}
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		switch n := next.Load(); {
		case n >= int64(len(sts)): // every stream begun: nothing to hand off
		case n != seen:
			seen = n
			timer.Reset(connHandoff)
		default:
			for st := take(); st != nil; st = take() {
				go st.drain()
			}
		}
	}
	mu.Lock()
	timer = time.AfterFunc(connHandoff, check)
	mu.Unlock()
	for st := take(); st != nil; st = take() {
		st.drain()
	}
	timer.Stop()
}

// close marks the stream's handler as returned: a writer still sending
// finds out after its send, and no new one starts.
func (st *stream) close() {
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
}

func (st *stream) send(gs grpc.ServerStream, r *response) error {
	s := st.svc
	msg, sent := r.snap.full, s.metrics.fullSent
	if r.unchanged {
		msg, sent = r.snap.unchangedResponse(), s.metrics.unchangedSent
	}
	// Recorded before the send: the client may answer before SendMsg
	// returns, and its ACK must find this nonce as the latest.
	st.mu.Lock()
	if st.latestNonce != r.snap.nonce {
		st.sent = append(st.sent, r.snap.nonce)
		if len(st.sent) > sentNonces {
			st.sent = st.sent[1:]
		}
	}
	st.latestNonce = r.snap.nonce
	st.rollouts = r.rollouts
	if st.versionSent != r.snap.version || st.state == "" {
		st.versionSent = r.snap.version
		st.state = proxystatus.Pending
		if st.versionAcked == r.snap.version {
			st.state = proxystatus.Acked
		}
	}
	st.mu.Unlock()

	if st.stuck == nil {
		st.stuck = time.AfterFunc(s.cfg.SendTimeout, func() {
			st.kill(status.Errorf(codes.ResourceExhausted, "client has not read for %v", s.cfg.SendTimeout))
		})
	} else {
		st.stuck.Reset(s.cfg.SendTimeout)
	}
	err := gs.SendMsg(msg)
	st.stuck.Stop()
	if err != nil {
		return err
	}
	sent.Inc()
	if r.push {
		s.metrics.pushes.Inc()
		if !r.at.IsZero() {
			s.metrics.pushLatency.Observe(time.Since(r.at).Seconds())
		}
	}
	return nil
}

// claim makes r the stream's next response, replacing any not yet sent
// (only the newest matters), and reports whether the caller must now run
// the stream's writer (drain): none was running.
func (st *stream) claim(r *response) bool {
	if st.dead.Load() {
		return false
	}
	st.mu.Lock()
	st.pending = r
	start := !st.writing && !st.closed
	if start {
		st.writing = true
	}
	st.mu.Unlock()
	return start
}

// kill ends the stream with err (the first reason wins).
func (st *stream) kill(err error) {
	st.dead.Store(true)
	select {
	case st.killed <- err:
	default:
	}
}

// handle applies one request to the stream (the request table of docs/sidecars.md).
func (s *Service) handle(st *stream, req *discoveryv1.PolicyDiscoveryRequest) error {
	st.lastActive.Store(s.now().UnixNano())
	if err := checkRequest(req); err != nil {
		return err
	}
	scope, err := s.requestScope(st, req)
	if err != nil {
		return err
	}

	if !st.opened {
		st.clientAddr = req.GetClientAddress()
		st.caps = policyset.ParseCaps(req.GetCapabilities())
		version := req.GetVersionInfo()
		start, err := s.join(st, scope, func(snap *snapshot, tags []string) *response {
			return &response{snap: snap, unchanged: version == snap.version, rollouts: tags}
		})
		if err != nil {
			return err
		}
		st.opened = true
		s.logger.Debug("stream opened", "client", st.clientAddr, "scope", st.currentScope().String(), "peer", st.peerAddr,
			"client_version", version)
		if start {
			go st.drain()
		}
		return nil
	}
	// With auth.mode jwt the stream's scope is the server's to change (a
	// team move), and requestScope has checked what may be checked.
	if s.deps.Verifier == nil && scope != st.scope {
		return fmt.Errorf("%w: scope %s differs from the stream's %s; open a new stream to change it", errInvalid, scope, st.scope)
	}
	if req.GetClientAddress() != st.clientAddr {
		return fmt.Errorf("%w: client_address changed on an open stream", errInvalid)
	}

	nonce := req.GetResponseNonce()
	st.mu.Lock()
	switch {
	case nonce != "" && nonce == st.latestNonce:
		if req.GetErrorDetail() != nil {
			st.state = proxystatus.Nacked
			st.nackMessage = truncate(req.GetErrorDetail().GetMessage(), maxNackMessage)
			st.nackVersion = truncate(req.GetVersionInfo(), maxVersionInfo)
			msg, version, scope := st.nackMessage, st.versionSent, st.scope
			st.mu.Unlock()
			s.metrics.nacks.Inc()
			s.logger.Warn("sidecar rejected policy set", "client", st.clientAddr, "scope", scope.String(),
				"version", version, "last_good_version", req.GetVersionInfo(), "error", msg)
			return nil
		}
		if req.GetVersionInfo() == st.versionSent {
			st.state = proxystatus.Acked
			st.versionAcked = st.versionSent
			st.mu.Unlock()
			s.metrics.acks.Inc()
			return nil
		}
		// Neither an ACK of what was sent nor a NACK: nothing to do.
		st.mu.Unlock()
		return nil
	case nonce != "" && containsNonce(st.sent, nonce):
		st.mu.Unlock()
		return nil // superseded: the client will answer the newer response
	}
	st.mu.Unlock()
	// Empty nonce (a fresh start on this stream) or one this stream never
	// sent (another node's, or from before a restart).
	return s.resend(st, req.GetVersionInfo())
}

func checkRequest(req *discoveryv1.PolicyDiscoveryRequest) error {
	switch {
	case req.GetClientAddress() == "":
		return fmt.Errorf("%w: client_address is required", errInvalid)
	case len(req.GetClientAddress()) > maxClientAddress:
		return fmt.Errorf("%w: client_address is longer than %d bytes", errInvalid, maxClientAddress)
	case len(req.GetVersionInfo()) > maxVersionInfo:
		return fmt.Errorf("%w: version_info is longer than %d bytes", errInvalid, maxVersionInfo)
	case len(req.GetResponseNonce()) > maxVersionInfo:
		return fmt.Errorf("%w: response_nonce is longer than %d bytes", errInvalid, maxVersionInfo)
	}
	return nil
}

// requestScope is the scope the request asks for, checked against the
// caller's identity. With auth.mode jwt a scope that names another org or
// employee is refused; its team is not checked, as the token's team is not
// (auth.Identify): the employee record decides the team, and a sidecar
// configured with its team before a move must go on with the new team's
// set, not be refused. The scope served is the caller's identity, which
// join brings in line with the record.
func (s *Service) requestScope(st *stream, req *discoveryv1.PolicyDiscoveryRequest) (policy.Identity, error) {
	rs := req.GetScope()
	asked := policy.Identity{Org: rs.GetOrg(), Team: rs.GetTeam(), Employee: rs.GetEmployee()}
	if s.deps.Verifier != nil {
		if asked != (policy.Identity{}) && (asked.Org != st.openedAs.Org || asked.Employee != st.openedAs.Employee) {
			return policy.Identity{}, status.Errorf(codes.PermissionDenied,
				"scope %s is not the caller's: it must name the token's org %q and employee %q (the employee record decides the team)",
				asked, st.openedAs.Org, st.openedAs.Employee)
		}
		return st.openedAs, nil
	}
	if asked.Org == "" && (asked.Team != "" || asked.Employee != "") {
		return policy.Identity{}, fmt.Errorf("%w: a team or employee scope needs org", errInvalid)
	}
	for _, v := range []string{asked.Org, asked.Team, asked.Employee} {
		if len(v) > maxClientAddress || !utf8.ValidString(v) {
			return policy.Identity{}, fmt.Errorf("%w: scope fields must be valid UTF-8 of at most %d bytes", errInvalid, maxClientAddress)
		}
	}
	return asked, nil
}

// authenticate checks the caller's token (auth.mode jwt) and resolves its
// identity from the employee record. With auth.mode none it returns the
// zero caller.
func (s *Service) authenticate(ctx context.Context) (caller, error) {
	claims, err := s.verify(ctx)
	if err != nil {
		return caller{}, err
	}
	return s.identify(claims)
}

// verify checks the caller's token (auth.mode jwt) and returns its claims,
// reading no state. With auth.mode none it returns no claims.
func (s *Service) verify(ctx context.Context) (*auth.Claims, error) {
	if s.deps.Verifier == nil {
		return nil, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return nil, auth.ErrNoCredentials
	}
	tok, err := auth.BearerToken(vals[0])
	if err != nil {
		return nil, err
	}
	claims, err := s.deps.Verifier.Verify(tok)
	if err != nil {
		return nil, err
	}
	return &claims, nil
}

// identify resolves verified claims to the caller from the employee
// record; nil claims (auth.mode none) are the zero caller.
func (s *Service) identify(claims *auth.Claims) (caller, error) {
	if claims == nil {
		return caller{}, nil
	}
	id, err := auth.Identify(*claims, s.deps.Store.FindEmployee)
	if err != nil {
		return caller{}, err
	}
	return caller{employee: id.Employee, identity: id}, nil
}

// org is the stream's org with auth.mode jwt, fixed for its life.
func (st *stream) org() string { return st.openedAs.Org }

// currentScope is the scope the stream is served now.
func (st *stream) currentScope() policy.Identity {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.scope
}

func (st *stream) info(node string) *clusterv1.ClientInfo {
	st.mu.Lock()
	defer st.mu.Unlock()
	return &clusterv1.ClientInfo{
		NodeId:              node,
		ClientAddress:       st.clientAddr,
		Transport:           "grpc",
		Org:                 st.scope.Org,
		Team:                st.scope.Team,
		Employee:            st.scope.Employee,
		VersionSent:         st.versionSent,
		State:               st.state,
		VersionAcked:        st.versionAcked,
		NackMessage:         st.nackMessage,
		NackVersion:         st.nackVersion,
		ConnectedAtUnixNano: st.connectedAt.UnixNano(),
		LastActiveUnixNano:  st.lastActive.Load(),
		PeerAddr:            st.peerAddr,
		Rollouts:            slices.Clone(st.rollouts),
		Capabilities:        st.caps.List(),
	}
}

func containsNonce(sent []string, n string) bool {
	for _, s := range sent {
		if s == n {
			return true
		}
	}
	return false
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence,
// and replaces invalid UTF-8 (proto3 strings from a client may carry it).
func truncate(s string, n int) string {
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // invalid bytes become U+FFFD
	}
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// caughtUp waits until the local replica holds everything committed before
// the stream opened (Deps.CaughtUp), or refuses the stream with Unavailable
// so that the sidecar tries another node.
func (s *Service) caughtUp(ctx context.Context) error {
	if s.deps.CaughtUp == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.closed, cancel)
	defer stop()
	if err := s.deps.CaughtUp(ctx); err != nil {
		if s.closed.Err() != nil {
			return status.Error(codes.Unavailable, "server shutting down")
		}
		return status.Errorf(codes.Unavailable, "this node cannot confirm it is up to date (%v); try another node", err)
	}
	return nil
}
