package adminclient

import (
	"context"
	"net/http"
	"net/url"
)

// ShadowView is GET /v1/policies/{name}/shadow: a shadow policy's counts
// reported by the sidecars, summed across nodes (each node's since it
// started).
type ShadowView struct {
	Policy      string        `json:"policy"`
	Totals      ShadowTotals  `json:"totals"`
	ByScope     []ShadowScope `json:"by_scope"`
	Unreachable []string      `json:"unreachable_nodes,omitempty"`
}

// ShadowTotals are would_block (the shadow policy denied, the enforced ones
// allowed), would_allow (the reverse), evaluated.
type ShadowTotals struct {
	WouldBlock uint64 `json:"would_block"`
	WouldAllow uint64 `json:"would_allow"`
	Evaluated  uint64 `json:"evaluated"`
}

// ShadowScope is the counts of the sidecars of one scope (org/team/employee).
type ShadowScope struct {
	Scope string `json:"scope"`
	ShadowTotals
}

// PolicyShadow reads the shadow counts of policy name, summed across nodes.
func (c *Client) PolicyShadow(ctx context.Context, name string) (*ShadowView, error) {
	var out ShadowView
	return &out, c.Do(ctx, http.MethodGet, "/v1/policies/"+url.PathEscape(name)+"/shadow", nil, nil, &out)
}
