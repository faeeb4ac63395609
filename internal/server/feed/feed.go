package feed

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/decisionlog"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/server/shadow"
	"github.com/policyd/policyd/internal/store"
)

const (
	// shutdownGrace is how long CloseAll lets connections finish their close
	// handshake before it cuts their sockets.
	shutdownGrace = time.Second
	// maxCloseGrace caps how long one connection's close (the final message
	// and the close handshake) may take before its socket is cut.
	maxCloseGrace = 2 * time.Second
	// initCacheSize bounds the cache of encoded init messages.
	initCacheSize = 1024
)

// Revocation reasons, sent in the revoke message and the 4403 close.
const (
	reasonDeactivated = "employee deactivated"
	reasonDeleted     = "employee deleted"
	// reasonOrgChanged: a tenant boundary is never crossed on an open
	// connection, so an org change revokes rather than re-scopes.
	reasonOrgChanged = "employee moved to another org"
)

// Deps is what the hub needs from its node.
type Deps struct {
	NodeID string
	// Store is the local replica: employees, and the event log for
	// ?since= replays.
	Store *store.Store
	// Policies is the in-memory policy index; it has taken in a change
	// before OnChange is called with it.
	Policies *policyset.Index
	// Verifier checks tokens; nil means auth.mode none, where the
	// connection names its employee with ?employee= (local development).
	Verifier *auth.JWTVerifier
	// Registry receives the feed's metrics; nil registers nothing.
	Registry prometheus.Registerer
	// CaughtUp returns once the local replica holds every write committed
	// before the call (the node's coalesced consistent read, shared with
	// the discovery stream). A resume whose ?since= this node has not
	// applied waits for it (see admit), and so does a refusal for the
	// employee record's sake (identify). Nil: a resume waits for this
	// node's applied index only, as if the cluster had committed the
	// since, and a refusal is answered at once.
	CaughtUp func(ctx context.Context) error
	// OwnWrites returns once the local replica holds every write this node
	// has acknowledged (the wait local reads make, for read-your-writes).
	// A handshake waits for it before it reads the employee record. Nil:
	// no wait.
	OwnWrites func(ctx context.Context) error
	// Shadow takes the connections' shadow reports; nil: they are read
	// and dropped.
	Shadow *shadow.Aggregator
	// Decisions takes the decision_log messages of connections that
	// declared the capability; nil: init does not invite them, and one
	// sent anyway closes the connection.
	Decisions *decisionlog.Log
	// Refusal is why the node sends sidecars elsewhere now ("" when it
	// serves them). It is checked as a connection attaches, under the
	// lock DropAll takes, so that a connection upgraded while the node
	// stops serving is either dropped or closed with 1013, never sent a
	// set. Nil: never.
	Refusal func() string
}

// teamKey names a team: team names are only unique within an org.
type teamKey struct{ org, team string }

// connSet is a set of connections.
type connSet map[*conn]struct{}

// Hub serves GET /ws/policies and pushes changes to its connections.
type Hub struct {
	cfg     config.Feed
	logger  *slog.Logger
	deps    Deps
	metrics *metrics

	// ctx ends when CloseAll starts; handshakes in progress watch it.
	ctx    context.Context
	cancel context.CancelFunc
	seq    atomic.Uint64 // connection counter, for client addresses

	// mu guards everything below and the identity and base of every
	// connection. OnChange holds it for a whole batch, so a connection
	// attaches either before a batch or after it, never in the middle.
	mu     sync.RWMutex
	closed bool
	// dispatched is the index of the last change OnChange has processed
	// (initially the index the policy index was loaded at).
	dispatched uint64
	// live holds every attached connection until its handler ends; the
	// indexes below only those that still receive messages.
	live       connSet
	all        connSet
	byOrg      map[string]connSet
	byTeam     map[teamKey]connSet
	byEmployee map[string]connSet
	initCache  map[initKey][]byte

	// poll watches the sockets of idle connections; created with the
	// first connection, closed by CloseAll. pollFailed: it could not be
	// created, connections read with goroutines of their own.
	poll       *poller
	pollFailed bool
	// noPoll makes every connection read with a goroutine of its own, as
	// on platforms without the poller (tests).
	noPoll bool

	wg         sync.WaitGroup // one per attached connection, until it is detached
	closedDone chan struct{}  // closed when CloseAll has finished
}

