package discovery

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/server/proxystatus"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// cohortRollout stages a new p-t1 (reason "candidate") for team o1/t1 at
// 5%, 50%, 100%.
func cohortRollout(id string) *commandv1.Rollout {
	return &commandv1.Rollout{
		Id: id, State: store.RolloutRunning, OnHalt: "rollback", CreatedAtUnixMs: 1_800_000_000_000,
		Stages: []*commandv1.RolloutStage{{Percent: 5, BakeMs: 1000}, {Percent: 50, BakeMs: 1000}, {Percent: 100, BakeMs: 1000}},
		Changes: []*commandv1.RolloutChange{{Op: "put", Policy: &commandv1.Policy{
			Name: "p-t1", Kind: policy.KindToolPolicy, Scope: &commandv1.Scope{Org: "o1", Team: "t1"},
			Spec: []byte(`{"action":"deny","reason":"candidate","tool_name":"Bash"}`),
		}}},
	}
}

// dispatchRollout hands the index and the service the change the control
// side commits for r at index: its state, and the scopes its policies had
// and have.
func (h *registerHarness) dispatchRollout(t *testing.T, index uint64, r *commandv1.Rollout) {
	t.Helper()
	c := store.Change{Index: index, At: time.Now(), Entities: []store.EntityChange{
		servertest.RolloutEntity(t, r, index, policy.Scope{Org: "o1", Team: "t1"}),
	}}
	if err := h.index.Update(c); err != nil {
		t.Fatal(err)
	}
	h.svc.OnChange(c)
}

// openWith opens a stream of employee e1 as client addr with caps, and
// receives its first response.
func (h *registerHarness) openWith(ctx context.Context, t *testing.T, addr string, caps ...string) (discoveryv1.PolicyDiscoveryService_StreamPoliciesClient, *discoveryv1.PolicyDiscoveryResponse) {
	t.Helper()
	gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
	if err != nil {
		t.Fatal(err)
	}
	if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: addr, Capabilities: caps}); err != nil {
		t.Fatalf("%s: send the first request: %v", addr, err)
	}
	return gs, recvFrom(t, addr, gs)
}

func (h *registerHarness) clientInfo(addr string) *clusterv1.ClientInfo {
	for _, c := range h.svc.Clients() {
		if c.GetClientAddress() == addr {
			return c
		}
	}
	return nil
}

func reason(r *discoveryv1.PolicyDiscoveryResponse, name string) string {
	for _, p := range r.GetPolicies() {
		if p.GetName() == name {
			return string(p.GetSpec())
		}
	}
	return ""
}

