package raftnode

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/policy"
)

// BenchmarkVetPutPolicy4K is the leader's check of a forwarded 4 KB policy
// write, the body the bench harness's writers send.
func BenchmarkVetPutPolicy4K(b *testing.B) {
	v, err := policy.NewValidator(nil)
	if err != nil {
		b.Fatal(err)
	}
	n := &Node{validator: v}
	cmd, err := command.PutPolicy(&policy.Policy{Name: "bench-w1-1", Kind: "ToolPolicy",
		Spec: json.RawMessage(`{"action":"deny","reason":"` + strings.Repeat("x", 4000) + `","tool_name":"Bash"}`)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := n.vetCommand(cmd); err != nil {
			b.Fatal(err)
		}
	}
}