// New builds a hub. Call Run to start delivering changes.
func New(cfg config.Feed, logger *slog.Logger, deps Deps) (*Hub, error) {
	switch {
	case deps.Store == nil:
		return nil, errors.New("feed: no store")
	case deps.Policies == nil:
		return nil, errors.New("feed: no policy index")
	case cfg.PingInterval <= 0 || cfg.WriteTimeout <= 0 || cfg.SendBuffer < 1 || cfg.MaxMessageBytes < 1:
		return nil, fmt.Errorf("feed: invalid configuration %+v", cfg)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(deps.Registry)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{
		cfg:        cfg,
		logger:     logger,
		deps:       deps,
		metrics:    m,
		ctx:        ctx,
		cancel:     cancel,
		dispatched: deps.Policies.Applied(),
		live:       connSet{},
		all:        connSet{},
		byOrg:      map[string]connSet{},
		byTeam:     map[teamKey]connSet{},
		byEmployee: map[string]connSet{},
		initCache:  map[initKey][]byte{},
		closedDone: make(chan struct{}),
	}, nil
}

// Run does the hub's background work until ctx ends, then closes every
// connection (as CloseAll) and returns once they have ended. Connections
// run on goroutines of their own, started when they have work (see conn);
// Run only bounds their lifetime.
func (h *Hub) Run(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-h.ctx.Done():
	}
	h.CloseAll()
}

// CloseAll closes every connection (1001 going away) and refuses new ones
// (503). It returns when every connection's goroutines (and the poller's)
// have ended: those that do not finish their close handshake within
// shutdownGrace have their sockets cut. It is safe to call more than once
// and concurrently.
func (h *Hub) CloseAll() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		<-h.closedDone
		return
	}
	h.closed = true
	conns := h.liveLocked()
	h.mu.Unlock()
	h.cancel()

	for _, c := range conns {
		c.closeWith(websocket.StatusGoingAway, "server shutting down", nil)
	}
	if !waitTimeout(&h.wg, shutdownGrace) {
		for _, c := range conns {
			c.cut()
		}
		h.wg.Wait()
	}
	// No connection is left to use the poller, and none can attach.
	h.mu.Lock()
	p := h.poll
	h.poll = nil
	h.mu.Unlock()
	if p != nil {
		p.close()
	}
	close(h.closedDone)
	h.logger.Info("feed closed", "connections", len(conns))
}

// DropAll closes every connection with 1013 (try again later) and msg, and
// goes on serving: for a node that can no longer vouch for its state, whose
// sidecars should move to another node. It returns how many it closed.
func (h *Hub) DropAll(msg string) int {
	h.mu.Lock()
	conns := h.liveLocked()
	h.mu.Unlock()
	for _, c := range conns {
		c.closeWith(websocket.StatusTryAgainLater, msg, nil)
	}
	return len(conns)
}

func (h *Hub) liveLocked() []*conn {
	conns := make([]*conn, 0, len(h.live))
	for c := range h.live {
		conns = append(conns, c)
	}
	return conns
}

// waitTimeout waits for wg up to d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// connPoller returns the poller for a new connection, creating it with
// the first one; nil when connections must read with goroutines of their
// own (no poller on this platform, or it could not be created) or the hub
// is closing.
func (h *Hub) connPoller() *poller {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.noPoll || h.pollFailed {
		return nil
	}
	if h.poll == nil {
		p, err := newPoller()
		if err != nil {
			h.pollFailed = true
			h.logger.Warn("feed connections will read with a goroutine each", "err", err)
			return nil
		}
		h.poll = p
	}
	return h.poll
}

