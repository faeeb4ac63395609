// Package policyset keeps every policy of the local replica in memory, as
// stored, and answers "which policies apply to this identity, at which
// version" without reading the database. The discovery stream and the
// WebSocket feed both serve from it. The node's change dispatcher calls
// Update for every committed batch before it tells the listeners, so every
// set it gives existed at one Raft index. It also keeps the active staged
// rollouts (SetFor serves a cohort member the candidate set) and derives
// each set without its shadow policies. It does not write; the store does.
// See docs/sidecars.md.
package policyset

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// maxCached bounds the per-identity cache; past it the cache starts over.
// Identities come and go with connections, so an unbounded map would only
// grow.
const maxCached = 16384

// Set is the policies that apply to one identity. It is immutable once
// returned and may be shared, also between identities: every employee that
// no policy names shares its team's Set.
type Set struct {
	// Identity is the identity the set was computed for: the caller's, or
	// its team's (Employee "") when the set is the team's.
	Identity policy.Identity
	// Version is the policy-set version, equal to store.PolicySet's.
	Version string
	// Index is the applied index of the last change the index had taken in
	// when the set was computed.
	Index uint64
	// Policies apply to Identity, sorted by name.
	Policies []store.RawPolicy
	// Rollouts names the staged rollouts whose candidates the set holds,
	// as "<rollout id>:<stage>", in the order they began; nil for a stable
	// set.
	Rollouts []string

	// enforced is the set without its shadow policies, computed once
	// (WithoutShadow); the set itself when it holds none.
	enforced atomic.Pointer[Set]
}

// Lookup returns the policy named name if the set holds it.
func (s *Set) Lookup(name string) (store.RawPolicy, bool) {
	i, ok := slices.BinarySearchFunc(s.Policies, name, func(rp store.RawPolicy, n string) int {
		return strings.Compare(rp.Policy.Name, n)
	})
	if !ok {
		return store.RawPolicy{}, false
	}
	return s.Policies[i], true
}

// Index is the in-memory copy. Safe for concurrent use.
type Index struct {
	st *store.Store

	mu     sync.RWMutex
	byName map[string]store.RawPolicy
	names  []string // sorted
	// named counts, per employee, the policies scoped to that employee; an
	// employee absent from it shares its team's set.
	named map[string]int
	index uint64
	cache map[policy.Identity]*Set

	// Staged rollouts (rollouts.go). listRollouts is st.Rollouts; a test
	// may stand in for it.
	listRollouts func() ([]*commandv1.Rollout, uint64, error)
	rollouts     map[string]*rolloutEntry // active ones
	rolloutIDs   []string                 // rollouts' keys, in start order
	rolloutIndex uint64                   // rollout changes at or below it are held
	// rolloutNamed counts, per employee, the active rollouts' puts scoped
	// to that employee, as named does for stable policies.
	rolloutNamed map[string]int
	candCache    map[candKey]*Set
	// ended holds the rollouts that ended without completing, for
	// ChangedSince; a resume from before endedFloor is not covered by it.
	ended      map[string]endedRollout
	endedFloor uint64
}

// New loads every policy and every active rollout from st.
func New(st *store.Store) (*Index, error) {
	return newIndex(st, st.Rollouts)
}

func newIndex(st *store.Store, listRollouts func() ([]*commandv1.Rollout, uint64, error)) (*Index, error) {
	x := &Index{st: st, listRollouts: listRollouts, ended: map[string]endedRollout{}}
	if err := x.load(); err != nil {
		return nil, err
	}
	return x, nil
}

