// Package discovery serves the sidecar discovery stream: an xDS-like gRPC
// protocol over which a node pushes, from its local replica, the policy set
// that applies to each sidecar's scope, and records each sidecar's ACK or
// NACK for rollout tracking. It owns the streams, their snapshots and
// nonces; the policy index is internal/server/policyset and the rollout view
// internal/server/proxystatus. Errors become gRPC codes in one place,
// statusOf. See docs/sidecars.md.
package discovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/decisionlog"
	"github.com/policyd/policyd/internal/server/grpccodec"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/server/shadow"
	"github.com/policyd/policyd/internal/store"
)

// Deps is what the service needs from its node.
type Deps struct {
	NodeID string
	// LeaderID names the current Raft leader ("" if none), for HealthCheck.
	LeaderID func() string
	// Store is the local replica, for employee records.
	Store *store.Store
	// Policies is the in-memory policy index; it has taken in a change
	// before OnChange is called with it.
	Policies *policyset.Index
	// Verifier checks sidecar JWTs; nil means auth.mode none.
	Verifier *auth.JWTVerifier
	Registry prometheus.Registerer
	// CaughtUp returns once the local replica holds every write committed
	// before the call (a coalesced consistent read). A stream waits for it
	// before its first snapshot, so a sidecar failing over to a lagging
	// node never goes back in time; an error refuses the stream with
	// Unavailable. Nil: no wait (tests of the service alone).
	CaughtUp func(ctx context.Context) error
	// Shadow takes the sidecars' shadow reports (ReportShadow); nil:
	// refused as Unimplemented.
	Shadow *shadow.Aggregator
	// Decisions takes the sidecars' decision records (ReportDecisions);
	// nil: the node keeps none and says Unimplemented.
	Decisions *decisionlog.Log
	// Refusal is why the node sends sidecars elsewhere now ("" when it
	// serves them). It is checked as a stream registers, under the lock
	// DropAll takes, so that a stream set up while the node stops serving
	// is either dropped or refused, never sent a set. Nil: never.
	Refusal func() string
}

// Service implements PolicyDiscoveryService.
type Service struct {
	discoveryv1.UnimplementedPolicyDiscoveryServiceServer

	cfg     config.Discovery
	logger  *slog.Logger
	deps    Deps
	metrics *metrics
	// noncePrefix makes nonces unique across nodes and restarts.
	noncePrefix string
	nonceSeq    atomic.Uint64
	streamSeq   atomic.Uint64
	now         func() time.Time

	// closed ends streams still waiting for CaughtUp when the node shuts
	// down: a dying node must refuse at once, not hold a sidecar for the
	// whole wait.
	closed    context.Context
	markClose context.CancelFunc

	mu      sync.Mutex
	closing bool
	streams map[*stream]struct{}
	groups  map[groupKey]*group
	// scopeStreams counts the streams per scope, which may be in several
	// groups (stable and candidate sets), for the streams gauge.
	scopeStreams map[policy.Identity]int
	byAddr       map[string]map[*stream]struct{}
	// bySet is the snapshot of every set that a group holds, and how many
	// groups hold it. Every employee of a team that no policy names has
	// the team's set; without this, each such employee's first stream
	// encoded a copy of it, and the node kept one copy per employee until
	// the next change: 3 KiB per idle sidecar with 10 small policies, and
	// the whole set per sidecar with large ones.
	bySet map[*policyset.Set]*setSnapshot
}

// groupKey names a group: a scope, the staged rollouts whose candidates
// its set holds (policyset.Set.Rollouts joined; "" for the stable set),
// and whether its streams are served the set without shadow policies
// (they did not declare the shadow capability). Every stream of a group is
// sent the same responses.
type groupKey struct {
	id       policy.Identity
	tags     string
	noShadow bool
}

func keyOf(id policy.Identity, set *policyset.Set, caps policyset.Caps) groupKey {
	return groupKey{id, strings.Join(set.Rollouts, ","), !caps.Shadow}
}

// group is every stream serving one scope with one set (stable, or one
// combination of rollout candidates), and that set's current snapshot.
type group struct {
	id      policy.Identity
	key     groupKey
	tags    []string       // the set's Rollouts
	set     *policyset.Set // the set snap was encoded from
	snap    *snapshot
	streams map[*stream]struct{}
}

