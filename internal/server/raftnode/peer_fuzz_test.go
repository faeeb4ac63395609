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
	raw := func(cmd *commandv1.Command) {
		b, err := proto.Marshal(&clusterv1.ApplyRequest{Command: cmd})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed := func(c *command.Command, err error) {
		if err != nil {
			f.Fatal(err)
		}
		cmd, err := command.Encode(c)
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
	seed(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`{"name":"x","kind":"ToolPolicy","spec":{"tool_name":"B\xffsh"}}`)}))
	seed(command.PutEmployee(&policy.Employee{ID: "alice", Org: "acme", Status: "active"}, nil))
	seed(command.DeletePolicy("a.b", nil))
	raw(&commandv1.Command{Type: uint32(command.TypeRegisterMember), Payload: []byte{0x0a, 0x02, 'n', '1'}})
	raw(&commandv1.Command{Type: 0x7e})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req clusterv1.ApplyRequest
		if proto.Unmarshal(data, &req) != nil || req.GetCommand() == nil {
			return
		}
		cmd, err := command.Decode(req.GetCommand())
		if err != nil || n.vetCommand(cmd) != nil {
			return
		}
		if c := cmd.Body.GetPutPolicy(); c != nil {
			// A version 1 policy the leader admits is one the REST edge's
			// strict decode admits.
			if _, err := policy.DecodePolicy(c.GetPolicyJson()); c.GetPolicy() == nil && err != nil {
				t.Fatalf("the leader admits a policy the strict decoder refuses: %v", err)
			}
		}
		switch cmd.Type() {
		case command.TypePutPolicy, command.TypeDeletePolicy, command.TypePutEmployee, command.TypeDeleteEmployee:
			b, err := command.Marshal(cmd)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raftfsm.DecodeEntry(1, b); err != nil {
				t.Fatalf("the leader admits a command the FSM refuses: %v", err)
			}
		}
	})
}
