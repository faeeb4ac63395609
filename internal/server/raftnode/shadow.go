package raftnode

import (
	"context"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// LocalShadow is the shadow view's (Deps.LocalShadow).
func (s *clusterService) LocalShadow(ctx context.Context, req *clusterv1.LocalShadowRequest) (*clusterv1.LocalShadowResponse, error) {
	if s.n.deps.LocalShadow == nil {
		return &clusterv1.LocalShadowResponse{NodeId: s.n.id}, nil
	}
	return s.n.deps.LocalShadow(ctx, req)
}