// setSnapshot is bySet's entry: a snapshot of the set and the number of
// groups whose set it is.
type setSnapshot struct {
	snap   *snapshot
	groups int
}

// New builds the service.
func New(cfg config.Discovery, logger *slog.Logger, deps Deps) (*Service, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("nonce prefix: %w", err)
	}
	s := &Service{
		cfg:          cfg,
		logger:       logger,
		deps:         deps,
		noncePrefix:  deps.NodeID + "." + hex.EncodeToString(b[:]),
		now:          time.Now,
		streams:      map[*stream]struct{}{},
		groups:       map[groupKey]*group{},
		scopeStreams: map[policy.Identity]int{},
		byAddr:       map[string]map[*stream]struct{}{},
		bySet:        map[*policyset.Set]*setSnapshot{},
	}
	s.closed, s.markClose = context.WithCancel(context.Background())
	m, err := newMetrics(deps.NodeID, deps.Registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// Register adds the service to g.
func (s *Service) Register(g *grpc.Server) {
	discoveryv1.RegisterPolicyDiscoveryServiceServer(g, s)
}

// ServerOptions are the options the node's gRPC server must be built with:
// the codec that sends pre-encoded snapshots as they are, wrapped so that a
// request whose strings are not valid UTF-8 gets InvalidArgument naming the
// field (grpccodec), with the interceptors that wrapper needs.
func ServerOptions() []grpc.ServerOption {
	return grpccodec.New(newCodec()).ServerOptions()
}

// Run ends inactive streams every flush interval until ctx ends.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.flush()
		}
	}
}

// flush ends the streams idle for longer than max_client_inactive.
func (s *Service) flush() {
	cutoff := s.now().Add(-s.cfg.MaxClientInactive).UnixNano()
	s.mu.Lock()
	var idle []*stream
	for st := range s.streams {
		if st.lastActive.Load() < cutoff {
			idle = append(idle, st)
		}
	}
	s.mu.Unlock()
	for _, st := range idle {
		s.logger.Info("closing inactive stream", "client", st.clientAddr, "scope", st.currentScope().String(),
			"inactive_for", s.cfg.MaxClientInactive)
		s.metrics.flushes.Inc()
		st.kill(status.Errorf(codes.DeadlineExceeded,
			"no request or health check for longer than %v", s.cfg.MaxClientInactive))
	}
}

// OnChange pushes a committed batch to the streams whose set it changed. It
// is called in commit order by the node's change dispatcher, never
// concurrently with itself.
func (s *Service) OnChange(c store.Change) {
	var scopes, rolloutScopes []policy.Scope
	var employees []string
	rollouts, anyScope := false, false
	for _, e := range c.Entities {
		switch e.Type {
		case store.EntityPolicy:
			scopes = append(scopes, e.Scopes...)
		case store.EntityEmployee:
			employees = append(employees, e.ID)
		case store.EntityRollout:
			rollouts = true
			rolloutScopes = append(rolloutScopes, e.Scopes...)
			anyScope = anyScope || len(e.Scopes) == 0
		}
	}
	// Employees first: a stream whose employee left its team in this batch
	// must be moved (or ended) before the batch's snapshots are pushed, or
	// it would receive its old team's policies as of an index where it no
	// longer belongs to that team (the feed orders them the same way).
	if s.deps.Verifier != nil && (c.Resync || len(employees) > 0) {
		s.recheckEmployees(c, employees)
	}
	if c.Resync || len(scopes) > 0 {
		s.push(c, scopes)
	}
	// Then cohorts: a rollout change moves the streams whose set it
	// changed to their new group. After the push, so that a group they
	// join holds the batch's policy changes already (a completion's
	// writes): joined before, a member would be offered the stable set as
	// of before the batch, then the new one.
	if c.Resync || rollouts {
		s.recohort(c.At, func(st *stream) bool {
			return c.Resync || anyScope || policyset.Affects(rolloutScopes, st.scope)
		})
	}
}

