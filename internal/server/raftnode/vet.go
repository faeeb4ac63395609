package raftnode

import (
	"fmt"
	"unicode/utf8"

	"github.com/policyd/policyd/internal/command"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
)

// vetCommand is the leader's check of a command that reached it through
// the peer plane (docs/security.md): the content rules the REST edge applies, so that a forged
// or buggy forward stores nothing the admin API would refuse. Commands a
// node makes itself (its REST edge, its leader tasks) were checked where
// they were made. Types without content rules beyond what the FSM checks
// are left to admit's raftfsm.Check.
func (n *Node) vetCommand(c *command.Command) error {
	var err error
	switch k := c.Body.GetKind().(type) {
	case *commandv1.Body_PutPolicy:
		err = n.vetPolicy(k.PutPolicy)
	case *commandv1.Body_DeletePolicy:
		err = policy.ValidPolicyName(k.DeletePolicy.GetName())
	case *commandv1.Body_PutEmployee:
		err = n.vetEmployee(k.PutEmployee)
	case *commandv1.Body_DeleteEmployee:
		err = policy.ValidEmployeeID(k.DeleteEmployee.GetId())
	case *commandv1.Body_RegisterMember:
		err = checkMember(k.RegisterMember.GetId(), k.RegisterMember.GetRaftAddr())
	case *commandv1.Body_RemoveMember:
		if id := k.RemoveMember.GetId(); !config.ValidNodeID(id) {
			err = fmt.Errorf("id %q is not a valid node id", id)
		}
	case *commandv1.Body_RolloutStart:
		err = n.vetRollout(k.RolloutStart.GetRollout())
	case *commandv1.Body_SetClusterId:
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
		return n.validator.Shape(command.PolicyOf(pb))
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
		return n.validator.Employee(command.EmployeeOf(pb))
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
