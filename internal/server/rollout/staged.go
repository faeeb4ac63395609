// Package rollout decides staged rollouts: which sidecars are in a stage
// (their cohort) and when a stage advances, halts or completes
// (docs/rollouts.md).
package rollout

import (
	"fmt"
	"strconv"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/server/proxystatus"
	"github.com/policyd/policyd/internal/store"
)

// Cohort is what the sidecars in a staged rollout's current stage answered
// (docs/rollouts.md): discovery clients by the state of the newest version
// sent to them; feed clients, which send no ACKs, only counted in SizeWS.
type Cohort struct {
	Size    int `json:"size"`
	SizeWS  int `json:"size_ws"`
	Acked   int `json:"acked"`
	Nacked  int `json:"nacked"`
	Pending int `json:"pending"`
}

// Tag is how ClientInfo.rollouts names rollout id at stage: "id:stage".
func Tag(id string, stage uint32) string { return id + ":" + strconv.FormatUint(uint64(stage), 10) }

// CohortOf counts the clients (from every node) whose newest version holds
// r's candidate at r's current stage.
func CohortOf(r *commandv1.Rollout, clients []*clusterv1.ClientInfo) Cohort {
	tag := Tag(r.GetId(), r.GetStage())
	var c Cohort
	for _, ci := range clients {
		if !hasTag(ci, tag) {
			continue
		}
		if ci.GetTransport() != "grpc" {
			c.SizeWS++
			continue
		}
		c.Size++
		switch ci.GetState() {
		case proxystatus.Acked:
			c.Acked++
		case proxystatus.Nacked:
			c.Nacked++
		default:
			c.Pending++
		}
	}
	return c
}

func hasTag(ci *clusterv1.ClientInfo, tag string) bool {
	for _, t := range ci.GetRollouts() {
		if t == tag {
			return true
		}
	}
	return false
}

// Decide is the leader's decision for rollout r, whose cohort answered c,
// at now: the transition to propose, or nil to wait. Only a running
// rollout moves by itself. A NACK ratio above max_nack_ratio halts it at
// once (rolled back, or halted with on_halt stay). A stage passes once its
// bake time is over, its ACK coverage reaches min_ack_coverage and its NACK
// ratio is within the limit; an empty cohort passes on the bake time alone.
// Passing the last stage completes the rollout.
func Decide(r *commandv1.Rollout, c Cohort, now time.Time) *commandv1.RolloutTransition {
	if r.GetState() != store.RolloutRunning || int(r.GetStage()) >= len(r.GetStages()) {
		return nil
	}
	stage := r.GetStages()[r.GetStage()]
	t := &commandv1.RolloutTransition{
		Id: r.GetId(), ExpectState: r.GetState(), ExpectStage: r.GetStage(),
		Stage: r.GetStage(), AtUnixMs: now.UnixMilli(),
	}
	if c.Size > 0 {
		if ratio := float64(c.Nacked) / float64(c.Size); ratio > r.GetMaxNackRatio() {
			t.State = store.RolloutRolledBack
			if r.GetOnHalt() == store.OnHaltStay {
				t.State = store.RolloutHalted
			}
			t.Reason = fmt.Sprintf("nack ratio %.2f > %.2f at stage %d (%d%%)", ratio, r.GetMaxNackRatio(), r.GetStage(), stage.GetPercent())
			return t
		}
		if float64(c.Acked)/float64(c.Size) < r.GetMinAckCoverage() {
			return nil
		}
	}
	started := time.UnixMilli(r.GetStageStartedAtUnixMs())
	if now.Sub(started) < time.Duration(stage.GetBakeMs())*time.Millisecond {
		return nil
	}
	if int(r.GetStage())+1 == len(r.GetStages()) {
		t.State = store.RolloutCompleted
		return t
	}
	t.State, t.Stage = store.RolloutRunning, r.GetStage()+1
	return t
}
