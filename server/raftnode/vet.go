package raftnode

import (
	"bytes"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/config"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/raftfsm"
)

// vetCommand is the leader's check of a command that reached it through
// the peer plane (DESIGN part 11): the content rules the REST edge
// applies, so that a forged or buggy forward stores nothing the admin API
// would refuse. Commands a node makes itself (its REST edge, its leader
// tasks) were checked where they were made. Types without content rules
// beyond decoding are left to applyLocal's DecodeEntry.
func (n *Node) vetCommand(cmd *commandv1.Command) error {
	var err error
	switch raftfsm.Type(cmd.GetType()) {
	case raftfsm.TypePutPolicy:
		var c commandv1.PutPolicy
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil && !utf8.Valid(c.GetPolicy()) {
			err = fmt.Errorf("policy: not valid UTF-8")
		} else if err == nil {
			err = n.vetPolicy(c.GetPolicy())
		}
	case raftfsm.TypeDeletePolicy:
		var c commandv1.DeletePolicy
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil {
			err = policy.ValidPolicyName(c.GetName())
		}
	case raftfsm.TypePutEmployee:
		var c commandv1.PutEmployee
		if err = proto.Unmarshal(cmd.GetPayload(), &c); err == nil && !utf8.Valid(c.GetEmployee()) {
			err = fmt.Errorf("employee: not valid UTF-8")
		} else if err == nil {
			var e *policy.Employee
			if e, err = policy.DecodeEmployee(c.GetEmployee()); err == nil {
				err = n.validator.Employee(e)
			}
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
	case raftfsm.TypeSetClusterID:
		// Only the leader names the cluster, from its own leader task.
		err = fmt.Errorf("the cluster ID is not set through another node")
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errInvalidCommand, err)
	}
	return nil
}

// vetPolicy checks a forwarded policy as the REST edge's strict decode
// and validation would. What a node forwards is the canonical JSON of the
// policy it checked, which DecodeStored reads in one pass: when the bytes
// are exactly that policy's canonical form, they hold no unknown, repeated
// or misspelt field, and only validation is left. Anything else goes
// through the strict decoder, which names what is wrong; it costs four
// times as much, and every forwarded write passes here.
func (n *Node) vetPolicy(raw []byte) error {
	p, err := policy.DecodeStored(raw)
	if err == nil {
		if canon, cerr := p.Canonical(); cerr == nil && bytes.Equal(canon, raw) {
			return n.validator.Policy(p)
		}
	}
	if p, err = policy.DecodePolicy(raw); err != nil {
		return err
	}
	return n.validator.Policy(p)
}