// move puts st in the group of the set it is to be served now (a rollout
// change moved it into or out of a cohort).
func (s *Service) move(st *stream, at time.Time) {
	start, err := s.join(st, st.currentScope(), func(snap *snapshot, tags []string) *response {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.pending == nil && st.versionSent == snap.version {
			// The same content under other tags (a later stage): the
			// client holds it, and its ACK stands.
			st.rollouts = tags
			return nil
		}
		return &response{snap: snap, push: true, at: at, rollouts: tags}
	})
	switch {
	case err == nil:
		if start {
			go st.drain()
		}
	case status.Code(err) == codes.PermissionDenied:
		st.kill(err)
	case status.Code(err) != codes.Canceled && status.Code(err) != codes.Unavailable:
		s.logger.Error("move stream to its rollout cohort's set", "client", st.clientAddr, "err", err)
		st.kill(statusOf(err))
	}
}

// setFor is the set st is to be served as a stream of scope id.
func (s *Service) setFor(st *stream, id policy.Identity) *policyset.Set {
	return s.deps.Policies.SetFor(id, st.clientAddr, st.caps)
}

// groupSet is the current set of g's scope and rollouts, or false when
// those rollouts no longer give g's scope a candidate at those stages.
func (s *Service) groupSet(g *group) (*policyset.Set, bool) {
	set, ok := s.deps.Policies.SetTagged(g.id, g.tags)
	if ok && g.key.noShadow {
		set = set.WithoutShadow()
	}
	return set, ok
}

func (s *Service) push(c store.Change, scopes []policy.Scope) {
	s.mu.Lock()
	var affected []*group
	for _, g := range s.groups {
		if c.Resync || policyset.Affects(scopes, g.id) {
			affected = append(affected, g)
		}
	}
	s.mu.Unlock()
	type offer struct {
		st *stream
		r  *response
	}
	var offers []offer
	var stale []*stream
	for _, g := range affected {
		set, ok := s.groupSet(g)
		if !ok {
			// Its rollouts no longer give it a candidate (a completion's
			// batch, or streams that joined while a rollout moved on):
			// move its streams once every group holds the batch.
			s.mu.Lock()
			for st := range g.streams {
				stale = append(stale, st)
			}
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		unchanged := s.groups[g.key] != g || g.snap.version == set.Version
		// Scopes with the same set (every employee of a team that no
		// policy names has its team's) share one snapshot, encoded once:
		// the set's is held already if this push has reached another of
		// them, if a scope's first stream opened after the index took the
		// change in, or if this change left a scope with the set alone (a
		// teammate, when an employee's own policy goes).
		var snap *snapshot
		if e := s.bySet[set]; e != nil {
			snap = e.snap
		}
		s.mu.Unlock()
		if unchanged {
			continue // emptied meanwhile, or the change left this scope's set as it was
		}
		if snap == nil {
			// Encoded outside the lock: only this goroutine replaces an
			// existing group's snapshot, so nothing can race it in
			// between.
			var err error
			if snap, err = s.newSnapshot(set); err != nil {
				s.logger.Error("encode snapshot", "scope", g.id.String(), "err", err)
				continue
			}
		}
		// Immutable, so every stream of the group is offered the same.
		r := &response{snap: snap, push: true, at: c.At, rollouts: g.tags}
		s.mu.Lock()
		if s.groups[g.key] != g {
			s.mu.Unlock()
			continue
		}
		s.holdLocked(g, set, snap)
		for st := range g.streams {
			offers = append(offers, offer{st, r})
		}
		n := len(g.streams)
		s.mu.Unlock()
		s.logger.Debug("pushing", "scope", g.id.String(), "version", snap.version, "streams", n)
	}
	// The writers of streams that share a client connection run one after
	// the other on one goroutine (drainConn). grpc-go gives a connection
	// one writer goroutine (the loopy writer), which flushes whenever it
	// finds its queue empty. With a goroutine per stream, each one that
	// queued a message woke the loopy writer, which took over its P as it
	// ended and flushed that message alone: with 10,000 streams over 100
	// connections (bench propagation -ws 0 -sdk=false), 60 write syscalls
	// per connection per change (80 before the streams were grouped by
	// connection at all). One goroutine queues a connection's messages
	// faster than a write syscall takes, so they go out together: 5 per
	// connection, and the node's CPU per change a quarter lower. A
	// connection per stream, as most sidecars have, gains nothing and
	// loses nothing.
	slices.SortFunc(offers, func(a, b offer) int { return strings.Compare(a.st.peerAddr, b.st.peerAddr) })
	for len(offers) > 0 {
		n := 1
		for n < len(offers) && offers[n].st.peerAddr == offers[0].st.peerAddr {
			n++
		}
		var claimed []*stream
		for _, o := range offers[:n] {
			if o.st.claim(o.r) {
				claimed = append(claimed, o.st)
			}
		}
		offers = offers[n:]
		switch len(claimed) {
		case 0:
		case 1:
			go claimed[0].drain()
		default:
			go drainConn(claimed)
		}
	}
	for _, st := range stale {
		s.move(st, c.At)
	}
}

// recheckEmployees brings the streams of the employees changed by c (every
// employee's, for a resync) in line with their records: a stream whose
// employee was deactivated, deleted or moved to another org ends with
// PermissionDenied; one whose employee moved to another team of its org is
// moved to that team's scope and pushed its snapshot.
func (s *Service) recheckEmployees(c store.Change, ids []string) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	s.mu.Lock()
	var check []*stream
	for st := range s.streams {
		if st.employee != "" && (c.Resync || want[st.employee]) {
			check = append(check, st)
		}
	}
	s.mu.Unlock()
	for _, st := range check {
		e, err := s.deps.Store.FindEmployee(st.employee)
		if err != nil {
			s.logger.Error("read employee", "employee", st.employee, "err", err)
			continue
		}
		if why := employeeChanged(e, st.org()); why != nil {
			s.logger.Info("revoking stream", "client", st.clientAddr, "employee", st.employee, "reason", status.Convert(why).Message())
			st.kill(why)
			continue
		}
		if from, to := st.currentScope(), e.Identity(); from != to {
			s.rescope(st, to, c.At)
		}
	}
}

