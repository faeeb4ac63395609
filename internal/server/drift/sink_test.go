package drift_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/drift"
	"github.com/policyd/policyd/internal/server/servertest"
)

func effects(at time.Time, uid string) []admission.Effect {
	parent := admission.ObjectRef{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "ns", Name: "web", UID: "p-uid", Generation: 3, ObservedGeneration: 3}
	child := admission.ObjectRef{APIVersion: "apps/v1", Kind: "ReplicaSet", Namespace: "ns", Name: "web-1", UID: "c-uid"}
	return []admission.Effect{
		{Kind: admission.EffectRecordPhase, Parent: parent, Phase: admission.PhaseInitialized, At: at},
		{Kind: admission.EffectDriftDetected, ID: "0123456789abcdef", Parent: parent, Child: &child, At: at,
			Request: &admission.RequestInfo{User: "ctrl", UID: uid, Operation: "UPDATE"}},
		{Kind: admission.EffectConsumeApproval, Parent: parent, Child: &child, At: at,
			Approval: &admission.Approval{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", Mode: "once", Generation: 3}},
		{Kind: admission.EffectDriftResolved, Parent: parent, Child: &child, At: at},
	}
}

// decodeObserve returns the effects of ObserveDrift commands.
func decodeObserve(t *testing.T, cmds []*command.Command) [][]*commandv1.DriftEffect {
	t.Helper()
	var out [][]*commandv1.DriftEffect
	for _, c := range cmds {
		if got, want := c.Type(), command.TypeObserveDrift; got != want {
			t.Fatalf("command type %d, want %d", got, want)
		}
		out = append(out, c.Body.GetObserveDrift().GetEffects())
	}
	return out
}

// Two nodes seeing the same decision (different request UIDs and times, as
// the API server calls each webhook separately) must produce the same task
// keys and report ids, or the FSM could not deduplicate them.
func TestCommandsKeysAreContentOnly(t *testing.T) {
	a, err := drift.Commands("n1", effects(time.Unix(100, 0), "uid-a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := drift.Commands("n2", effects(time.Unix(200, 0), "uid-b"))
	if err != nil {
		t.Fatal(err)
	}
	ea, eb := decodeObserve(t, a), decodeObserve(t, b)
	// One command per report, the patch tasks with the first.
	if got, want := len(ea), 2; got != want {
		t.Fatalf("%d commands, want %d", got, want)
	}
	if got, want := len(ea[0]), 3; got != want {
		t.Fatalf("first command has %d effects, want %d (a report and two patches)", got, want)
	}
	for i := range ea {
		for j := range ea[i] {
			x, y := ea[i][j], eb[i][j]
			if x.GetKey() != y.GetKey() || x.GetReportId() != y.GetReportId() || x.GetPairId() != y.GetPairId() {
				t.Errorf("effect %d/%d: keys differ between nodes: %v vs %v", i, j, x, y)
			}
		}
	}
	det, res := ea[0][0], ea[1][0]
	if det.GetKind() != "detected" || det.GetReportId() != "0123456789abcdef" || len(det.GetReport()) == 0 {
		t.Errorf("detected effect = %v", det)
	}
	if res.GetKind() != "resolved" || res.GetReportId() != res.GetPairId() || det.GetPairId() != res.GetPairId() {
		t.Errorf("resolved %v does not name the detected report's pair %s", res, det.GetPairId())
	}
	if ea[0][1].GetKey() == ea[0][2].GetKey() {
		t.Error("different patches share a task key")
	}
}

// An approved drift's Resolved is stored under its occurrence (each
// approved change its own report, every node's observation of it one),
// while the report's id names the pair as docs/drift.md says.
func TestCommandsApprovedResolved(t *testing.T) {
	e := effects(time.Unix(100, 0), "uid-a")[3]
	approvedIn := func(occurrence string) *commandv1.DriftEffect {
		a := e
		a.Resolution, a.Occurrence = admission.ResolvedApproved, occurrence
		cmds, err := drift.Commands("n1", []admission.Effect{a})
		if err != nil {
			t.Fatal(err)
		}
		return decodeObserve(t, cmds)[0][0]
	}
	one, two := approvedIn("1111111111111111"), approvedIn("2222222222222222")
	if one.GetKind() != "approved" || one.GetReportId() != "1111111111111111" || two.GetReportId() != "2222222222222222" {
		t.Errorf("approved effects %v, %v: want kind approved, stored under their occurrences", one, two)
	}
	var rep admission.DriftReport
	if err := json.Unmarshal(one.GetReport(), &rep); err != nil {
		t.Fatal(err)
	}
	if pair := admission.ResolvedID(e.Parent, *e.Child); rep.Spec.ID != pair || one.GetPairId() != pair || rep.Spec.Phase != admission.ReportResolved {
		t.Errorf("report id %s phase %s pair %s, want the pair's id %s and Resolved", rep.Spec.ID, rep.Spec.Phase, one.GetPairId(), pair)
	}
	e.Resolution = admission.ResolvedParentChanged
	cmds, err := drift.Commands("n1", []admission.Effect{e})
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeObserve(t, cmds)[0][0]; got.GetKind() != "resolved" || got.GetReportId() != got.GetPairId() {
		t.Errorf("parent-changed effect %v: want kind resolved under the pair's id", got)
	}
}

func TestCommandsRefuseBadEffects(t *testing.T) {
	for _, e := range []admission.Effect{
		{Kind: "Bogus"},
		{Kind: admission.EffectDriftDetected, ID: "x"}, // no child
	} {
		if _, err := drift.Commands("n1", []admission.Effect{e}); err == nil {
			t.Errorf("Commands(%v) = nil error", e.Kind)
		}
	}
}

// proposer records proposals; it fails the first fail calls.
type proposer struct {
	mu    sync.Mutex
	fail  int
	cmds  []*command.Command
	calls int
}

func (p *proposer) Propose(_ context.Context, c *command.Command) (*commandv1.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.fail > 0 {
		p.fail--
		return nil, context.DeadlineExceeded
	}
	p.cmds = append(p.cmds, c)
	return &commandv1.Result{Index: uint64(len(p.cmds))}, nil
}

func (p *proposer) proposed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.cmds)
}

// Submit returns at once; the sink proposes in the background, retrying
// while no leader takes the command.
func TestSinkProposesInBackground(t *testing.T) {
	p := &proposer{fail: 2}
	s := drift.NewSink(servertest.Logger(t), "n1", p)
	defer s.Close()
	if err := s.Submit(t.Context(), effects(time.Now(), "u")); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, "both commands proposed", func() error {
		if n := p.proposed(); n != 2 {
			return fmt.Errorf("%d of 2 proposed", n)
		}
		return nil
	}, poll.Within(10*time.Second))

}
