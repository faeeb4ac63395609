package raftfsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
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
	var errs policy.ValidationError
	add := func(field, format string, args ...any) {
		errs = append(errs, policy.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	switch n := len(r.GetChanges()); {
	case n == 0:
		add("changes", "at least one change is required")
	case n > MaxRolloutChanges:
		add("changes", "%d changes, more than %d", n, MaxRolloutChanges)
	}
	seen := map[string]int{}
	for i, c := range r.GetChanges() {
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
			if err := checkKeys("policy", "name", name, "org", c.GetPolicy().GetScope().GetOrg()); err != nil {
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

// RolloutStart builds the command that starts r (its changes validated and
// canonical, as PutPolicy's; id, state and timestamps are the FSM's).
func RolloutStart(r *commandv1.Rollout) (*commandv1.Command, error) {
	if err := CheckRollout(r); err != nil {
		return nil, err
	}
	return NewCommand(TypeRolloutStart, &commandv1.RolloutStart{Rollout: r})
}

// RolloutTransition builds the command that moves a rollout.
func RolloutTransition(t *commandv1.RolloutTransition) (*commandv1.Command, error) {
	return NewCommand(TypeRolloutTransition, t)
}

// PolicyMessage is p as a command carries it, its spec canonicalised.
func PolicyMessage(p *policy.Policy) (*commandv1.Policy, error) {
	spec, err := p.CanonicalSpec()
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", p.Name, err)
	}
	return &commandv1.Policy{
		Name: p.Name, Kind: p.Kind, Labels: p.Labels, Spec: spec,
		Enforcement: policy.CanonicalEnforcement(p.Enforcement),
		Scope:       &commandv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
	}, nil
}

func decodeRolloutStart(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.RolloutStart
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	if c.GetRollout() == nil {
		return nil, fmt.Errorf("rollout start: no rollout")
	}
	if err := CheckRollout(c.GetRollout()); err != nil {
		return nil, fmt.Errorf("rollout start: %w", err)
	}
	// The proposer validated the policies; a spec that is not a JSON
	// object would still make the rollout's JSON, and so its apply, fail
	// on every replica.
	for i, ch := range c.GetRollout().GetChanges() {
		if spec := ch.GetPolicy().GetSpec(); ch.GetOp() == store.OpPut && !specObject(spec) {
			return nil, fmt.Errorf("rollout start: changes[%d].policy.spec is not a JSON object", i)
		}
	}
	return func(b *store.Batch) *commandv1.Result {
		_, doc, err := b.StartRollout(m, c.GetRollout())
		if err != nil {
			return result(m.Index, 0, err)
		}
		return storedResult(m.Index, m.Index, doc)
	}, nil
}

func decodeRolloutTransition(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.RolloutTransition
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	if err := checkKeys("rollout transition", "id", c.GetId()); err != nil {
		return nil, err
	}
	// Times beyond year 9999 do not encode as JSON, which the rollout's
	// event is.
	if at := c.GetAtUnixMs(); at < 0 || at > maxUnixMs {
		return nil, fmt.Errorf("rollout transition: at_unix_ms %d is not within 0..%d", at, maxUnixMs)
	}
	if len(c.GetReason()) > MaxKeyLen {
		return nil, fmt.Errorf("rollout transition: reason is %d bytes, more than %d", len(c.GetReason()), MaxKeyLen)
	}
	return func(b *store.Batch) *commandv1.Result {
		_, doc, err := b.TransitionRollout(m, &c)
		if err != nil {
			return result(m.Index, 0, err)
		}
		return storedResult(m.Index, m.Index, doc)
	}, nil
}

// maxUnixMs is the last millisecond of year 9999, the last JSON encodes.
const maxUnixMs = 253402300799999

// specObject reports whether spec is one JSON object.
func specObject(spec []byte) bool {
	t := bytes.TrimSpace(spec)
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}

// underRollout is the conflict of a plain write to a policy an active
// rollout stages.
func underRollout(b *store.Batch, name string) error {
	if id := b.RolloutLock(name); id != "" {
		return fmt.Errorf("policy %q is under rollout %s: %w", name, id, store.ErrConflict)
	}
	return nil
}

// ConflictResult is the result of a command refused before it was
// proposed, as the FSM reports a conflict: it crosses a forwarded write
// like one.
func ConflictResult(msg string) *commandv1.Result {
	return &commandv1.Result{Code: codeConflict, Message: msg}
}
