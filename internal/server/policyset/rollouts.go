package policyset

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// Capabilities a client may declare, on the discovery stream
// (PolicyDiscoveryRequest.capabilities) and the feed (?capabilities=).
const (
	CapRollouts    = feedv1.CapabilityRollouts
	CapShadow      = feedv1.CapabilityShadow
	CapDecisionLog = feedv1.CapabilityDecisionLog
)

// maxEnded bounds how many ended rollouts the index remembers for ChangedSince.
const maxEnded = 1024

// Caps is what a client declared it can handle beyond version 1.
type Caps struct {
	// Rollouts: the client may be put in a staged rollout's cohort.
	Rollouts bool
	// Shadow: the client evaluates shadow policies without enforcing them.
	Shadow bool
	// DecisionLog: the client records decisions and ships them on the
	// feed (gRPC clients call ReportDecisions and need not declare it).
	DecisionLog bool
}

// ParseCaps reads declared capabilities; unknown values are ignored, so that
// a newer client works with this server.
func ParseCaps(values []string) Caps {
	var c Caps
	for _, v := range values {
		switch strings.TrimSpace(v) {
		case CapRollouts:
			c.Rollouts = true
		case CapShadow:
			c.Shadow = true
		case CapDecisionLog:
			c.DecisionLog = true
		}
	}
	return c
}

// List is the declared capabilities in a fixed order, as ClientInfo shows them.
func (c Caps) List() []string {
	var out []string
	if c.Rollouts {
		out = append(out, CapRollouts)
	}
	if c.Shadow {
		out = append(out, CapShadow)
	}
	if c.DecisionLog {
		out = append(out, CapDecisionLog)
	}
	return out
}

// InCohort reports whether member is in the cohort of rollout id at a stage
// of percent: bucket = fnv1a64(id + "\x00" + member) % 10000, in iff
// bucket < percent*100. It depends on nothing else, so every node and every
// reconnect agree, and raising percent only adds members.
func InCohort(id, member string, percent uint32) bool {
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(member))
	return h.Sum64()%10000 < uint64(min(percent, 100))*100
}

// delivers reports whether a rollout delivers its candidate: a halted one
// only while it stays (one that rolls back is rolled_back, not halted).
func delivers(r *commandv1.Rollout) bool {
	return store.RolloutActive(r.GetState()) && (r.GetState() != store.RolloutHalted || r.GetOnHalt() == store.OnHaltStay)
}

// rolloutEntry is an active rollout as the index serves it.
type rolloutEntry struct {
	id      string
	tag     string // "id:stage"
	percent uint32
	puts    map[string]store.RawPolicy
	deletes map[string]bool
	names   []string       // every changed policy
	scopes  []policy.Scope // the puts' scopes
}

// endedRollout is a rollout that stopped delivering its candidate without
// completing: a client that held the candidate then must be resynced.
type endedRollout struct {
	start, end uint64
	scopes     []policy.Scope
}

// candKey names a cached candidate set: the identity (its team's when
// neither a policy nor a rollout names its employee) and its tags.
type candKey struct {
	id   policy.Identity
	tags string
}

func (x *Index) newEntry(r *commandv1.Rollout) (*rolloutEntry, error) {
	e := &rolloutEntry{
		id:      r.GetId(),
		tag:     r.GetId() + ":" + strconv.FormatUint(uint64(r.GetStage()), 10),
		puts:    map[string]store.RawPolicy{},
		deletes: map[string]bool{},
	}
	if st := r.GetStages(); int(r.GetStage()) < len(st) {
		e.percent = st[r.GetStage()].GetPercent()
	}
	for _, ch := range r.GetChanges() {
		switch ch.GetOp() {
		case "put":
			rp, err := store.CandidatePolicy(r, ch.GetPolicy())
			if err != nil {
				return nil, err
			}
			e.puts[rp.Policy.Name] = rp
			e.names = append(e.names, rp.Policy.Name)
			e.scopes = append(e.scopes, rp.Policy.Scope)
		case "delete":
			e.deletes[ch.GetName()] = true
			e.names = append(e.names, ch.GetName())
		default:
			return nil, fmt.Errorf("rollout %s: change op %q", r.GetId(), ch.GetOp())
		}
	}
	slices.Sort(e.names)
	return e, nil
}

