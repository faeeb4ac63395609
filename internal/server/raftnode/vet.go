package raftnode

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/store"
)

// vetCommand is the leader's check of a command that reached it through
// the peer plane (docs/security.md): the content rules the REST edge
// applies, so that a forged or buggy forward stores nothing the admin API
// would refuse. Commands a node makes itself (its REST edge, its leader
// tasks) were checked where they were made. Types without content rules
// beyond decoding are left to applyLocal's DecodeEntry.
func (n *Node) vetCommand(cmd *commandv1.Command) error {
	var err error
	switch raftfsm.Type(cmd.GetType()) {
	case raftfsm.TypePutPolicy:
		var c commandv1.PutPolicy
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil {
			err = n.vetPolicy(&c)
		}
	case raftfsm.TypeDeletePolicy:
		var c commandv1.DeletePolicy
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil {
			err = policy.ValidPolicyName(c.GetName())
		}
	case raftfsm.TypePutEmployee:
		var c commandv1.PutEmployee
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil {
			err = n.vetEmployee(&c)
		}
	case raftfsm.TypeDeleteEmployee:
		var c commandv1.DeleteEmployee
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil {
			err = policy.ValidEmployeeID(c.GetId())
		}
	case raftfsm.TypeRegisterMember:
		var c commandv1.RegisterMember
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil {
			err = checkMember(c.GetId(), c.GetRaftAddr())
		}
	case raftfsm.TypeRemoveMember:
		var c commandv1.RemoveMember
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil && !config.ValidNodeID(c.GetId()) {
			err = fmt.Errorf("id %q is not a valid node id", c.GetId())
		}
	case raftfsm.TypeRolloutStart:
		var c commandv1.RolloutStart
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil {
			err = n.vetRollout(c.GetRollout())
		}
	case raftfsm.TypeSetClusterID:
		// Only the leader names the cluster, from its own leader task.
		err = fmt.Errorf("the cluster ID is not set through another node")
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errInvalidCommand, err)
	}
	return nil
}

// vetPolicy checks a forwarded policy. A typed one (command version 2) is
// checked from the message alone: its name, kind, scope and labels, and
// that its spec is a well-formed JSON object, scanned but not decoded (the
// issue's rule: the leader does not parse a policy again). The kind's own
// rules (patterns, CEL) ran on the member that took the write, which holds
// the cluster's credentials. JSON from a node of version 1 goes through the
// strict decoder and the whole validation, as the REST edge does.
func (n *Node) vetPolicy(c *commandv1.PutPolicy) error {
	if pb := c.GetPolicy(); pb != nil {
		if !utf8.Valid(pb.GetSpec()) {
			return fmt.Errorf("policy spec: not valid UTF-8")
		}
		return n.validator.Shape(raftfsm.PolicyOf(pb))
	}
	raw := c.GetPolicyJson()
	if !utf8.Valid(raw) {
		return fmt.Errorf("policy: not valid UTF-8")
	}
	p, err := policy.DecodePolicy(raw)
	if err != nil {
		return err
	}
	return n.validator.Policy(p)
}

// vetEmployee checks a forwarded employee as the REST edge does.
func (n *Node) vetEmployee(c *commandv1.PutEmployee) error {
	if pb := c.GetEmployee(); pb != nil {
		return n.validator.Employee(raftfsm.EmployeeOf(pb))
	}
	raw := c.GetEmployeeJson()
	if !utf8.Valid(raw) {
		return fmt.Errorf("employee: not valid UTF-8")
	}
	e, err := policy.DecodeEmployee(raw)
	if err != nil {
		return err
	}
	return n.validator.Employee(e)
}

// vetRollout checks a forwarded rollout as the REST edge does, each put's
// policy as vetPolicy checks a typed one.
func (n *Node) vetRollout(r *commandv1.Rollout) error {
	if r == nil {
		return fmt.Errorf("rollout start: no rollout")
	}
	if err := raftfsm.CheckRollout(r); err != nil {
		return err
	}
	for i, c := range r.GetChanges() {
		if c.GetOp() != store.OpPut {
			continue
		}
		if !utf8.Valid(c.GetPolicy().GetSpec()) {
			return fmt.Errorf("changes[%d].policy.spec: not valid UTF-8", i)
		}
		if err := n.validator.Shape(raftfsm.PolicyOf(c.GetPolicy())); err != nil {
			return fmt.Errorf("changes[%d].policy: %w", i, err)
		}
	}
	return nil
}