// rescope moves st, whose employee moved to another team, to scope id and
// pushes it that scope's snapshot, which replaces the old team's set on the
// sidecar.
func (s *Service) rescope(st *stream, id policy.Identity, at time.Time) {
	from := st.currentScope()
	start, err := s.join(st, id, func(snap *snapshot, tags []string) *response {
		return &response{snap: snap, push: true, at: at, rollouts: tags}
	})
	switch {
	case err == nil:
		s.logger.Info("stream moved to another team", "client", st.clientAddr, "employee", st.employee,
			"from", from.String(), "to", st.currentScope().String())
		if start {
			go st.drain()
		}
	case status.Code(err) == codes.PermissionDenied:
		st.kill(err) // revoked since the record was read
	case status.Code(err) != codes.Canceled && status.Code(err) != codes.Unavailable:
		s.logger.Error("move stream to its employee's new team", "client", st.clientAddr, "employee", st.employee, "err", err)
		st.kill(statusOf(err))
	}
}

// The ends of a stream whose employee record changed.
var (
	errRevoked    = status.Error(codes.PermissionDenied, "access revoked: employee deleted or deactivated")
	errOrgChanged = status.Error(codes.PermissionDenied, "access revoked: employee moved to another org; connect with a token for the new org")
)

// employeeChanged is why a stream of org for employee e (nil: deleted) must
// end, or nil if it may go on, served the record's team. An org is a
// tenant: a stream never crosses from one to another.
func employeeChanged(e *policy.Employee, org string) error {
	switch {
	case e == nil || !e.Active():
		return errRevoked
	case e.Org != org:
		return errOrgChanged
	}
	return nil
}

// CloseAll ends every stream with Unavailable and refuses new ones; the
// node calls it before stopping the gRPC server, which waits for streams.
func (s *Service) CloseAll() {
	s.markClose()
	s.endAll(true, status.Error(codes.Unavailable, "server shutting down"))
}

// DropAll ends every open stream with Unavailable and msg, and goes on
// serving: for a node that can no longer vouch for its state, whose
// sidecars should move to another node. It returns how many it ended.
func (s *Service) DropAll(msg string) int {
	return s.endAll(false, status.Error(codes.Unavailable, msg))
}

func (s *Service) endAll(closing bool, err error) int {
	s.mu.Lock()
	s.closing = s.closing || closing
	all := make([]*stream, 0, len(s.streams))
	for st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	for _, st := range all {
		st.kill(err)
	}
	return len(all)
}

