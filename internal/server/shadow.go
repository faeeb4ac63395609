package server

import (
	"context"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// ShadowCounts gathers the shadow-policy counts of the named policies from
// every member of the cluster (shadow.Aggregator.ClusterCounts).
func (n *Node) ShadowCounts(ctx context.Context, names []string) ([]*clusterv1.ShadowScopeCount, []string, error) {
	return n.shadow.ClusterCounts(ctx, n.consensus, names)
}
