package raftnode

import (
	"fmt"
	"unicode/utf8"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

// vetRollout checks a forwarded rollout as the REST edge does, each put's
// policy as vetPolicy checks a typed one.
func (n *Node) vetRollout(r *commandv1.Rollout) error {
	if r == nil {
		return fmt.Errorf("rollout start: no rollout")
	}
	if err := command.CheckRollout(r); err != nil {
		return err
	}
	for i, c := range r.GetChanges() {
		if c.GetOp() != store.OpPut {
			continue
		}
		if !utf8.Valid(c.GetPolicy().GetSpec()) {
			return fmt.Errorf("changes[%d].policy.spec: not valid UTF-8", i)
		}
		if err := n.validator.Shape(command.PolicyOf(c.GetPolicy())); err != nil {
			return fmt.Errorf("changes[%d].policy: %w", i, err)
		}
	}
	return nil
}
