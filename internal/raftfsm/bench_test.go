package raftfsm

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/third_party/raft"
)

// BenchmarkApplyPutPolicy4K applies batches of 4 KB policy writes over 10
// keys, as the bench harness's writers send them: the FSM's share of a
// write's CPU on every replica. Run with -benchmem; profile with
// -cpuprofile.
func BenchmarkApplyPutPolicy4K(b *testing.B) {
	// audited: with an actor and request id in the envelope, as every
	// admin API write carries since command version 3 (their cost).
	for _, audited := range []bool{false, true} {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("audited=%v/batch=%d", audited, batch), func(b *testing.B) {
				f, _ := newFSM(b)
				cmds := make([][]byte, 10)
				for i := range cmds {
					p := pol(fmt.Sprintf("bench-%d", i), "acme", "deny")
					p.Spec = json.RawMessage(`{"action":"deny","reason":"` + strings.Repeat("x", 4000) + `","tool_name":"Bash"}`)
					cmd := mustCmd(b)(command.PutPolicy(p, nil))
					if audited {
						cmd.Actor, cmd.RequestId = "token:ci-deployer", "0123456789abcdef0123456789abcdef"
					}
					cmds[i] = stamp(b, 1, cmd)
				}
				logs := make([]*raft.Log, batch)
				idx := uint64(0)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i += batch {
					for j := range logs {
						idx++
						logs[j] = &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: cmds[idx%10]}
					}
					for _, r := range f.ApplyBatch(logs) {
						if res := asResult(b, r); res.GetCode() != "" {
							b.Fatalf("apply: %s %s", res.GetCode(), res.GetMessage())
						}
					}
				}
			})
		}
	}
}