// HealthCheck refreshes the last-active time of the caller's streams. It
// never fails because the client is unknown: a health check must not end a
// stream, and a client may check before its stream opens.
func (s *Service) HealthCheck(ctx context.Context, req *discoveryv1.HealthCheckRequest) (*discoveryv1.HealthCheckResponse, error) {
	who, err := s.authenticate(ctx)
	if err != nil {
		return nil, statusOf(err)
	}
	now := s.now().UnixNano()
	s.mu.Lock()
	for st := range s.byAddr[req.GetClientAddress()] {
		if who.employee == st.employee {
			st.lastActive.Store(now)
		}
	}
	s.mu.Unlock()
	return &discoveryv1.HealthCheckResponse{NodeId: s.deps.NodeID, LeaderId: s.deps.LeaderID()}, nil
}

// Clients lists this node's streams for GET /v1/clients.
func (s *Service) Clients() []*clusterv1.ClientInfo {
	s.mu.Lock()
	all := make([]*stream, 0, len(s.streams))
	for st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	out := make([]*clusterv1.ClientInfo, 0, len(all))
	for _, st := range all {
		out = append(out, st.info(s.deps.NodeID))
	}
	return out
}

// errNoSnapshot tells join that joinLocked needs a snapshot of the current
// set, encoded outside s.mu.
var errNoSnapshot = errors.New("no snapshot of the set")

// join puts st in the group of scope id, or of the scope its employee
// record names now (scopeLocked), and offers st the group's snapshot as
// the response respond builds: at its first request (st not registered
// yet), or when its employee moved team (rescope). It reports whether the
// caller must start st's writer (drain). The offer is made under s.mu,
// which every move takes, so that a response for a scope st has left is
// never offered after one for the scope it joined.
func (s *Service) join(st *stream, id policy.Identity, respond func(*snapshot, []string) *response) (bool, error) {
	// A scope's first stream needs that scope's snapshot: another scope's
	// of the same set if there is one, else one encoded before taking the
	// lock, so that a storm of reconnecting sidecars, each with its own
	// scope, does not serialise on encoding; see joinLocked for why a
	// snapshot encoded outside the lock is still current. The set too is
	// computed outside the lock; joinLocked finds it cached.
	set := s.setFor(st, id)
	var fresh *snapshot
	for {
		want, start, err := s.joinLocked(st, id, set, fresh, respond)
		switch {
		case errors.Is(err, errNoSnapshot):
			if cur := s.setFor(st, id); cur != set {
				set, fresh = cur, nil // changed meanwhile: look for a shared one again
				continue
			}
			if fresh, err = s.newSnapshot(set); err != nil {
				return false, err
			}
		case err != nil:
			return false, err
		case want != id: // the employee moved team meanwhile
			id, set, fresh = want, s.setFor(st, want), nil
		default:
			return start, nil
		}
	}
}

// joinLocked does join's work under s.mu. When the group of id does not
// exist yet it is created with set's snapshot, provided set is still the
// index's current set for id (the index returns the same *Set until a
// change invalidates it, and the dispatcher invalidates before it pushes,
// so a stale set is detected here or the group is refreshed by the push
// that follows): the one another group holds (bySet), else fresh, encoded
// from set. Otherwise it returns errNoSnapshot and the caller encodes.
// When st's employee record names another scope than id, it returns that
// scope and does nothing.
func (s *Service) joinLocked(st *stream, id policy.Identity, set *policyset.Set, fresh *snapshot, respond func(*snapshot, []string) *response) (policy.Identity, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return id, false, status.Error(codes.Unavailable, "server shutting down")
	}
	if st.ended {
		// The handler returned (client gone) while this request was being
		// handled; registering now would leak the stream.
		return id, false, status.Error(codes.Canceled, "stream ended")
	}
	if !st.registered && s.deps.Refusal != nil {
		if msg := s.deps.Refusal(); msg != "" {
			return id, false, status.Error(codes.Unavailable, msg)
		}
	}
	key := keyOf(id, set, st.caps)
	if st.registered && st.key == key {
		return id, false, nil
	}
	g := s.groups[key]
	if g == nil {
		if s.setFor(st, id) != set {
			return id, false, errNoSnapshot
		}
		if e := s.bySet[set]; e != nil {
			fresh = e.snap
		} else if fresh == nil {
			return id, false, errNoSnapshot
		}
	}
	// After the return above, so that a stream whose caller must encode
	// first reads the record once.
	want, err := s.scopeLocked(st, id)
	if err != nil || want != id {
		return want, false, err
	}
	if g == nil {
		g = &group{id: id, key: key, tags: set.Rollouts, streams: map[*stream]struct{}{}}
		s.holdLocked(g, set, fresh)
		s.groups[key] = g
	}
	if st.registered {
		s.leaveGroupLocked(st)
	} else {
		s.streams[st] = struct{}{}
		if s.byAddr[st.clientAddr] == nil {
			s.byAddr[st.clientAddr] = map[*stream]struct{}{}
		}
		s.byAddr[st.clientAddr][st] = struct{}{}
		st.registered = true
	}
	g.streams[st] = struct{}{}
	st.key = key
	st.mu.Lock()
	st.scope = id
	st.mu.Unlock()
	s.scopeStreams[id]++
	s.metrics.streams.WithLabelValues(id.String()).Inc()
	r := respond(g.snap, g.tags)
	if r == nil {
		return id, false, nil
	}
	return id, st.claim(r), nil
}

