// Package members gathers a cluster-wide view from every member over the
// peer API: this node's part first, then each other member's answer, with
// the members that did not answer named rather than failing the view. The
// views themselves (proxystatus, shadow) own what they ask. See
// docs/design.md.
package members

import (
	"context"
	"sync"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// Asker asks every other member of the cluster over the peer API
// (raftnode.Node.AskMembers): ask runs once per member, in parallel, and
// the members whose call failed come back sorted.
type Asker interface {
	AskMembers(ctx context.Context, what string, ask func(ctx context.Context, c clusterv1.ClusterClient) error) (unreachable []string, err error)
}

// Gather is local followed by what ask returns from each other member, and
// the members that did not answer; what names the question in logs.
func Gather[T any](ctx context.Context, m Asker, what string, local []T, ask func(ctx context.Context, c clusterv1.ClusterClient) ([]T, error)) ([]T, []string, error) {
	var mu sync.Mutex
	all := local
	unreachable, err := m.AskMembers(ctx, what, func(ctx context.Context, c clusterv1.ClusterClient) error {
		part, err := ask(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		all = append(all, part...)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return all, unreachable, nil
}
