package sources

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// DefaultBake is a declared rollout's bake per stage when it sets none.
const DefaultBake = time.Minute

// staged is a declared change that goes out as a staged rollout.
type staged struct {
	d  Declared
	pb *commandv1.Policy
	r  *commandv1.Rollout
}

// rollouts is what a plan needs of the store's rollouts: which policies an
// active one stages, and the last rollout of each policy by this source.
type rollouts struct {
	active map[string]*commandv1.Rollout
	last   map[string]*commandv1.Rollout
}

func readRollouts(st *store.Store, source string) (rollouts, error) {
	rs, _, err := st.Rollouts()
	if err != nil {
		return rollouts{}, fmt.Errorf("read rollouts: %w", err)
	}
	out := rollouts{active: map[string]*commandv1.Rollout{}, last: map[string]*commandv1.Rollout{}}
	for _, r := range rs { // oldest first
		for _, c := range r.GetChanges() {
			name := store.ChangeName(c)
			if store.RolloutActive(r.GetState()) {
				out.active[name] = r
			}
			if r.GetSource() == source {
				out.last[name] = r
			}
		}
	}
	return out, nil
}

// declaredRollout is the staged rollout that puts pb as d.Rollout says, or
// the field error that makes d invalid.
func declaredRollout(source string, d Declared, pb *commandv1.Policy) (*commandv1.Rollout, error) {
	dr := d.Rollout
	r := &commandv1.Rollout{MinAckCoverage: 1, OnHalt: dr.OnHalt, Source: source,
		Changes: []*commandv1.RolloutChange{{Op: store.OpPut, Policy: pb}}}
	if r.OnHalt == "" {
		r.OnHalt = store.OnHaltRollback
	}
	if dr.MaxNackRatio != "" {
		v, err := strconv.ParseFloat(dr.MaxNackRatio, 64)
		if err != nil {
			return nil, policy.ValidationError{{Field: "spec.rollout.maxNackRatio", Reason: fmt.Sprintf("%q is not a number", dr.MaxNackRatio)}}
		}
		r.MaxNackRatio = v
	}
	bake := dr.Bake
	if bake == 0 {
		bake = DefaultBake
	}
	for i, s := range dr.Stages {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(s), "%"))
		if err != nil {
			return nil, policy.ValidationError{{Field: fmt.Sprintf("spec.rollout.stages[%d]", i), Reason: fmt.Sprintf("%q is not a percent such as 25%%", s)}}
		}
		r.Stages = append(r.Stages, &commandv1.RolloutStage{Percent: uint32(max(n, 0)), BakeMs: bake.Milliseconds()})
	}
	if err := command.CheckRollout(r); err != nil {
		return nil, fmt.Errorf("spec.rollout: %w", err)
	}
	return r, nil
}

// sameCandidate reports whether rollout r put exactly pb.
func sameCandidate(r *commandv1.Rollout, pb *commandv1.Policy) bool {
	for _, c := range r.GetChanges() {
		if cp := c.GetPolicy(); c.GetOp() == store.OpPut && cp.GetName() == pb.GetName() && same(command.PolicyOf(cp), pb) {
			return true
		}
	}
	return false
}

// startStaged starts the staged rollouts of a plan, one per object, after
// its sync committed; their outcomes replace the plan's.
func (e *Engine) startStaged(ctx context.Context, name, actor string, pl *syncPlan, outcome map[string]*Outcome) error {
	for _, s := range pl.staged {
		c, err := command.RolloutStart(s.r)
		if err != nil {
			return err
		}
		c.Actor = actor
		c.OriginatedAtUnixNano = time.Now().UnixNano()
		res, err := e.deps.Propose(ctx, c)
		if err == nil {
			err = command.ResultErr(res)
		}
		o := outcome[s.pb.GetName()]
		if err != nil {
			o.State, o.Message = StateFailed, "staged rollout not started: "+err.Error()
			continue
		}
		o.Message = "staged rollout " + store.RolloutID(res.GetIndex()) + " started"
		e.logger.Info("source change staged", "source", name, "policy", s.pb.GetName(), "rollout", store.RolloutID(res.GetIndex()))
	}
	return nil
}

// Rollout is a declared object's spec.rollout.
type Rollout struct {
	Stages       []string      // "5%", "25%", "100%"
	Bake         time.Duration // how long each stage bakes
	MaxNackRatio string        // "0.01"
	OnHalt       string        // "rollback" or "stay"
}
