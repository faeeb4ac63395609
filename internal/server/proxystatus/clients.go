package proxystatus

import (
	"context"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/server/members"
)

// Clients lists the sidecars connected to every member: local, this node's,
// then what each other member answers to LocalClients. A member that does
// not answer in time is listed in unreachable rather than failing the view.
func Clients(ctx context.Context, m members.Asker, local []*clusterv1.ClientInfo) ([]*clusterv1.ClientInfo, []string, error) {
	return members.Gather(ctx, m, "list its clients", local, func(ctx context.Context, c clusterv1.ClusterClient) ([]*clusterv1.ClientInfo, error) {
		resp, err := c.LocalClients(ctx, &clusterv1.LocalClientsRequest{})
		return resp.GetClients(), err
	})
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