// affectsLocked reports whether e changes id's set: a put's scope applies
// to id, or the stable policy it replaces or deletes does.
func (x *Index) affectsLocked(e *rolloutEntry, id policy.Identity) bool {
	if Affects(e.scopes, id) {
		return true
	}
	for _, n := range e.names {
		if rp, ok := x.byName[n]; ok && rp.Policy.Scope.AppliesTo(id) {
			return true
		}
	}
	return false
}

// scopesLocked is every scope e's changes touch, old and new.
func (x *Index) scopesLocked(e *rolloutEntry) []policy.Scope {
	out := slices.Clone(e.scopes)
	for _, n := range e.names {
		if rp, ok := x.byName[n]; ok {
			out = append(out, rp.Policy.Scope)
		}
	}
	return out
}

// loadRollouts replaces the active rollouts with the stored ones. Called
// under x.mu after the policies are loaded, so that the rollouts are read
// at an index at least the policies'.
func (x *Index) loadRolloutsLocked() error {
	x.rollouts = map[string]*rolloutEntry{}
	x.rolloutNamed = map[string]int{}
	x.candCache = map[candKey]*Set{}
	list, index, err := x.listRollouts()
	if err != nil {
		return fmt.Errorf("load rollouts: %w", err)
	}
	x.rolloutIndex = index
	for _, r := range list {
		if delivers(r) {
			if err := x.putRolloutLocked(r); err != nil {
				return err
			}
			continue
		}
		if r.GetState() != store.RolloutCompleted {
			// When it ended is not stored; the load is as late as it can
			// have been, which only makes ChangedSince resync more.
			x.addEndedLocked(r.GetId(), index, x.scopesOf(r))
		}
	}
	x.sortRolloutsLocked()
	return nil
}

// scopesOf is the scopes r's changes touch, from r alone and the stable set.
func (x *Index) scopesOf(r *commandv1.Rollout) []policy.Scope {
	var out []policy.Scope
	for _, ch := range r.GetChanges() {
		name := ch.GetName()
		if p := ch.GetPolicy(); p != nil {
			sc := p.GetScope()
			out = append(out, policy.Scope{Org: sc.GetOrg(), Team: sc.GetTeam(), Employee: sc.GetEmployee()})
			name = p.GetName()
		}
		if rp, ok := x.byName[name]; ok {
			out = append(out, rp.Policy.Scope)
		}
	}
	return out
}

func (x *Index) putRolloutLocked(r *commandv1.Rollout) error {
	e, err := x.newEntry(r)
	if err != nil {
		return err
	}
	x.dropRolloutLocked(r.GetId())
	x.rollouts[e.id] = e
	for _, s := range e.scopes {
		if s.Employee != "" {
			x.rolloutNamed[s.Employee]++
		}
	}
	return nil
}

func (x *Index) dropRolloutLocked(id string) *rolloutEntry {
	e := x.rollouts[id]
	if e == nil {
		return nil
	}
	delete(x.rollouts, id)
	for _, s := range e.scopes {
		if s.Employee != "" {
			if x.rolloutNamed[s.Employee]--; x.rolloutNamed[s.Employee] <= 0 {
				delete(x.rolloutNamed, s.Employee)
			}
		}
	}
	return e
}

func (x *Index) sortRolloutsLocked() {
	x.rolloutIDs = x.rolloutIDs[:0]
	for id := range x.rollouts {
		x.rolloutIDs = append(x.rolloutIDs, id)
	}
	// By start index ("r<index>"), so tags read in the order rollouts began.
	slices.SortFunc(x.rolloutIDs, func(a, b string) int {
		return cmp.Or(cmp.Compare(rolloutStart(a), rolloutStart(b)), cmp.Compare(a, b))
	})
}

