package proxystatus

import (
	"context"
	"sync"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// Members asks every other member of the cluster over the peer API
// (raftnode.Node.AskMembers): ask runs once per member, in parallel, and
// the members whose call failed come back sorted.
type Members interface {
	AskMembers(ctx context.Context, what string, ask func(ctx context.Context, c clusterv1.ClusterClient) error) (unreachable []string, err error)
}

// Clients lists the sidecars connected to every member: local, this node's,
// then what each other member answers to LocalClients. A member that does
// not answer in time is listed in unreachable rather than failing the view.
func Clients(ctx context.Context, m Members, local []*clusterv1.ClientInfo) ([]*clusterv1.ClientInfo, []string, error) {
	var mu sync.Mutex
	all := local
	unreachable, err := m.AskMembers(ctx, "list its clients", func(ctx context.Context, c clusterv1.ClusterClient) error {
		resp, err := c.LocalClients(ctx, &clusterv1.LocalClientsRequest{})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		all = append(all, resp.GetClients()...)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return all, unreachable, nil
}

// Local is this node's part of the view, as the peer API serves it.
type Local struct {
	NodeID  string
	Clients func() []*clusterv1.ClientInfo
}

// LocalClients answers a member's LocalClients with this node's sidecars.
func (l Local) LocalClients(context.Context, *clusterv1.LocalClientsRequest) (*clusterv1.LocalClientsResponse, error) {
	return &clusterv1.LocalClientsResponse{NodeId: l.NodeID, Clients: l.Clients()}, nil
}
