package policyset

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/policy"
)

// Impact is the stable policies as of one applied index with a change set
// beside them, for replaying logged decisions: the set each identity has
// and the set it would have with the changes. It holds a copy of the
// index's policy table, so a replay that takes minutes sees one state
// while the index moves on. Safe for concurrent use.
type Impact struct {
	mu    sync.Mutex
	snap  *Index        // the copy; its mu is unused, mu guards it
	entry *rolloutEntry // the change set, composed as a rollout's
	// named are the employees the change set's puts name, which then
	// cannot share their team's candidate set.
	named map[string]bool
	cache map[policy.Identity]*impactSets
}

// impactSets is one identity's answer, shared by every identity of its key.
type impactSets struct {
	baseline, candidate []client.Policy
	affected            bool
}

// ImpactID is the rollout id a change set is composed under: candidate puts
// carry no source and are stored at revision 0, as a rollout's are.
const ImpactID = "impact"

// Impact copies the stable policies and composes changes over them the way
// a rollout's changes are (a put replaces the whole policy of its name, a
// delete removes one). An op other than put or delete, or a change without
// a name, is an error. Active rollouts are not part of either set: the
// baseline is what every sidecar outside a cohort holds.
func (x *Index) Impact(changes []*commandv1.RolloutChange) (*Impact, error) {
	for i, ch := range changes {
		name := ch.GetName()
		if ch.GetOp() == "put" {
			name = ch.GetPolicy().GetName()
		}
		if name == "" {
			return nil, fmt.Errorf("change %d (%q): no policy name", i, ch.GetOp())
		}
	}
	x.mu.RLock()
	snap := &Index{
		byName: maps.Clone(x.byName),
		names:  slices.Clone(x.names),
		named:  maps.Clone(x.named),
		index:  x.index,
		cache:  map[policy.Identity]*Set{},
	}
	x.mu.RUnlock()
	e, err := snap.newEntry(&commandv1.Rollout{Id: ImpactID, Changes: changes})
	if err != nil {
		return nil, err
	}
	im := &Impact{snap: snap, entry: e, named: map[string]bool{}, cache: map[policy.Identity]*impactSets{}}
	for _, s := range e.scopes {
		if s.Employee != "" {
			im.named[s.Employee] = true
		}
	}
	return im, nil
}

// Index is the applied index of the stable policies the replay sees.
func (im *Impact) Index() uint64 { return im.snap.index }

// Sets is the set of identity (org, team, employee) now (baseline) and
// with the changes (candidate), as a sidecar of that identity receives
// them, shadow policies included; affected is false, and both sets nil,
// when the changes touch neither. The slices are shared: read-only.
func (im *Impact) Sets(org, team, employee string) (baseline, candidate []client.Policy, affected bool) {
	id := policy.Identity{Org: org, Team: team, Employee: employee}
	im.mu.Lock()
	defer im.mu.Unlock()
	x := im.snap
	// The candidate's key is at least as specific as the baseline's
	// (keyLocked), so one cache entry answers for both.
	if id.Employee != "" && x.named[id.Employee] == 0 && !im.named[id.Employee] {
		id.Employee = ""
	}
	s := im.cache[id]
	if s == nil {
		s = &impactSets{affected: x.affectsLocked(im.entry, id)}
		if s.affected {
			s.baseline = ClientPolicies(x.setLocked(id))
			s.candidate = ClientPolicies(x.composeLocked(id, []*rolloutEntry{im.entry}))
		}
		if len(im.cache) >= maxCached {
			clear(im.cache)
		}
		im.cache[id] = s
	}
	return s.baseline, s.candidate, s.affected
}

// ClientPolicies is s as the SDK holds it: what a sidecar of s's identity
// evaluates with.
func ClientPolicies(s *Set) []client.Policy {
	out := make([]client.Policy, 0, len(s.Policies))
	for _, rp := range s.Policies {
		p := rp.Policy
		out = append(out, client.Policy{
			Name:        p.Name,
			Kind:        p.Kind,
			Scope:       client.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
			Labels:      p.Labels,
			Spec:        p.Spec,
			Revision:    p.Revision,
			Enforcement: p.Enforcement,
		})
	}
	return out
}