// Clients lists this node's connections for GET /v1/clients.
func (h *Hub) Clients() []*clusterv1.ClientInfo {
	h.mu.RLock()
	out := make([]*clusterv1.ClientInfo, 0, len(h.all))
	for c := range h.all {
		sent := c.sentDigest()
		var tags []string
		if c.set != nil {
			tags = slices.Clone(c.set.Rollouts)
		}
		out = append(out, &clusterv1.ClientInfo{
			NodeId:        h.deps.NodeID,
			ClientAddress: c.addr,
			Transport:     "ws",
			Org:           c.ident.Org,
			Team:          c.ident.Team,
			Employee:      c.ident.Employee,
			VersionSent:   sent,
			// The feed has no ACKs: what was written is all the server
			// knows, so it counts as acknowledged (a client that cannot
			// apply a message logs it and carries on, see client/).
			State:               "acked",
			VersionAcked:        sent,
			ConnectedAtUnixNano: c.connectedAt.UnixNano(),
			LastActiveUnixNano:  c.lastPong.Load(),
			PeerAddr:            c.peer,
			Rollouts:            tags,
			Capabilities:        c.caps.List(),
		})
	}
	h.mu.RUnlock()
	slices.SortFunc(out, func(a, b *clusterv1.ClientInfo) int { return strings.Compare(a.ClientAddress, b.ClientAddress) })
	return out
}

// OnChange is called by the node's change dispatcher, in commit order, for
// every committed batch. It must not block on the network, and does not:
// it only encodes messages and queues them without waiting.
func (h *Hub) OnChange(c store.Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dispatched = max(h.dispatched, c.Index)
	if h.closed || len(h.all) == 0 {
		return
	}
	b := newBatch(h, c)
	if c.Resync {
		h.resyncLocked(b)
		return
	}
	// Employees first: a revoked connection must not get this batch's
	// policies, and a moved one gets an init that already includes them.
	for _, e := range c.Entities {
		if e.Type == store.EntityEmployee {
			h.employeeChangedLocked(b, e)
		}
	}
	h.policiesChangedLocked(b, c)
}

