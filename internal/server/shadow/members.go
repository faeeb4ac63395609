package shadow

import (
	"context"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/server/members"
)

// maxPolicies bounds the policies one LocalShadow asks for (a rollout has
// at most 100 changes).
const maxPolicies = 256

// ClusterCounts gathers the counts of the named policies from every member:
// this node's, then what each other member answers to LocalShadow. The
// counts are each node's, per policy and scope, not summed; a member that
// does not answer in time is named in unreachable.
func (a *Aggregator) ClusterCounts(ctx context.Context, m members.Asker, names []string) ([]*clusterv1.ShadowScopeCount, []string, error) {
	return members.Gather(ctx, m, "report its shadow counts", a.localCounts(names), func(ctx context.Context, c clusterv1.ClusterClient) ([]*clusterv1.ShadowScopeCount, error) {
		resp, err := c.LocalShadow(ctx, &clusterv1.LocalShadowRequest{Policies: names})
		return resp.GetScopes(), err
	})
}

// LocalShadow answers a member's LocalShadow with this node's counts of the
// policies it names, the first maxPolicies of them.
func (a *Aggregator) LocalShadow(_ context.Context, req *clusterv1.LocalShadowRequest) (*clusterv1.LocalShadowResponse, error) {
	names := req.GetPolicies()
	if len(names) > maxPolicies {
		names = names[:maxPolicies]
	}
	return &clusterv1.LocalShadowResponse{NodeId: a.nodeID, Scopes: a.localCounts(names)}, nil
}

// localCounts is this node's counts of the named policies, per policy and
// scope.
func (a *Aggregator) localCounts(names []string) []*clusterv1.ShadowScopeCount {
	var out []*clusterv1.ShadowScopeCount
	for _, name := range names {
		for _, sc := range a.Local(name) {
			out = append(out, &clusterv1.ShadowScopeCount{Policy: name, Scope: sc.Scope,
				WouldBlock: sc.WouldBlock, WouldAllow: sc.WouldAllow, Evaluated: sc.Evaluated})
		}
	}
	return out
}
