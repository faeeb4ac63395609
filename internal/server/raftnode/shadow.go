package raftnode

import (
	"context"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// maxShadowPolicies bounds the policies one LocalShadow asks for (a
// rollout has at most 100 changes).
const maxShadowPolicies = 256

func (s *clusterService) LocalShadow(_ context.Context, req *clusterv1.LocalShadowRequest) (*clusterv1.LocalShadowResponse, error) {
	names := req.GetPolicies()
	if len(names) > maxShadowPolicies {
		names = names[:maxShadowPolicies]
	}
	return &clusterv1.LocalShadowResponse{NodeId: s.n.id, Scopes: s.n.localShadow(names)}, nil
}

func (n *Node) localShadow(names []string) []*clusterv1.ShadowScopeCount {
	if n.deps.LocalShadow == nil {
		return nil
	}
	return n.deps.LocalShadow(names)
}

// ShadowCounts gathers the shadow-policy counts of the named policies from every
// member of the Raft configuration, asking the others in parallel over the
// internal API (as Clients does). The counts are each node's, per policy
// and scope, not summed; a member that does not answer in time is named in
// unreachable.
func (n *Node) ShadowCounts(ctx context.Context, names []string) ([]*clusterv1.ShadowScopeCount, []string, error) {
	return askMembers(ctx, n, "report its shadow counts", n.localShadow(names),
		func(ctx context.Context, c clusterv1.ClusterClient) ([]*clusterv1.ShadowScopeCount, error) {
			resp, err := c.LocalShadow(ctx, &clusterv1.LocalShadowRequest{Policies: names})
			return resp.GetScopes(), err
		})
}