// policiesChangedLocked sends upsert or delete to every connection a policy
// change touches, and to every connection a rollout change moves into or
// out of a cohort the upserts and deletes that take it from the set it
// holds to the one it is to be served (policyset.SetFor).
func (h *Hub) policiesChangedLocked(b *batch, c store.Change) {
	type item struct {
		name  string
		index uint64
	}
	var pending map[*conn][]item
	add := func(t *conn, name string, index uint64) {
		if pending == nil {
			pending = map[*conn][]item{}
		}
		// A policy changed more than once in a batch is sent once, in
		// its current state, at its first change's place and index:
		// versions stay in order, and a client whose last message had
		// version v holds, for every policy changed up to v, a state at
		// least as new as v's (what ?since= resumes from).
		if !slices.ContainsFunc(pending[t], func(it item) bool { return it.name == name }) {
			pending[t] = append(pending[t], item{name, index})
		}
	}
	// moved: the connections a rollout change may move, with the index of
	// the first such change.
	var moved map[*conn]uint64
	for _, e := range c.Entities {
		switch e.Type {
		case store.EntityPolicy:
			targets := h.targetsLocked(e.Scopes)
			h.logger.Debug("policy broadcast", "action", e.Action, "policy", e.ID, "index", e.Index,
				"scopes", scopeStrings(e.Scopes), "connections", len(targets))
			for t := range targets {
				if e.Index > t.base { // else already in the state the connection was sent
					add(t, e.ID, e.Index)
				}
			}
		case store.EntityRollout:
			for t := range h.all {
				if !t.caps.Rollouts || e.Index <= t.base {
					continue
				}
				if len(e.Scopes) > 0 && (t.set == nil || len(t.set.Rollouts) == 0) && !policyset.Affects(e.Scopes, t.ident) {
					continue
				}
				if moved == nil {
					moved = map[*conn]uint64{}
				}
				if pending == nil {
					pending = map[*conn][]item{}
				}
				if _, ok := moved[t]; !ok {
					moved[t] = e.Index
					if _, ok := pending[t]; !ok {
						pending[t] = nil // visited below, for the difference
					}
				}
			}
		}
	}
	for t, items := range pending {
		set := h.setLocked(t)
		if index, ok := moved[t]; ok {
			if t.set == nil {
				h.sendInitLocked(t, b.at)
				continue
			}
			for _, name := range diffNames(t.set, set) {
				add(t, name, index)
			}
			items = pending[t]
			slices.SortStableFunc(items, func(a, b item) int { return cmp.Compare(a.index, b.index) })
		}
		prev := t.set
		t.set = set
		if len(items) == 0 {
			continue // a new stage's tags on the content the client holds
		}
		msgs := make([]outMsg, 0, len(items))
		for _, it := range items {
			if !t.caps.Shadow && prev != nil && !holds(prev, it.name) && !holds(set, it.name) && h.isShadow(it.name) {
				// A shadow policy this connection is not served, and
				// did not hold: a delete would say nothing. (Of an
				// enforced policy it is sent: it may have applied at an
				// index within the batch.)
				continue
			}
			m, err := b.policyMessage(set, it.name, it.index)
			if err != nil {
				h.failLocked(t, err)
				msgs = nil
				break
			}
			msgs = append(msgs, m)
		}
		if msgs != nil {
			h.sendLocked(t, b, msgs)
		}
	}
}

// setLocked is the set c is to be served now.
func (h *Hub) setLocked(c *conn) *policyset.Set {
	return h.deps.Policies.SetFor(c.ident, c.ident.Employee, c.caps)
}

// holds reports whether set holds policy name.
func holds(set *policyset.Set, name string) bool {
	_, ok := set.Lookup(name)
	return ok
}

// diffNames is the policies whose state differs between two sets, in name
// order: held by one only, or held by both with other bytes.
func diffNames(from, to *policyset.Set) []string {
	var out []string
	i, j := 0, 0
	for i < len(from.Policies) || j < len(to.Policies) {
		switch {
		case j == len(to.Policies) || (i < len(from.Policies) && from.Policies[i].Policy.Name < to.Policies[j].Policy.Name):
			out = append(out, from.Policies[i].Policy.Name)
			i++
		case i == len(from.Policies) || to.Policies[j].Policy.Name < from.Policies[i].Policy.Name:
			out = append(out, to.Policies[j].Policy.Name)
			j++
		default:
			if !bytes.Equal(from.Policies[i].Stored, to.Policies[j].Stored) {
				out = append(out, to.Policies[j].Policy.Name)
			}
			i++
			j++
		}
	}
	return out
}

// employeeChangedLocked revokes or re-initialises the connections of a
// changed employee.
func (h *Hub) employeeChangedLocked(b *batch, e store.EntityChange) {
	conns := h.byEmployee[e.ID]
	if len(conns) == 0 {
		return
	}
	var emp *policy.Employee
	if e.Action != store.ActionDelete {
		var err error
		// The store may be ahead of this batch; its current record is
		// the one that counts (a later delete revokes now, not later).
		if emp, err = h.deps.Store.FindEmployee(e.ID); err != nil {
			h.logger.Error("read changed employee", "employee", e.ID, "err", err)
			return
		}
	}
	h.employeeStateLocked(b, e.ID, emp, slices.Collect(maps.Keys(conns)))
}

