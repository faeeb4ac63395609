package adminapi

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/store"
)

// shadowCounter is the part of Backend that gathers shadow-policy counts.
type shadowCounter interface {
	// ShadowCounts gathers the counts of the named policies from every
	// member, per node, policy and scope; members that did not answer are
	// named in unreachable.
	ShadowCounts(ctx context.Context, names []string) (counts []*clusterv1.ShadowScopeCount, unreachable []string, err error)
}

// ShadowView is GET /v1/policies/{name}/shadow: what the sidecars that
// evaluate shadow policy name reported, summed across nodes. Counts are
// each node's since it started (docs/rollouts.md).
type ShadowView struct {
	Policy string       `json:"policy"`
	Totals ShadowTotals `json:"totals"`
	// ByScope splits the totals by the reporting sidecars' scope
	// (org/team/employee), in order.
	ByScope []ShadowScope `json:"by_scope"`
	// Unreachable lists members that did not answer; their sidecars'
	// counts are missing.
	Unreachable []string `json:"unreachable_nodes,omitempty"`
}

// ShadowTotals are a shadow policy's counts: would_block (it denied, the
// enforced policies allowed), would_allow (the reverse), evaluated.
type ShadowTotals struct {
	WouldBlock uint64 `json:"would_block"`
	WouldAllow uint64 `json:"would_allow"`
	Evaluated  uint64 `json:"evaluated"`
}

// ShadowScope is the counts of one scope's sidecars.
type ShadowScope struct {
	Scope string `json:"scope"`
	ShadowTotals
}

func (a *API) routeShadow() {
	a.route("GET /v1/policies/{name}/shadow", auth.RoleRead, a.getShadow)
}

func (a *API) getShadow(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	views, err := a.shadowViews(r.Context(), []string{name})
	if err != nil {
		return err
	}
	v := views[0]
	if v.Totals == (ShadowTotals{}) {
		// Counts outlive a deleted policy; a name that never had either
		// is most likely a typo.
		if _, err := a.b.Store().GetPolicy(name); errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

// shadowViews sums, per policy of names, the counts every member holds.
func (a *API) shadowViews(ctx context.Context, names []string) ([]ShadowView, error) {
	counts, unreachable, err := a.b.ShadowCounts(ctx, names)
	if err != nil {
		return nil, err
	}
	out := make([]ShadowView, len(names))
	for i, n := range names {
		out[i] = ShadowView{Policy: n, ByScope: []ShadowScope{}, Unreachable: unreachable}
	}
	for _, c := range counts {
		i := slices.Index(names, c.GetPolicy())
		if i < 0 {
			continue
		}
		v := &out[i]
		v.Totals.WouldBlock += c.GetWouldBlock()
		v.Totals.WouldAllow += c.GetWouldAllow()
		v.Totals.Evaluated += c.GetEvaluated()
		j, found := slices.BinarySearchFunc(v.ByScope, c.GetScope(), func(s ShadowScope, scope string) int { return strings.Compare(s.Scope, scope) })
		if !found {
			v.ByScope = slices.Insert(v.ByScope, j, ShadowScope{Scope: c.GetScope()})
		}
		v.ByScope[j].WouldBlock += c.GetWouldBlock()
		v.ByScope[j].WouldAllow += c.GetWouldAllow()
		v.ByScope[j].Evaluated += c.GetEvaluated()
	}
	return out, nil
}
