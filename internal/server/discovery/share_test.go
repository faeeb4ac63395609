package discovery

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// TestScopesShareSnapshot: employees whose set is their team's (no policy
// names them) are served one snapshot of it, not one encoded copy each,
// both when their streams open and after a change; an employee a policy
// names, or of another team, has its own; and the sharing leaves nothing
// behind when the streams end.
func TestScopesShareSnapshot(t *testing.T) {
	h := newRegisterHarness(t)
	close(h.release)
	h.apply(t, 2, func(b *store.Batch, m store.Meta) error {
		for _, e := range []*policy.Employee{
			{ID: "e2", Org: "o1", Team: "t1", Status: policy.StatusActive},
			{ID: "e3", Org: "o1", Team: "t1", Status: policy.StatusActive},
			{ID: "e4", Org: "o1", Team: "t1", Status: policy.StatusActive},
			{ID: "e5", Org: "o1", Team: "t2", Status: policy.StatusActive},
			{ID: "e6", Org: "o1", Team: "t1", Status: policy.StatusActive},
		} {
			if _, _, err := b.PutEmployee(m, e, nil); err != nil {
				return err
			}
		}
		p, err := policy.DecodePolicy([]byte(`{"name":"p-e4","kind":"ToolPolicy","scope":{"org":"o1","team":"t1","employee":"e4"},` +
			`"spec":{"tool_name":"Bash","action":"deny","reason":"named"}}`))
		if err != nil {
			return err
		}
		_, _, err = b.PutPolicy(m, p, nil)
		return err
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	streams := map[string]discoveryv1.PolicyDiscoveryService_StreamPoliciesClient{}
	open := func(e string) *discoveryv1.PolicyDiscoveryResponse {
		t.Helper()
		gs, resp := h.openAs(ctx, t, e)
		streams[e] = gs
		return resp
	}
	// check: the employees in shared got one response (nonce and version),
	// and those in own got another.
	check := func(what string, got map[string]*discoveryv1.PolicyDiscoveryResponse, shared, own []string) {
		t.Helper()
		for _, e := range shared[1:] {
			if got[e].GetNonce() != got[shared[0]].GetNonce() || got[e].GetVersionInfo() != got[shared[0]].GetVersionInfo() {
				t.Errorf("%s: %s got nonce %q version %q, %s got %q %q: want one shared response",
					what, e, got[e].GetNonce(), got[e].GetVersionInfo(), shared[0], got[shared[0]].GetNonce(), got[shared[0]].GetVersionInfo())
			}
		}
		for _, e := range own {
			if got[e].GetNonce() == got[shared[0]].GetNonce() {
				t.Errorf("%s: %s got the shared response (nonce %q), want its own set's", what, e, got[e].GetNonce())
			}
		}
	}

	opened := map[string]*discoveryv1.PolicyDiscoveryResponse{}
	for _, e := range []string{"e1", "e2", "e3", "e4", "e5"} {
		opened[e] = open(e)
	}
	check("opened", opened, []string{"e1", "e2", "e3"}, []string{"e4", "e5"})
	if got, want := h.setHolders(), []int{1, 1, 3}; !slices.Equal(got, want) {
		t.Errorf("groups per shared snapshot after opening: %v, want %v", got, want)
	}

	// A change to team t1's policy reaches e1–e4; e5 (team t2) is not
	// read, it gets nothing.
	h.changeTeamPolicy(t, 3, "changed")
	pushed := map[string]*discoveryv1.PolicyDiscoveryResponse{}
	for _, e := range []string{"e1", "e2", "e3", "e4"} {
		pushed[e] = recvFrom(t, e, streams[e])
		if pushed[e].GetVersionInfo() == opened[e].GetVersionInfo() {
			t.Errorf("%s: push carries the version it had, %q", e, pushed[e].GetVersionInfo())
		}
	}
	// e6 opens after the change: it shares the push's snapshot.
	pushed["e6"] = open("e6")
	check("pushed", pushed, []string{"e1", "e2", "e3", "e6"}, []string{"e4"})
	if got, want := h.setHolders(), []int{1, 1, 4}; !slices.Equal(got, want) {
		t.Errorf("groups per shared snapshot after the change: %v, want %v", got, want)
	}

	cancel()
	if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { return h.registered() == 0 })) != nil {
		t.Fatalf("%d streams still registered after the clients left", h.registered())
	}
	if got := h.setHolders(); len(got) != 0 {
		t.Errorf("shared snapshots left after every stream ended: %v groups", got)
	}
}