// employeeStateLocked brings the connections of employee id in line with
// its record emp (nil: deleted).
func (h *Hub) employeeStateLocked(b *batch, id string, emp *policy.Employee, conns []*conn) {
	switch {
	case emp == nil:
		for _, c := range conns {
			h.revokeLocked(c, reasonDeleted)
		}
	case !emp.Active():
		for _, c := range conns {
			h.revokeLocked(c, reasonDeactivated)
		}
	default:
		ident := emp.Identity()
		for _, c := range conns {
			switch {
			case c.ident == ident:
			case c.ident.Org != ident.Org:
				h.revokeLocked(c, reasonOrgChanged)
			default:
				h.logger.Info("feed connection moved to another team", "conn", c.addr, "employee", id,
					"from", c.ident.String(), "to", ident.String())
				h.reindexLocked(c, ident)
				h.sendInitLocked(c, b.at)
			}
		}
	}
}

// reindexLocked files c under ident, its employee's new team.
func (h *Hub) reindexLocked(c *conn, ident policy.Identity) {
	h.unindexLocked(c)
	c.ident = ident
	h.indexLocked(c)
}

// resyncLocked re-checks every connection's employee (the state may have
// been replaced wholesale) and sends every remaining connection a fresh
// init.
func (h *Hub) resyncLocked(b *batch) {
	byEmp := map[string][]*conn{}
	for c := range h.all {
		byEmp[c.ident.Employee] = append(byEmp[c.ident.Employee], c)
	}
	h.logger.Info("feed resync", "index", b.index, "connections", len(h.all))
	for id, conns := range byEmp {
		emp, err := h.deps.Store.FindEmployee(id)
		if err != nil {
			h.logger.Error("read employee for resync", "employee", id, "err", err)
			continue
		}
		for _, c := range conns {
			if emp == nil || !emp.Active() || emp.Org != c.ident.Org {
				h.employeeStateLocked(b, id, emp, []*conn{c}) // revoked
				continue
			}
			if ident := emp.Identity(); c.ident != ident {
				h.reindexLocked(c, ident)
			}
			h.sendInitLocked(c, b.at)
		}
	}
}

// targetsLocked returns the connections any of scopes applies to, using the
// narrowest index for each scope.
func (h *Hub) targetsLocked(scopes []policy.Scope) connSet {
	out := connSet{}
	for _, s := range scopes {
		var candidates connSet
		switch {
		case s.Employee != "":
			candidates = h.byEmployee[s.Employee]
		case s.Team != "":
			candidates = h.byTeam[teamKey{s.Org, s.Team}]
		case s.Org != "":
			candidates = h.byOrg[s.Org]
		default:
			candidates = h.all
		}
		for c := range candidates {
			if s.AppliesTo(c.ident) {
				out[c] = struct{}{}
			}
		}
	}
	return out
}

// sendLocked queues msgs for c. A batch that does not fit in c's free queue
// space is replaced by one init; a message that does not fit at all closes
// c as a slow consumer. It never blocks.
func (h *Hub) sendLocked(c *conn, b *batch, msgs []outMsg) {
	if len(msgs) > 1 && len(msgs) > h.cfg.SendBuffer-c.queued() {
		h.sendInitLocked(c, b.at)
		return
	}
	for _, m := range msgs {
		if !h.enqueueLocked(c, m) {
			return
		}
	}
}

// enqueueLocked queues m for c, or drops c as a slow consumer. A closing
// connection takes nothing more.
func (h *Hub) enqueueLocked(c *conn, m outMsg) bool {
	switch c.enqueue(m, h.cfg.SendBuffer) {
	case enqueued:
		return true
	case enqueueClosing:
		h.unindexLocked(c)
		return false
	}
	h.logger.Warn("feed connection too slow, closing", "conn", c.addr, "employee", c.ident.Employee,
		"org", c.ident.Org, "queued", h.cfg.SendBuffer)
	h.unindexLocked(c)
	c.closeWith(feedv1.CloseSlowConsumer, "send buffer full", nil)
	return false
}

