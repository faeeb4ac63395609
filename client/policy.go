package client

import (
	"encoding/json"
	"slices"
	"strings"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// Policy is a policy as delivered to a sidecar, whichever the transport.
// Values handed out by the SDK share their Labels and Spec with the set in
// force: treat them as read-only.
type Policy struct {
	Name     string            `json:"name"`
	Kind     string            `json:"kind"`
	Scope    Scope             `json:"scope"`
	Labels   map[string]string `json:"labels,omitempty"`
	Spec     json.RawMessage   `json:"spec"`
	Revision uint64            `json:"revision"`
	// Enforcement is EnforcementShadow for a shadow policy, which the SDK
	// evaluates apart and never enforces; "" otherwise. An Apply hook that
	// enforces policies itself must skip shadow ones.
	Enforcement string `json:"enforcement,omitempty"`
}

// KindToolPolicy is the kind IsBlocked evaluates.
const KindToolPolicy = "ToolPolicy"

// Update describes a change of the set in force, for Config.OnUpdate.
type Update struct {
	// Version is the policy-set version (the discovery stream's
	// version_info, the feed's digest).
	Version string
	// Index is the Raft index of the feed message that made the change (ws
	// only; 0 over gRPC).
	Index uint64
	// Policies is the whole set now in force, sorted by name (read-only).
	Policies []Policy
	// Full is true when a whole set was received (a discovery response, a
	// feed init), false for a feed upsert or delete.
	Full bool
	// Server is the node the change came from.
	Server string
}

// fromDiscovery takes p's labels and spec without copying them: a received
// response belongs to the SDK alone, so nothing else can change them.
func fromDiscovery(p *discoveryv1.Policy) Policy {
	out := Policy{
		Name:        p.GetName(),
		Kind:        p.GetKind(),
		Labels:      p.GetLabels(),
		Spec:        json.RawMessage(p.GetSpec()),
		Revision:    p.GetRevision(),
		Enforcement: p.GetEnforcement(),
	}
	if len(out.Labels) == 0 {
		out.Labels = nil
	}
	if s := p.GetScope(); s != nil {
		out.Scope = Scope{Org: s.GetOrg(), Team: s.GetTeam(), Employee: s.GetEmployee()}
	}
	return out
}

func fromFeed(p feedv1.Policy) Policy {
	return Policy{
		Name:        p.Name,
		Kind:        p.Kind,
		Scope:       Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
		Labels:      p.Labels,
		Spec:        p.Spec,
		Revision:    p.Revision,
		Enforcement: p.Enforcement,
	}
}

// sortByName sorts a set by name and drops earlier duplicates of a name
// (the last one wins).
func sortByName(ps []Policy) []Policy {
	slices.SortStableFunc(ps, func(a, b Policy) int { return strings.Compare(a.Name, b.Name) })
	out := ps[:0]
	for i, p := range ps {
		if i+1 < len(ps) && ps[i+1].Name == p.Name {
			continue
		}
		out = append(out, p)
	}
	return out
}

// withUpsert returns a copy of set (sorted by name) with p added or
// replacing the policy of the same name.
func withUpsert(set []Policy, p Policy) []Policy {
	i, found := slices.BinarySearchFunc(set, p.Name, func(q Policy, name string) int { return strings.Compare(q.Name, name) })
	out := make([]Policy, 0, len(set)+1)
	out = append(out, set[:i]...)
	out = append(out, p)
	if found {
		i++
	}
	return append(out, set[i:]...)
}

// withDelete returns a copy of set without the policy named name, and
// whether it was there.
func withDelete(set []Policy, name string) ([]Policy, bool) {
	i, found := slices.BinarySearchFunc(set, name, func(q Policy, name string) int { return strings.Compare(q.Name, name) })
	if !found {
		return set, false
	}
	out := make([]Policy, 0, len(set)-1)
	out = append(out, set[:i]...)
	return append(out, set[i+1:]...), true
}