func (x *Index) load() error {
	all, index, err := x.st.RawPolicies()
	if err != nil {
		return fmt.Errorf("load policies: %w", err)
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.byName, x.names, x.index = all, names, index
	x.named = map[string]int{}
	for _, rp := range all {
		x.countNamed(rp, 1)
	}
	x.cache = map[policy.Identity]*Set{}
	// After the policies: rollout changes read are applied again by
	// Update (each carries the whole rollout), policy changes are not.
	return x.loadRolloutsLocked()
}

// countNamed adds delta to the count of rp's employee, if rp is scoped to
// one.
func (x *Index) countNamed(rp store.RawPolicy, delta int) {
	e := rp.Policy.Scope.Employee
	if e == "" {
		return
	}
	if x.named[e] += delta; x.named[e] <= 0 {
		delete(x.named, e)
	}
}

// Update takes in one committed batch: each policy it changed, in the
// state the change itself carries (store.EntityChange.Data), so that the
// index always holds the state as of one index, never a mix of a policy's
// later state with another's earlier one (a set that never existed, which
// re-reading the store while later batches are committed would give). A
// batch the index already holds, because a reload read the store past it,
// is skipped.
func (x *Index) Update(c store.Change) (err error) {
	if c.Resync {
		if err := x.load(); err != nil {
			return err
		}
		x.mu.Lock()
		x.index = max(x.index, c.Index)
		x.rolloutIndex = max(x.rolloutIndex, c.Index)
		x.mu.Unlock()
		return nil
	}
	type change struct {
		name string
		rp   store.RawPolicy
		ok   bool // false: deleted
	}
	var changes []change
	var scopes []policy.Scope
	var rollouts []rolloutChange
	for _, e := range c.Entities {
		if e.Type == store.EntityRollout {
			rc, err := decodeRollout(e)
			if err != nil {
				return err
			}
			rollouts = append(rollouts, rc)
			continue
		}
		if e.Type != store.EntityPolicy {
			continue
		}
		ch := change{name: e.ID}
		if e.Action != store.ActionDelete {
			if e.Data == nil {
				return fmt.Errorf("change of policy %q at index %d carries no state: subscribe with store.SubscribeWithData", e.ID, e.Index)
			}
			p := e.Policy
			if p == nil {
				var err error
				if p, err = policy.DecodeStored(e.Data); err != nil {
					return fmt.Errorf("decode changed policy %q at index %d: %w", e.ID, e.Index, err)
				}
			}
			ch.rp, ch.ok = store.RawPolicy{Policy: p, Stored: e.Data}, true
		}
		changes = append(changes, ch)
		scopes = append(scopes, e.Scopes...)
	}

	x.mu.Lock()
	defer x.mu.Unlock()
	if len(rollouts) > 0 && c.Index > x.rolloutIndex {
		// After the policies, which a completed rollout's batch also
		// changes; deferred so that it runs after them.
		defer func() {
			x.rolloutIndex = c.Index
			if err == nil {
				err = x.applyRolloutsLocked(c.Index, rollouts)
			}
		}()
	}
	if c.Index <= x.index {
		return nil // a reload holds this batch already
	}
	x.index = c.Index
	if len(changes) == 0 {
		return nil
	}
	resort := false
	for _, ch := range changes {
		old, had := x.byName[ch.name]
		if had {
			x.countNamed(old, -1)
		}
		switch {
		case ch.ok:
			x.byName[ch.name] = ch.rp
			x.countNamed(ch.rp, 1)
			resort = resort || !had
		case had:
			delete(x.byName, ch.name)
			resort = true
		}
	}
	if resort {
		x.names = x.names[:0]
		for n := range x.byName {
			x.names = append(x.names, n)
		}
		slices.Sort(x.names)
	}
	for id := range x.cache {
		if Affects(scopes, id) {
			delete(x.cache, id)
		}
	}
	for k := range x.candCache {
		if Affects(scopes, k.id) {
			delete(x.candCache, k)
		}
	}
	return nil
}

// Affects reports whether a change to policies with the given scopes can
// change the set of identity id.
func Affects(scopes []policy.Scope, id policy.Identity) bool {
	for _, s := range scopes {
		if s.AppliesTo(id) {
			return true
		}
	}
	return false
}

// Set returns the policies that apply to id, computed at most once per
// change that affects id. It returns the same *Set until such a change (or
// one that makes a policy name id's employee) is taken in.
func (x *Index) Set(id policy.Identity) *Set {
	x.mu.RLock()
	id = x.keyLocked(id)
	s, ok := x.cache[id]
	x.mu.RUnlock()
	if ok {
		return s
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.setLocked(id)
}

// setLocked is Set under the write lock.
func (x *Index) setLocked(id policy.Identity) *Set {
	id = x.keyLocked(id)
	if s, ok := x.cache[id]; ok {
		return s
	}
	s := &Set{Identity: id, Index: x.index}
	h := store.NewSetHash()
	for _, n := range x.names {
		rp := x.byName[n]
		if !rp.Policy.Scope.AppliesTo(id) {
			continue
		}
		h.Add(n, rp.Stored)
		s.Policies = append(s.Policies, rp)
	}
	s.Version = h.Sum()
	if len(x.cache) >= maxCached {
		x.cache = map[policy.Identity]*Set{}
	}
	x.cache[id] = s
	return s
}

// keyLocked is the identity whose set id has: its team's when no policy
// names its employee. A policy applies to an employee only through its
// org, its team or its name (Scope.AppliesTo), so without the name the
// applicable policies are the team identity's, and a change that affects
// the team identity's set is exactly one that affects id's.
func (x *Index) keyLocked(id policy.Identity) policy.Identity {
	if id.Employee != "" && x.named[id.Employee] == 0 {
		id.Employee = ""
	}
	return id
}

// Get returns one policy as stored.
func (x *Index) Get(name string) (store.RawPolicy, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	rp, ok := x.byName[name]
	return rp, ok
}

// Applied is the index of the last change taken in.
func (x *Index) Applied() uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.index
}
