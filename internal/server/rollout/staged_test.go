package rollout

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/server/proxystatus"
	"github.com/policyd/policyd/internal/store"
)

var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// staged is a rollout r7 at stage with stages 10%, 50%, 100% baking a
// minute each, its stage begun at t0.
func staged(state string, stage uint32, maxNack, minCov float64, onHalt string) *commandv1.Rollout {
	return &commandv1.Rollout{
		Id: "r7", State: state, Stage: stage, MaxNackRatio: maxNack, MinAckCoverage: minCov, OnHalt: onHalt,
		StageStartedAtUnixMs: t0.UnixMilli(),
		Stages: []*commandv1.RolloutStage{
			{Percent: 10, BakeMs: time.Minute.Milliseconds()},
			{Percent: 50, BakeMs: time.Minute.Milliseconds()},
			{Percent: 100, BakeMs: time.Minute.Milliseconds()},
		},
	}
}

func TestDecide(t *testing.T) {
	baked := t0.Add(time.Minute)
	move := func(state string, stage uint32, at time.Time, reason string) *commandv1.RolloutTransition {
		return &commandv1.RolloutTransition{
			Id: "r7", ExpectState: store.RolloutRunning, ExpectStage: 1, State: state, Stage: stage,
			AtUnixMs: at.UnixMilli(), Reason: reason,
		}
	}
	tests := []struct {
		name string
		r    *commandv1.Rollout
		c    Cohort
		now  time.Time
		want *commandv1.RolloutTransition
	}{
		{"baking", staged(store.RolloutRunning, 1, 0.1, 1, "rollback"), Cohort{Size: 4, Acked: 4}, baked.Add(-time.Millisecond), nil},
		{"baked, covered: next stage", staged(store.RolloutRunning, 1, 0.1, 1, "rollback"), Cohort{Size: 4, Acked: 4}, baked,
			move(store.RolloutRunning, 2, baked, "")},
		{"baked, coverage short", staged(store.RolloutRunning, 1, 0.1, 1, "rollback"), Cohort{Size: 4, Acked: 3, Pending: 1}, baked, nil},
		{"baked, coverage met below 1", staged(store.RolloutRunning, 1, 0.5, 0.75, "rollback"), Cohort{Size: 4, Acked: 3, Nacked: 1}, baked,
			move(store.RolloutRunning, 2, baked, "")},
		{"empty cohort passes on bake time", staged(store.RolloutRunning, 1, 0, 1, "rollback"), Cohort{SizeWS: 9}, baked,
			move(store.RolloutRunning, 2, baked, "")},
		{"empty cohort still baking", staged(store.RolloutRunning, 1, 0, 1, "rollback"), Cohort{}, t0, nil},
		{"nack ratio over: rollback, before the bake", staged(store.RolloutRunning, 1, 0.1, 1, "rollback"), Cohort{Size: 4, Acked: 3, Nacked: 1}, t0,
			move(store.RolloutRolledBack, 1, t0, "nack ratio 0.25 > 0.10 at stage 1 (50%)")},
		{"nack ratio over: stay", staged(store.RolloutRunning, 1, 0, 1, "stay"), Cohort{Size: 10, Acked: 9, Nacked: 1}, baked,
			move(store.RolloutHalted, 1, baked, "nack ratio 0.10 > 0.00 at stage 1 (50%)")},
		{"nack ratio at the limit", staged(store.RolloutRunning, 1, 0.25, 0.75, "rollback"), Cohort{Size: 4, Acked: 3, Nacked: 1}, baked,
			move(store.RolloutRunning, 2, baked, "")},
		{"last stage completes", staged(store.RolloutRunning, 2, 0, 1, "rollback"), Cohort{Size: 2, Acked: 2}, baked,
			&commandv1.RolloutTransition{Id: "r7", ExpectState: store.RolloutRunning, ExpectStage: 2, State: store.RolloutCompleted, Stage: 2, AtUnixMs: baked.UnixMilli()}},
		{"paused does not move", staged(store.RolloutPaused, 1, 0, 1, "rollback"), Cohort{Size: 4, Nacked: 4}, baked, nil},
		{"halted does not move", staged(store.RolloutHalted, 1, 0, 1, "stay"), Cohort{Size: 4, Acked: 4}, baked, nil},
		{"completed does not move", staged(store.RolloutCompleted, 2, 0, 1, "rollback"), Cohort{}, baked, nil},
		{"stage out of range", staged(store.RolloutRunning, 3, 0, 1, "rollback"), Cohort{}, baked, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.r, tc.c, tc.now)
			if tc.want != nil {
				tc.want.ExpectStage = tc.r.GetStage()
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCohortOf(t *testing.T) {
	r := staged(store.RolloutRunning, 1, 0, 1, "rollback")
	ci := func(transport, state string, tags ...string) *clusterv1.ClientInfo {
		return &clusterv1.ClientInfo{Transport: transport, State: state, Rollouts: tags}
	}
	clients := []*clusterv1.ClientInfo{
		ci("grpc", proxystatus.Acked, "r7:1"),
		ci("grpc", proxystatus.Nacked, "r3:0", "r7:1"),
		ci("grpc", proxystatus.Pending, "r7:1"),
		ci("grpc", "", "r7:1"),                 // not answered yet
		ci("grpc", proxystatus.Acked, "r7:0"),  // the previous stage's tag: not this cohort
		ci("grpc", proxystatus.Acked, "r77:1"), // another rollout
		ci("grpc", proxystatus.Acked),
		ci("ws", proxystatus.Acked, "r7:1"),
	}
	want := Cohort{Size: 4, SizeWS: 1, Acked: 1, Nacked: 1, Pending: 2}
	if got := CohortOf(r, clients); got != want {
		t.Errorf("CohortOf = %+v, want %+v", got, want)
	}
	if got, want := Tag("r7", 12), "r7:12"; got != want {
		t.Errorf("Tag = %q, want %q", got, want)
	}
}
