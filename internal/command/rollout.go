package command

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// Staged rollout types (docs/rollouts.md), command version 4. Not
// ignorable: a node that skipped them would serve other sets and accept
// writes the others refuse.
const (
	TypeRolloutStart      Type = 16
	TypeRolloutTransition Type = 17
)

// RolloutVersion is the command version that introduced the rollout
// commands: a node of an older release stops on them (they are not
// ignorable: skipping one would leave that replica serving other sets), so
// they are proposed only once every member reads it.
const RolloutVersion = 4

// ActorRollout is the actor of the leader's rollout driver.
const ActorRollout = "task:rollout"

// Rollout bounds (docs/rollouts.md).
const (
	MaxRolloutChanges = 100
	MaxRolloutStages  = 10
	MinBake           = time.Second
	MaxBake           = 24 * time.Hour
)

// IsRolloutType reports whether t is a rollout command (RolloutVersion).
func IsRolloutType(t Type) bool { return t == TypeRolloutStart || t == TypeRolloutTransition }

// CheckRollout checks what a RolloutStart carries, with a field path per
// problem, as policy.ValidationError (wrapping policy.ErrInvalid): 1 to
// MaxRolloutChanges changes of distinct policies, each a put of a policy
// with a name or a delete of a valid name; 1 to MaxRolloutStages stages
// with percents strictly increasing from 1 to a last of 100, and bakes
// from MinBake to MaxBake; ratios within 0..1; on_halt rollback or stay.
// The policies' own rules (kind, spec) are the validator's, checked where
// the write was taken.
func CheckRollout(r *commandv1.Rollout) error {
	errs := checkChanges(r.GetChanges())
	add := func(field, format string, args ...any) {
		errs = append(errs, policy.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	switch n := len(r.GetStages()); {
	case n == 0:
		add("stages", "at least one stage is required (the last at 100%%)")
	case n > MaxRolloutStages:
		add("stages", "%d stages, more than %d", n, MaxRolloutStages)
	}
	var prev uint32
	for i, s := range r.GetStages() {
		field := fmt.Sprintf("stages[%d]", i)
		switch p := s.GetPercent(); {
		case p < 1 || p > 100:
			add(field+".percent", "%d is not within 1..100", p)
		case p <= prev:
			add(field+".percent", "%d does not exceed the previous stage's %d", p, prev)
		}
		prev = max(prev, s.GetPercent())
		if bake := time.Duration(s.GetBakeMs()) * time.Millisecond; s.GetBakeMs() < MinBake.Milliseconds() || s.GetBakeMs() > MaxBake.Milliseconds() {
			add(field+".bake", "%v is not within %v..%v", bake, MinBake, MaxBake)
		}
	}
	if n := len(r.GetStages()); n > 0 && r.GetStages()[n-1].GetPercent() != 100 {
		add(fmt.Sprintf("stages[%d].percent", n-1), "the last stage must be 100, not %d", r.GetStages()[n-1].GetPercent())
	}
	for field, v := range map[string]float64{"max_nack_ratio": r.GetMaxNackRatio(), "min_ack_coverage": r.GetMinAckCoverage()} {
		if math.IsNaN(v) || v < 0 || v > 1 {
			add(field, "%v is not within 0..1", v)
		}
	}
	if oh := r.GetOnHalt(); oh != store.OnHaltRollback && oh != store.OnHaltStay {
		add("on_halt", "%q is not rollback or stay", oh)
	}
	if len(errs) == 0 {
		return nil
	}
	// By field, so that the same input gives the same message (the ratio
	// checks walk a map).
	slices.SortStableFunc(errs, func(a, b policy.FieldError) int { return strings.Compare(a.Field, b.Field) })
	return errs
}

// CheckChanges checks a change set alone, as CheckRollout does (an impact
// replay's changes, which have no stages).
func CheckChanges(changes []*commandv1.RolloutChange) error {
	if errs := checkChanges(changes); len(errs) > 0 {
		return errs
	}
	return nil
}

// checkChanges is CheckRollout's part for the changes.
func checkChanges(changes []*commandv1.RolloutChange) policy.ValidationError {
	var errs policy.ValidationError
	add := func(field, format string, args ...any) {
		errs = append(errs, policy.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	switch n := len(changes); {
	case n == 0:
		add("changes", "at least one change is required")
	case n > MaxRolloutChanges:
		add("changes", "%d changes, more than %d", n, MaxRolloutChanges)
	}
	seen := map[string]int{}
	for i, c := range changes {
		field := fmt.Sprintf("changes[%d]", i)
		var name string
		switch c.GetOp() {
		case store.OpPut:
			if c.GetPolicy() == nil {
				add(field+".policy", "required for op put")
				continue
			}
			if c.GetName() != "" {
				add(field+".name", "only for op delete; a put names its policy")
			}
			name = c.GetPolicy().GetName()
			if err := CheckKeys("policy", "name", name, "org", c.GetPolicy().GetScope().GetOrg()); err != nil {
				add(field+".policy", "%v", err)
				continue
			}
		case store.OpDelete:
			if c.GetPolicy() != nil {
				add(field+".policy", "only for op put; a delete names its policy")
			}
			name = c.GetName()
			if err := policy.ValidPolicyName(name); err != nil {
				add(field+".name", "%v", err)
				continue
			}
		default:
			add(field+".op", "%q is not put or delete", c.GetOp())
			continue
		}
		if j, dup := seen[name]; dup {
			add(field, "policy %q is also changed by changes[%d]; one change per policy", name, j)
			continue
		}
		seen[name] = i
	}
	return errs
}

// RolloutStart builds the command that starts r (its changes validated and
// canonical, as PutPolicy's; id, state and timestamps are the FSM's).
func RolloutStart(r *commandv1.Rollout) (*Command, error) {
	if err := CheckRollout(r); err != nil {
		return nil, err
	}
	return New(&commandv1.RolloutStart{Rollout: r})
}

// RolloutTransition builds the command that moves a rollout.
func RolloutTransition(t *commandv1.RolloutTransition) (*Command, error) {
	return New(t)
}
