package shadow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/testing/protocmp"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/policy"
)

// fakeMembers answers AskMembers from a client per member.
type fakeMembers map[string]clusterv1.ClusterClient

func (m fakeMembers) AskMembers(ctx context.Context, _ string, ask func(context.Context, clusterv1.ClusterClient) error) ([]string, error) {
	var unreachable []string
	for id, c := range m {
		if ask(ctx, c) != nil {
			unreachable = append(unreachable, id)
		}
	}
	slices.Sort(unreachable)
	return unreachable, nil
}

// member answers LocalShadow with another Aggregator's LocalShadow.
type member struct {
	clusterv1.ClusterClient
	a   *Aggregator
	err error
}

func (m member) LocalShadow(ctx context.Context, req *clusterv1.LocalShadowRequest, _ ...grpc.CallOption) (*clusterv1.LocalShadowResponse, error) {
	if m.err != nil {
		return nil, m.err
	}
	return m.a.LocalShadow(ctx, req)
}

// TestClusterCounts: this node's counts and every answering member's, per
// policy and scope, not summed; a member that fails is unreachable.
func TestClusterCounts(t *testing.T) {
	local, _ := newAgg(t)
	other, _ := newAgg(t)
	alice := policy.Identity{Org: "acme", Team: "t", Employee: "alice"}
	if err := local.Report(report("s1", alice, Count{Policy: "acme.s", WouldBlock: 1, Evaluated: 2})); err != nil {
		t.Fatal(err)
	}
	if err := other.Report(report("s2", alice, Count{Policy: "acme.s", WouldBlock: 3, Evaluated: 4})); err != nil {
		t.Fatal(err)
	}
	members := fakeMembers{"n2": member{a: other}, "n3": member{err: errors.New("deadline exceeded")}}
	got, unreachable, err := local.ClusterCounts(t.Context(), members, []string{"acme.s"})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].GetWouldBlock() != 1 {
		t.Errorf("first count is %v, want this node's", got[0])
	}
	slices.SortFunc(got, func(a, b *clusterv1.ShadowScopeCount) int { return cmp.Compare(a.GetWouldBlock(), b.GetWouldBlock()) })
	sc := func(block uint64) *clusterv1.ShadowScopeCount {
		return &clusterv1.ShadowScopeCount{Policy: "acme.s", Scope: alice.String(), WouldBlock: block, Evaluated: block + 1}
	}
	if diff := gocmp.Diff([]*clusterv1.ShadowScopeCount{sc(1), sc(3)}, got, protocmp.Transform()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if diff := gocmp.Diff([]string{"n3"}, unreachable); diff != "" {
		t.Errorf("unreachable (-want +got):\n%s", diff)
	}
}

// TestLocalShadowBounded: a member asking for more than maxPolicies
// policies gets the counts of the first maxPolicies.
func TestLocalShadowBounded(t *testing.T) {
	a, _ := newAgg(t)
	a.counts[key{"last", "acme/t/alice"}] = &ScopeCount{Scope: "acme/t/alice", Evaluated: 1}
	a.counts[key{"first", "acme/t/alice"}] = &ScopeCount{Scope: "acme/t/alice", Evaluated: 1}
	names := []string{"first"}
	for i := range maxPolicies {
		names = append(names, fmt.Sprint("p", i))
	}
	names = append(names, "last")
	resp, err := a.LocalShadow(t.Context(), &clusterv1.LocalShadowRequest{Policies: names})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetNodeId() != "n1" || len(resp.GetScopes()) != 1 || resp.GetScopes()[0].GetPolicy() != "first" {
		t.Errorf("LocalShadow = %v, want n1's counts of first only", resp)
	}
}
