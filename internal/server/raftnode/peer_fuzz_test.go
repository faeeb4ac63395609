package raftnode

import (
	"testing"

	"github.com/policyd/policyd/internal/command"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
)

// FuzzPeerApply decodes arbitrary bytes as a forwarded ApplyRequest and
// vets its command as the leader does: nothing panics, and a content
// command the leader admits is one every replica can decode.
func FuzzPeerApply(f *testing.F) {
	v, err := policy.NewValidator(nil)
	if err != nil {
		f.Fatal(err)
	}
	n := &Node{validator: v}
	seed := func(cmd *commandv1.Command, err error) {
		if err != nil {
			f.Fatal(err)
		}
		b, err := proto.Marshal(&clusterv1.ApplyRequest{Command: cmd})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(command.PutPolicy(&policy.Policy{Name: "a.b", Kind: "ToolPolicy", Spec: []byte(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["rm"]}}`)}, nil))
	seed(command.NewCommand(command.TypePutPolicy, &commandv1.PutPolicy{PolicyJson: []byte(`{"name":"x","kind":"ToolPolicy","spec":{"tool_name":"B\xffsh"}}`)}))
	seed(command.PutEmployee(&policy.Employee{ID: "alice", Org: "acme", Status: "active"}, nil))
	seed(command.DeletePolicy("a.b", nil))
	seed(&commandv1.Command{Type: uint32(command.TypeRegisterMember), Payload: []byte{0x0a, 0x02, 'n', '1'}}, nil)
	seed(&commandv1.Command{Type: 0x7e}, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		var req clusterv1.ApplyRequest
		if proto.Unmarshal(data, &req) != nil || req.GetCommand() == nil {
			return
		}
		cmd := req.GetCommand()
		if n.vetCommand(cmd) != nil {
			return
		}
		if command.Type(cmd.GetType()) == command.TypePutPolicy {
			// A version 1 policy the leader admits is one the REST edge's
			// strict decode admits.
			var c commandv1.PutPolicy
			if err := proto.Unmarshal(cmd.GetPayload(), &c); err != nil {
				t.Fatal(err)
			}
			if _, err := policy.DecodePolicy(c.GetPolicyJson()); c.GetPolicy() == nil && err != nil {
				t.Fatalf("the leader admits a policy the strict decoder refuses: %v", err)
			}
		}
		switch command.Type(cmd.GetType()) {
		case command.TypePutPolicy, command.TypeDeletePolicy, command.TypePutEmployee, command.TypeDeleteEmployee:
			b, err := proto.Marshal(cmd)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raftfsm.DecodeEntry(1, b); err != nil {
				t.Fatalf("the leader admits a command the FSM refuses: %v", err)
			}
		}
	})
}