// TestRolloutCohortStreams: a rollout's candidate reaches the streams of
// its cohort that declared rollouts, and no other; the next stage adds
// members without resending to those that hold it; later writes reach
// both sets; a rollback pushes the stable set back; ClientInfo carries the
// tags and capabilities.
func TestRolloutCohortStreams(t *testing.T) {
	h := newRegisterHarness(t)
	close(h.release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const id = "r2"
	var at5, at50, out []string // in at 5%; in at 50% only; in at neither
	for i := 0; len(at5) < 2 || len(at50) < 2 || len(out) < 1; i++ {
		a := "sidecar-" + strconv.Itoa(i)
		switch {
		case policyset.InCohort(id, a, 5):
			at5 = append(at5, a)
		case policyset.InCohort(id, a, 50):
			at50 = append(at50, a)
		default:
			out = append(out, a)
		}
	}
	member, v1, later, never := at5[0], at5[1], at50[0], out[0]
	type sc struct {
		gs   discoveryv1.PolicyDiscoveryService_StreamPoliciesClient
		last *discoveryv1.PolicyDiscoveryResponse
	}
	streams := map[string]*sc{}
	for _, a := range []string{member, v1, later, never} {
		var caps []string
		if a != v1 {
			caps = []string{"rollouts", "future-thing"}
		}
		gs, first := h.openWith(ctx, t, a, caps...)
		streams[a] = &sc{gs, first}
	}
	stable := streams[never].last.GetVersionInfo()
	ack := func(a string) {
		t.Helper()
		s := streams[a]
		if err := s.gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: a, VersionInfo: s.last.GetVersionInfo(),
			ResponseNonce: s.last.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(a string) *discoveryv1.PolicyDiscoveryResponse {
		t.Helper()
		r := recvFrom(t, a, streams[a].gs)
		streams[a].last = r
		return r
	}
	for a := range streams {
		ack(a)
	}

	// Stage 0 (5%): only the member with the capability.
	h.dispatchRollout(t, 2, cohortRollout(id))
	cand := recv(member)
	if cand.GetVersionInfo() == stable || !slices.Contains([]string{reason(cand, "p-t1")}, `{"action":"deny","reason":"candidate","tool_name":"Bash"}`) {
		t.Fatalf("member got version %.8s with p-t1 %s, want the candidate", cand.GetVersionInfo(), reason(cand, "p-t1"))
	}
	ack(member)
	if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool { return h.clientInfo(member).GetState() == proxystatus.Acked })) != nil {
		t.Fatalf("member's ACK of the candidate not recorded: %v", h.clientInfo(member))
	}
	if got := h.clientInfo(member); !slices.Equal(got.GetRollouts(), []string{"r2:0"}) || !slices.Equal(got.GetCapabilities(), []string{"rollouts"}) {
		t.Errorf("member ClientInfo rollouts %v capabilities %v, want [r2:0] [rollouts]", got.GetRollouts(), got.GetCapabilities())
	}
	if got := h.clientInfo(v1); len(got.GetRollouts()) != 0 || len(got.GetCapabilities()) != 0 {
		t.Errorf("v1 ClientInfo rollouts %v capabilities %v, want none", got.GetRollouts(), got.GetCapabilities())
	}
	// A cohort member failing over from another node, holding the
	// candidate: the version is the content's hash, so it is unchanged.
	ctx2, cancel2 := context.WithCancel(ctx)
	gs2, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx2, "authorization", "Bearer "+h.token))
	if err != nil {
		t.Fatal(err)
	}
	if err := gs2.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: member, VersionInfo: cand.GetVersionInfo(),
		Capabilities: []string{"rollouts"}}); err != nil {
		t.Fatal(err)
	}
	if got := recvFrom(t, member, gs2); !got.GetUnchanged() || got.GetVersionInfo() != cand.GetVersionInfo() {
		t.Errorf("failover with the candidate's version: unchanged %v version %.8s, want unchanged", got.GetUnchanged(), got.GetVersionInfo())
	}
	cancel2()
	if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool { return h.registered() == len(streams) })) != nil {
		t.Fatalf("the failed-over stream is still registered")
	}

	// Stage 1 (50%): later joins; member keeps its version (nothing sent)
	// under the new tag, its ACK standing.
	r := cohortRollout(id)
	r.Stage = 1
	h.dispatchRollout(t, 3, r)
	laterGot := recv(later)
	if laterGot.GetVersionInfo() != cand.GetVersionInfo() {
		t.Errorf("stage 1: later got %.8s, want the candidate %.8s", laterGot.GetVersionInfo(), cand.GetVersionInfo())
	}
	ack(later)
	// A cohort member that opens now is served the group's snapshot.
	if _, first := h.openWith(ctx, t, at50[1], "rollouts"); first.GetNonce() != laterGot.GetNonce() {
		t.Errorf("a member opening at stage 1 got nonce %q (version %.8s), want the group's %q", first.GetNonce(), first.GetVersionInfo(), laterGot.GetNonce())
	}
	if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool {
		c := h.clientInfo(member)
		return slices.Equal(c.GetRollouts(), []string{"r2:1"})
	})) !=
		nil {
		t.Errorf("member's tags after stage 1: %v, want [r2:1]", h.clientInfo(member).GetRollouts())
	}
	if got := h.clientInfo(member); got.GetState() != proxystatus.Acked || got.GetVersionSent() != cand.GetVersionInfo() {
		t.Errorf("member after stage 1: state %s version %.8s, want acked %.8s", got.GetState(), got.GetVersionSent(), cand.GetVersionInfo())
	}

	// A write to another policy of the team: both sets change.
	h.apply(t, 4, putTeamPolicy("p-extra", "t1", "x"))
	candExtra := recv(member)
	if got := recv(later); got.GetVersionInfo() != candExtra.GetVersionInfo() {
		t.Errorf("cohort members got different versions %.8s, %.8s", candExtra.GetVersionInfo(), got.GetVersionInfo())
	}
	for _, a := range []string{v1, never} {
		// Their first message since opening: neither got the candidate.
		got := recv(a)
		if reason(got, "p-t1") != reason(streams[a].last, "p-t1") || !slices.Contains(policyNames(got), "p-extra") ||
			got.GetVersionInfo() == candExtra.GetVersionInfo() || len(got.GetPolicies()) != 2 {
			t.Errorf("%s: got %v (p-t1 %s), want the stable set with p-extra", a, policyNames(got), reason(got, "p-t1"))
		}
		if reason(got, "p-t1") == reason(cand, "p-t1") {
			t.Errorf("%s holds the candidate", a)
		}
	}
	if !slices.Contains(policyNames(candExtra), "p-extra") || reason(candExtra, "p-t1") != reason(cand, "p-t1") {
		t.Errorf("member after the write: %v (p-t1 %s), want the candidate with p-extra", policyNames(candExtra), reason(candExtra, "p-t1"))
	}
	stableExtra := streams[never].last.GetVersionInfo()

	// Rollback: the cohort gets the stable set back.
	r.State = store.RolloutRolledBack
	h.dispatchRollout(t, 5, r)
	for _, a := range []string{member, later} {
		if got := recv(a); got.GetVersionInfo() != stableExtra {
			t.Errorf("%s after the rollback: %.8s, want the stable %.8s", a, got.GetVersionInfo(), stableExtra)
		}
		if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool { return len(h.clientInfo(a).GetRollouts()) == 0 })) != nil {
			t.Errorf("%s: tags after the rollback %v", a, h.clientInfo(a).GetRollouts())
		}
	}
	h.svc.mu.Lock()
	groups := len(h.svc.groups)
	h.svc.mu.Unlock()
	if groups != 1 {
		t.Errorf("%d groups after the rollback, want the one stable group", groups)
	}
	cancel()
	if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { return h.registered() == 0 })) != nil {
		t.Fatalf("%d streams still registered after the clients left", h.registered())
	}
}