// openAs opens a stream with employee e's token, sends its first request
// and receives the first response.
func (h *registerHarness) openAs(ctx context.Context, t *testing.T, e string) (discoveryv1.PolicyDiscoveryService_StreamPoliciesClient, *discoveryv1.PolicyDiscoveryResponse) {
	t.Helper()
	gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tokenFor(t, e)))
	if err != nil {
		t.Fatal(err)
	}
	if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-" + e}); err != nil {
		t.Fatalf("%s: send the first request: %v", e, err)
	}
	return gs, recvFrom(t, e, gs)
}

// recvFrom receives one response from employee e's stream.
func recvFrom(t *testing.T, e string, gs discoveryv1.PolicyDiscoveryService_StreamPoliciesClient) *discoveryv1.PolicyDiscoveryResponse {
	t.Helper()
	resp, err := gs.Recv()
	if err != nil {
		t.Fatalf("%s: receive: %v", e, err)
	}
	return resp
}

// setHolders is, for each set whose snapshot groups share, how many groups
// hold it, in increasing order.
func (h *registerHarness) setHolders() []int {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	var n []int
	for _, e := range h.svc.bySet {
		n = append(n, e.groups)
	}
	slices.Sort(n)
	return n
}

// TestPushSharesRegisteredSnapshot: a scope whose first stream opens after
// the policy index has taken a change in, and before the service pushes it,
// encodes the new set's snapshot itself. The push then sends that one to
// the other scopes of the set instead of encoding a second copy, and its
// latency is still measured.
func TestPushSharesRegisteredSnapshot(t *testing.T) {
	h := newRegisterHarness(t)
	close(h.release)
	h.apply(t, 2, func(b *store.Batch, m store.Meta) error {
		_, _, err := b.PutEmployee(m, &policy.Employee{ID: "e2", Org: "o1", Team: "t1", Status: policy.StatusActive}, nil)
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gs1, before := h.openAs(ctx, t, "e1")

	changes := h.commit(t, 3, teamPolicy("changed"))
	_, registered := h.openAs(ctx, t, "e2") // the index has the change, the service not yet
	if registered.GetVersionInfo() == before.GetVersionInfo() {
		t.Fatalf("e2 opened after the index took the change in and got the old version %q", registered.GetVersionInfo())
	}
	for _, c := range changes {
		h.svc.OnChange(c)
	}
	pushed := recvFrom(t, "e1", gs1)
	if pushed.GetVersionInfo() != registered.GetVersionInfo() || pushed.GetNonce() != registered.GetNonce() {
		t.Errorf("push to e1: version %q nonce %q; e2's snapshot of the same set: %q %q; want the same response",
			pushed.GetVersionInfo(), pushed.GetNonce(), registered.GetVersionInfo(), registered.GetNonce())
	}
	if got, want := h.setHolders(), []int{2}; !slices.Equal(got, want) {
		t.Errorf("groups per shared snapshot: %v, want %v", got, want)
	}
	// Observed once the send has returned, which may be after e1 read it.
	const latency = "policyd_discovery_push_latency_seconds"
	_ = poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { return servertest.Metric(t, h.reg, latency) >= 1 }))
	if n := servertest.Metric(t, h.reg, latency); n != 1 {
		t.Errorf("push latency observed %v times, want 1 (e1's push)", n)
	}
}
