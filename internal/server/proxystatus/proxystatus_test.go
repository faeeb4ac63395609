package proxystatus

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

func TestCompute(t *testing.T) {
	c := func(node, addr, transport, sent, state string) *clusterv1.ClientInfo {
		return &clusterv1.ClientInfo{NodeId: node, ClientAddress: addr, Transport: transport, VersionSent: sent, State: state, Org: "o"}
	}
	nacked := c("n2", "b", "grpc", "v2", Nacked)
	nacked.NackMessage, nacked.NackVersion = "bad regexp", "v1"
	ref := func(node, addr string) ClientRef { return ClientRef{Node: node, Client: addr, Scope: "o//"} }
	tests := []struct {
		name    string
		clients []*clusterv1.ClientInfo
		want    Status
	}{
		{"nobody connected is done", nil, Status{Done: true, Versions: []Version{}}},
		{"pending holds the rollout", []*clusterv1.ClientInfo{c("n1", "a", "grpc", "v2", Acked), c("n1", "c", "grpc", "v2", Pending)},
			Status{Versions: []Version{{Version: "v2", Acked: []ClientRef{ref("n1", "a")}, Nacked: []NackRef{}, Pending: []ClientRef{ref("n1", "c")}}}}},
		{"a NACK counts as an answer", []*clusterv1.ClientInfo{c("n1", "a", "grpc", "v2", Acked), nacked},
			Status{Done: true, Versions: []Version{{Version: "v2", Done: true, Acked: []ClientRef{ref("n1", "a")},
				Nacked: []NackRef{{ClientRef: ref("n2", "b"), Message: "bad regexp", LastGoodVersion: "v1"}}, Pending: []ClientRef{}}}}},
		{"versions are separate; websocket clients and streams sent nothing are left out",
			[]*clusterv1.ClientInfo{c("n1", "a", "grpc", "v1", Acked), c("n2", "z", "grpc", "v2", Acked), c("n1", "w", "ws", "v9", Acked), c("n3", "new", "grpc", "", "")},
			Status{Done: true, Versions: []Version{
				{Version: "v1", Done: true, Acked: []ClientRef{ref("n1", "a")}, Nacked: []NackRef{}, Pending: []ClientRef{}},
				{Version: "v2", Done: true, Acked: []ClientRef{ref("n2", "z")}, Nacked: []NackRef{}, Pending: []ClientRef{}},
			}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Compute(tc.clients)); diff != "" {
				t.Errorf("Compute (-want +got):\n%s", diff)
			}
		})
	}
}