// rolloutStart is the index of a rollout's start, from its id "r<index>";
// 0 if the id is not of that form.
func rolloutStart(id string) uint64 {
	n, err := strconv.ParseUint(strings.TrimPrefix(id, "r"), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func (x *Index) addEndedLocked(id string, end uint64, scopes []policy.Scope) {
	if len(x.ended) >= maxEnded {
		// Forget the oldest; a resume from before it then resyncs.
		oldest := ""
		for k, v := range x.ended {
			if oldest == "" || v.end < x.ended[oldest].end {
				oldest = k
			}
		}
		x.endedFloor = max(x.endedFloor, x.ended[oldest].end)
		delete(x.ended, oldest)
	}
	x.ended[id] = endedRollout{start: rolloutStart(id), end: end, scopes: scopes}
}

// rolloutChange is one decoded rollout change of a batch.
type rolloutChange struct {
	id     string
	r      *commandv1.Rollout // nil: deleted
	scopes []policy.Scope
}

func decodeRollout(e store.EntityChange) (rolloutChange, error) {
	rc := rolloutChange{id: e.ID, scopes: e.Scopes}
	if e.Action == store.ActionDelete || e.Data == nil {
		return rc, nil
	}
	r := &commandv1.Rollout{}
	if err := proto.Unmarshal(e.Data, r); err != nil {
		return rc, fmt.Errorf("decode changed rollout %q at index %d: %w", e.ID, e.Index, err)
	}
	rc.r = r
	return rc, nil
}

// applyRolloutsLocked takes in a batch's rollout changes, after its policy
// changes.
func (x *Index) applyRolloutsLocked(index uint64, changes []rolloutChange) error {
	for _, rc := range changes {
		old := x.rollouts[rc.id]
		var oldScopes []policy.Scope
		if old != nil {
			oldScopes = x.scopesLocked(old)
		}
		if rc.r != nil && delivers(rc.r) {
			if err := x.putRolloutLocked(rc.r); err != nil {
				return err
			}
			continue
		}
		x.dropRolloutLocked(rc.id)
		if old != nil && (rc.r == nil || rc.r.GetState() != store.RolloutCompleted) {
			x.addEndedLocked(rc.id, index, append(oldScopes, rc.scopes...))
		}
	}
	x.sortRolloutsLocked()
	// Rare (a handful per rollout): start the candidates over.
	clear(x.candCache)
	return nil
}

// candKeyLocked is the identity whose candidate sets id shares: its team's
// when neither a stable policy nor an active rollout's put names its
// employee.
func (x *Index) candKeyLocked(id policy.Identity) policy.Identity {
	if id.Employee != "" && x.named[id.Employee] == 0 && x.rolloutNamed[id.Employee] == 0 {
		id.Employee = ""
	}
	return id
}

// cohortLocked is the active rollouts that change id's set and whose
// cohort member is in, in start order.
func (x *Index) cohortLocked(id policy.Identity, member string) []*rolloutEntry {
	var out []*rolloutEntry
	for _, rid := range x.rolloutIDs {
		e := x.rollouts[rid]
		if InCohort(rid, member, e.percent) && x.affectsLocked(e, id) {
			out = append(out, e)
		}
	}
	return out
}

// SetFor is the set a client of identity id, cohort member member (its
// discovery client_address or feed employee id) and capabilities caps is
// served: its stable set (Set) unless it declared rollouts and is in the
// cohort of an active rollout that changes its set, then the candidate
// set, with Rollouts naming the candidates. Candidate sets are cached per
// identity and rollouts, so every cohort member of a team shares one. A
// client without the shadow capability gets the set WithoutShadow.
func (x *Index) SetFor(id policy.Identity, member string, caps Caps) *Set {
	s := x.setFor(id, member, caps)
	if !caps.Shadow {
		return s.WithoutShadow()
	}
	return s
}

func (x *Index) setFor(id policy.Identity, member string, caps Caps) *Set {
	if !caps.Rollouts || member == "" {
		return x.Set(id)
	}
	x.mu.RLock()
	if len(x.rollouts) == 0 {
		x.mu.RUnlock()
		return x.Set(id)
	}
	in := x.cohortLocked(id, member)
	if len(in) == 0 {
		x.mu.RUnlock()
		return x.Set(id)
	}
	key := candKey{x.candKeyLocked(id), joinTags(in)}
	s, ok := x.candCache[key]
	x.mu.RUnlock()
	if ok {
		return s
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if in = x.cohortLocked(id, member); len(in) == 0 {
		return x.setLocked(id)
	}
	return x.candidateLocked(id, in)
}

// SetTagged is the set of identity id with the candidates of the rollouts
// tags names ("id:stage", as Set.Rollouts), or false when one of them no
// longer delivers at that stage or no longer changes id's set. No tags: the
// stable set.
func (x *Index) SetTagged(id policy.Identity, tags []string) (*Set, bool) {
	if len(tags) == 0 {
		return x.Set(id), true
	}
	// A cached set was computed for exactly these tags, which the cache
	// drops whenever a rollout changes, so it is current.
	x.mu.RLock()
	s, ok := x.candCache[candKey{x.candKeyLocked(id), strings.Join(tags, ",")}]
	x.mu.RUnlock()
	if ok {
		return s, true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	in := make([]*rolloutEntry, 0, len(tags))
	for _, t := range tags {
		rid, _, _ := strings.Cut(t, ":")
		e := x.rollouts[rid]
		if e == nil || e.tag != t || !x.affectsLocked(e, id) {
			return nil, false
		}
		in = append(in, e)
	}
	slices.SortFunc(in, func(a, b *rolloutEntry) int {
		return cmp.Compare(slices.Index(x.rolloutIDs, a.id), slices.Index(x.rolloutIDs, b.id))
	})
	return x.candidateLocked(id, in), true
}

func joinTags(in []*rolloutEntry) string {
	var b strings.Builder
	for i, e := range in {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.tag)
	}
	return b.String()
}

// candidateLocked returns, from the cache or computed, id's stable set with
// the changes of the rollouts in applied.
func (x *Index) candidateLocked(id policy.Identity, in []*rolloutEntry) *Set {
	key := candKey{x.candKeyLocked(id), joinTags(in)}
	if s, ok := x.candCache[key]; ok {
		return s
	}
	s := x.composeLocked(key.id, in)
	if len(x.candCache) >= maxCached {
		clear(x.candCache)
	}
	x.candCache[key] = s
	return s
}

// composeLocked is id's stable set with the changes of the rollouts in
// (the earlier wins where two change one policy), computed afresh.
func (x *Index) composeLocked(id policy.Identity, in []*rolloutEntry) *Set {
	s := &Set{Identity: id, Index: x.index}
	over := map[string]*store.RawPolicy{} // nil: deleted
	names := slices.Clone(x.names)
	for _, e := range in {
		s.Rollouts = append(s.Rollouts, e.tag)
		for n, rp := range e.puts {
			if _, ok := over[n]; ok {
				continue // two rollouts never stage one policy; the earlier wins
			}
			over[n] = &rp
			if _, stable := x.byName[n]; !stable {
				names = append(names, n)
			}
		}
		for n := range e.deletes {
			if _, ok := over[n]; !ok {
				over[n] = nil
			}
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	h := store.NewSetHash()
	for _, n := range names {
		rp, staged := over[n]
		if !staged {
			stable := x.byName[n]
			rp = &stable
		}
		if rp == nil || !rp.Policy.Scope.AppliesTo(id) {
			continue
		}
		h.Add(n, rp.Stored)
		s.Policies = append(s.Policies, *rp)
	}
	s.Version = h.Sum()
	return s
}

// ChangedSince reports whether what a client of identity id holds as of
// index since may be a rollout's candidate that the event log does not
// describe: an active rollout changes id's set, or one that changed it
// ended without completing after since. A feed resume then sends init
// rather than a replay, which could leave a cohort member with a candidate
// that was rolled back, or hand it the stable state of a policy under
// rollout.
func (x *Index) ChangedSince(id policy.Identity, since uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if since < x.endedFloor {
		return true
	}
	for _, e := range x.rollouts {
		if x.affectsLocked(e, id) {
			return true
		}
	}
	for _, e := range x.ended {
		if since >= e.start && since < e.end && Affects(e.scopes, id) {
			return true
		}
	}
	return false
}

// RolloutScopes is every scope that the active rollout id's changes touch
// (old and new), or false if it is not active.
func (x *Index) RolloutScopes(id string) ([]policy.Scope, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e := x.rollouts[id]
	if e == nil {
		return nil, false
	}
	return x.scopesLocked(e), true
}

// HasRollouts reports whether any rollout is active.
func (x *Index) HasRollouts() bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.rollouts) > 0
}
