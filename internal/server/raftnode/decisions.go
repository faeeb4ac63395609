package raftnode

import (
	"context"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// LocalDecisions is the decision log's (Deps.LocalDecisions).
func (s *clusterService) LocalDecisions(ctx context.Context, req *clusterv1.LocalDecisionsRequest) (*clusterv1.LocalDecisionsResponse, error) {
	if s.n.deps.LocalDecisions == nil {
		return &clusterv1.LocalDecisionsResponse{NodeId: s.n.id}, nil
	}
	return s.n.deps.LocalDecisions(ctx, req)
}

// LocalImpact is the impact replay's (Deps.LocalImpact).
func (s *clusterService) LocalImpact(ctx context.Context, req *clusterv1.LocalImpactRequest) (*clusterv1.LocalImpactResponse, error) {
	if s.n.deps.LocalImpact == nil {
		return &clusterv1.LocalImpactResponse{NodeId: s.n.id}, nil
	}
	return s.n.deps.LocalImpact(ctx, req)
}