// TestRolloutCompletionStreams: a completion's batch carries the rollout's
// end and its changes as ordinary writes; every stream, cohort or not, is
// pushed the new stable set once.
func TestRolloutCompletionStreams(t *testing.T) {
	h := newRegisterHarness(t)
	close(h.release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	member, v1 := "sidecar-m", "sidecar-v1"
	gm, _ := h.openWith(ctx, t, member, "rollouts")
	gv, _ := h.openWith(ctx, t, v1)
	r := cohortRollout("r2")
	r.Stage = 2 // 100%
	h.dispatchRollout(t, 2, r)
	if got := recvFrom(t, member, gm); reason(got, "p-t1") != `{"action":"deny","reason":"candidate","tool_name":"Bash"}` {
		t.Fatalf("at 100%%: member got p-t1 %s, want the candidate", reason(got, "p-t1"))
	}

	// The completion batch, as the control side commits it: the write,
	// then the rollout's end.
	const idx = 3
	done := &policy.Policy{Name: "p-t1", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "o1", Team: "t1"},
		Spec: []byte(`{"action":"deny","reason":"candidate","tool_name":"Bash"}`), Revision: idx,
		CreatedAt: time.Unix(1, 0).UTC(), UpdatedAt: time.Unix(3, 0).UTC()}
	stored, err := done.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	r.State = store.RolloutCompleted
	team := []policy.Scope{{Org: "o1", Team: "t1"}}
	c := store.Change{Index: idx, At: time.Now(), Entities: []store.EntityChange{
		{Type: store.EntityPolicy, ID: "p-t1", Action: store.ActionUpdate, Index: idx, Data: stored, Policy: done, Scopes: team},
		servertest.RolloutEntity(t, r, idx, team...),
	}}
	if err := h.index.Update(c); err != nil {
		t.Fatal(err)
	}
	h.svc.OnChange(c)
	stable := h.index.Set(policy.Identity{Org: "o1", Team: "t1", Employee: "e1"}).Version
	for a, gs := range map[string]discoveryv1.PolicyDiscoveryService_StreamPoliciesClient{member: gm, v1: gv} {
		got := recvFrom(t, a, gs)
		if got.GetVersionInfo() != stable || got.GetPolicies()[0].GetRevision() != idx {
			t.Errorf("%s after the completion: version %.8s p-t1 revision %d, want %.8s at %d", a, got.GetVersionInfo(),
				got.GetPolicies()[0].GetRevision(), stable, idx)
		}
	}
	// Nothing else was queued: the next message is the next write's.
	h.apply(t, 4, putTeamPolicy("p-next", "t1", "x"))
	for a, gs := range map[string]discoveryv1.PolicyDiscoveryService_StreamPoliciesClient{member: gm, v1: gv} {
		if got := recvFrom(t, a, gs); !slices.Contains(policyNames(got), "p-next") {
			t.Errorf("%s: got %v, want the set with p-next", a, policyNames(got))
		}
	}
	if got := h.clientInfo(member).GetRollouts(); len(got) != 0 {
		t.Errorf("member's tags after the completion: %v", got)
	}
}