// scopeLocked is the scope st is to be served instead of id: id itself with
// auth.mode none; with jwt, the identity of st's employee record, or why st
// must end. The identity was resolved when the stream opened, after the
// catch-up wait, and a change to the employee committed since may have been
// dispatched before st was registered, so that recheckEmployees did not see
// it; the store, which is never behind the dispatcher, does. Called under
// s.mu, which recheckEmployees takes to find the streams to check: a change
// committed after this read finds st registered.
func (s *Service) scopeLocked(st *stream, id policy.Identity) (policy.Identity, error) {
	if st.employee == "" {
		return id, nil
	}
	e, err := s.deps.Store.FindEmployee(st.employee)
	if err != nil {
		return id, fmt.Errorf("read employee %q: %w", st.employee, err)
	}
	if why := employeeChanged(e, st.org()); why != nil {
		return id, why
	}
	return e.Identity(), nil
}

// unregister removes st from every tracker.
func (s *Service) unregister(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.ended = true
	if !st.registered {
		return
	}
	st.registered = false
	delete(s.streams, st)
	if m := s.byAddr[st.clientAddr]; m != nil {
		delete(m, st)
		if len(m) == 0 {
			delete(s.byAddr, st.clientAddr)
		}
	}
	s.leaveGroupLocked(st)
}

// leaveGroupLocked removes st from its group, and the group with its last
// stream.
func (s *Service) leaveGroupLocked(st *stream) {
	if g := s.groups[st.key]; g != nil {
		delete(g.streams, st)
		if len(g.streams) == 0 {
			s.releaseLocked(g)
			delete(s.groups, st.key)
		}
	}
	if s.scopeStreams[st.scope]--; s.scopeStreams[st.scope] <= 0 {
		delete(s.scopeStreams, st.scope)
		s.metrics.streams.DeleteLabelValues(st.scope.String())
		return
	}
	s.metrics.streams.WithLabelValues(st.scope.String()).Dec()
}

// holdLocked makes snap, encoded from set, g's snapshot, and the one that
// groups created for set from now on share.
func (s *Service) holdLocked(g *group, set *policyset.Set, snap *snapshot) {
	s.releaseLocked(g)
	g.set, g.snap = set, snap
	e := s.bySet[set]
	if e == nil {
		e = &setSnapshot{}
		s.bySet[set] = e
	}
	e.snap = snap
	e.groups++
}

// releaseLocked drops g's hold on its set's snapshot, if it has one.
func (s *Service) releaseLocked(g *group) {
	if e := s.bySet[g.set]; e != nil {
		if e.groups--; e.groups == 0 {
			delete(s.bySet, g.set)
		}
	}
	g.set = nil
}

// resend offers st its scope's current snapshot, as the answer to a request
// with an empty or unknown nonce (unchanged when the client holds version).
// Under s.mu, as join's offers are, so that a move to another team is never
// followed by the old team's snapshot.
func (s *Service) resend(st *stream, version string) error {
	s.mu.Lock()
	g := s.groups[st.key]
	if g == nil {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "server shutting down")
	}
	start := st.claim(&response{snap: g.snap, unchanged: version == g.snap.version, rollouts: g.tags})
	s.mu.Unlock()
	if start {
		go st.drain()
	}
	return nil
}
