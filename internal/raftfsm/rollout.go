package raftfsm

import (
	"bytes"
	"encoding/json"
	"fmt"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

func prepareRolloutStart(m store.Meta, c *commandv1.RolloutStart) (func(*store.Batch) *commandv1.Result, error) {
	if c.GetRollout() == nil {
		return nil, fmt.Errorf("rollout start: no rollout")
	}
	if err := command.CheckRollout(c.GetRollout()); err != nil {
		return nil, fmt.Errorf("rollout start: %w", err)
	}
	if src := c.GetRollout().GetSource(); src != "" {
		if err := command.CheckSourceName(src); err != nil {
			return nil, fmt.Errorf("rollout start: %w", err)
		}
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
		for _, ch := range c.GetRollout().GetChanges() {
			if err := b.CheckWriter(store.ChangeName(ch), c.GetRollout().GetSource()); err != nil {
				return result(m.Index, 0, err)
			}
		}
		_, doc, err := b.StartRollout(m, c.GetRollout())
		if err != nil {
			return result(m.Index, 0, err)
		}
		return storedResult(m.Index, m.Index, doc)
	}, nil
}

func prepareRolloutTransition(m store.Meta, c *commandv1.RolloutTransition) (func(*store.Batch) *commandv1.Result, error) {
	if err := command.CheckKeys("rollout transition", "id", c.GetId()); err != nil {
		return nil, err
	}
	// Times beyond year 9999 do not encode as JSON, which the rollout's
	// event is.
	if at := c.GetAtUnixMs(); at < 0 || at > maxUnixMs {
		return nil, fmt.Errorf("rollout transition: at_unix_ms %d is not within 0..%d", at, maxUnixMs)
	}
	if len(c.GetReason()) > command.MaxKeyLen {
		return nil, fmt.Errorf("rollout transition: reason is %d bytes, more than %d", len(c.GetReason()), command.MaxKeyLen)
	}
	return func(b *store.Batch) *commandv1.Result {
		_, doc, err := b.TransitionRollout(m, c)
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