// sendInitLocked queues a fresh init of the set c is to be served.
func (h *Hub) sendInitLocked(c *conn, at time.Time) {
	set := h.setLocked(c)
	m, err := h.initLocked(set, h.takesDecisions(c), at)
	if err != nil {
		h.failLocked(c, err)
		return
	}
	if h.enqueueLocked(c, m) {
		c.base = max(c.base, set.Index)
		c.set = set
	}
}

// initKey is what an init message is made of: the set, and whether it
// invites decision_log messages.
type initKey struct {
	set       *policyset.Set
	decisions bool
}

// initLocked builds the init message of set.
func (h *Hub) initLocked(set *policyset.Set, decisions bool, at time.Time) (outMsg, error) {
	key := initKey{set, decisions}
	data, ok := h.initCache[key]
	if !ok {
		var err error
		if data, err = encodeInit(set, decisions); err != nil {
			return outMsg{}, err
		}
		if len(h.initCache) >= initCacheSize {
			clear(h.initCache)
		}
		h.initCache[key] = data
	}
	return outMsg{data: data, digest: set.Version, at: at, policy: true}, nil
}

// revokeLocked sends revoke to c and closes it with 4403.
func (h *Hub) revokeLocked(c *conn, reason string) {
	h.logger.Info("feed connection revoked", "conn", c.addr, "employee", c.ident.Employee,
		"org", c.ident.Org, "reason", reason)
	h.unindexLocked(c)
	data, err := encode(feedv1.Revoke{Type: feedv1.TypeRevoke, Reason: reason})
	if err != nil {
		data = nil // the close code says it all
	}
	c.closeWith(feedv1.CloseRevoked, reason, data)
}

// failLocked closes c after an internal error (a message that cannot be
// encoded): better a reconnect than a client with a silently wrong set.
func (h *Hub) failLocked(c *conn, err error) {
	h.logger.Error("feed message failed, closing connection", "conn", c.addr, "err", err)
	h.unindexLocked(c)
	c.closeWith(websocket.StatusInternalError, "internal error", nil)
}

// indexLocked adds c to the indexes.
func (h *Hub) indexLocked(c *conn) {
	h.all[c] = struct{}{}
	addTo(h.byOrg, c.ident.Org, c)
	addTo(h.byTeam, teamKey{c.ident.Org, c.ident.Team}, c)
	addTo(h.byEmployee, c.ident.Employee, c)
	c.indexed = true
	h.metrics.byOrg.WithLabelValues(c.ident.Org).Set(float64(len(h.byOrg[c.ident.Org])))
}

// unindexLocked removes c from the indexes, so it gets no more messages;
// it stays live until its handler ends.
func (h *Hub) unindexLocked(c *conn) {
	if !c.indexed {
		return
	}
	c.indexed = false
	delete(h.all, c)
	removeFrom(h.byOrg, c.ident.Org, c)
	removeFrom(h.byTeam, teamKey{c.ident.Org, c.ident.Team}, c)
	removeFrom(h.byEmployee, c.ident.Employee, c)
	if n := len(h.byOrg[c.ident.Org]); n > 0 {
		h.metrics.byOrg.WithLabelValues(c.ident.Org).Set(float64(n))
	} else {
		h.metrics.byOrg.DeleteLabelValues(c.ident.Org)
	}
}

func addTo[K comparable](m map[K]connSet, k K, c *conn) {
	s := m[k]
	if s == nil {
		s = connSet{}
		m[k] = s
	}
	s[c] = struct{}{}
}

func removeFrom[K comparable](m map[K]connSet, k K, c *conn) {
	if s := m[k]; s != nil {
		delete(s, c)
		if len(s) == 0 {
			delete(m, k)
		}
	}
}

func scopeStrings(scopes []policy.Scope) []string {
	out := make([]string, len(scopes))
	for i, s := range scopes {
		if s.IsGlobal() {
			out[i] = "global"
		} else {
			out[i] = s.String()
		}
	}
	return out
}
