package raftnode

import (
	"context"
	"fmt"
	"slices"

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

// Shadow gathers the shadow-policy counts of the named policies from every
// member of the Raft configuration, asking the others in parallel over the
// internal API (as Clients does). The counts are each node's, per policy
// and scope, not summed; a member that does not answer in time is named in
// unreachable.
func (n *Node) Shadow(ctx context.Context, names []string) ([]*clusterv1.ShadowScopeCount, []string, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, nil, fmt.Errorf("read configuration: %w", err)
	}
	type answer struct {
		id     string
		counts []*clusterv1.ShadowScopeCount
		err    error
	}
	var asks []string
	addrs := map[string]string{}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) != n.id {
			asks = append(asks, string(srv.ID))
			addrs[string(srv.ID)] = string(srv.Address)
		}
	}
	answers := make(chan answer, len(asks))
	for _, id := range asks {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, peerQueryTimeout)
			defer cancel()
			c, err := n.peers.client(addrs[id])
			if err != nil {
				answers <- answer{id: id, err: err}
				return
			}
			resp, err := c.LocalShadow(ctx, &clusterv1.LocalShadowRequest{Policies: names})
			answers <- answer{id: id, counts: resp.GetScopes(), err: err}
		}()
	}
	all := n.localShadow(names)
	var unreachable []string
	for range asks {
		a := <-answers
		if a.err != nil {
			n.logger.Debug("member did not report its shadow counts", "member", a.id, "err", a.err)
			unreachable = append(unreachable, a.id)
			continue
		}
		all = append(all, a.counts...)
	}
	slices.Sort(unreachable)
	return all, unreachable, nil
}
