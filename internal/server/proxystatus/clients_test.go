package proxystatus

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/testing/protocmp"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// fakeMembers answers AskMembers from a client per member; a nil client is
// a member that does not answer.
type fakeMembers map[string]clusterv1.ClusterClient

func (m fakeMembers) AskMembers(ctx context.Context, _ string, ask func(context.Context, clusterv1.ClusterClient) error) ([]string, error) {
	var unreachable []string
	for id, c := range m {
		if c == nil || ask(ctx, c) != nil {
			unreachable = append(unreachable, id)
		}
	}
	slices.Sort(unreachable)
	return unreachable, nil
}

// clientsOf is a member whose LocalClients lists clients.
type clientsOf struct {
	clusterv1.ClusterClient
	clients []*clusterv1.ClientInfo
	err     error
}

func (c clientsOf) LocalClients(context.Context, *clusterv1.LocalClientsRequest, ...grpc.CallOption) (*clusterv1.LocalClientsResponse, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &clusterv1.LocalClientsResponse{Clients: c.clients}, nil
}

func TestClients(t *testing.T) {
	ci := func(node, addr string) *clusterv1.ClientInfo {
		return &clusterv1.ClientInfo{NodeId: node, ClientAddress: addr}
	}
	members := fakeMembers{
		"n2": clientsOf{clients: []*clusterv1.ClientInfo{ci("n2", "b"), ci("n2", "c")}},
		"n3": clientsOf{err: errors.New("deadline exceeded")},
		"n4": nil,
	}
	all, unreachable, err := Clients(t.Context(), members, []*clusterv1.ClientInfo{ci("n1", "a")})
	if err != nil {
		t.Fatal(err)
	}
	if all[0].GetNodeId() != "n1" {
		t.Errorf("first client is %v, want this node's", all[0])
	}
	slices.SortFunc(all, func(a, b *clusterv1.ClientInfo) int { return cmp.Compare(a.GetClientAddress(), b.GetClientAddress()) })
	if diff := gocmp.Diff([]*clusterv1.ClientInfo{ci("n1", "a"), ci("n2", "b"), ci("n2", "c")}, all, protocmp.Transform()); diff != "" {
		t.Errorf("clients (-want +got):\n%s", diff)
	}
	if diff := gocmp.Diff([]string{"n3", "n4"}, unreachable); diff != "" {
		t.Errorf("unreachable (-want +got):\n%s", diff)
	}
	resp, err := Local{NodeID: "n1", Clients: func() []*clusterv1.ClientInfo { return []*clusterv1.ClientInfo{ci("n1", "a")} }}.
		LocalClients(t.Context(), &clusterv1.LocalClientsRequest{})
	if err != nil || resp.GetNodeId() != "n1" || len(resp.GetClients()) != 1 {
		t.Errorf("LocalClients = %v, %v; want n1's one client", resp, err)
	}
}
