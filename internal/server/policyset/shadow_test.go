package policyset

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/store"
)

// TestSetForShadow: a client that declared the shadow capability is served
// every policy; one that did not, the set without shadow policies, under
// its own version, and the same *Set each time. A set without shadow
// policies is its own WithoutShadow.
func TestSetForShadow(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fsm := raftfsm.New(st, logger)
	var logs []*raft.Log
	for i, p := range []*policy.Policy{
		{Name: "acme.enforced", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "acme"}, Spec: []byte(`{"tool_name":"Bash","action":"deny"}`)},
		{Name: "acme.shadow", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "acme"}, Enforcement: policy.EnforcementShadow, Spec: []byte(`{"tool_name":"Read","action":"deny"}`)},
		{Name: "other.enforced", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "other"}, Spec: []byte(`{"tool_name":"Bash","action":"deny"}`)},
	} {
		cmd, err := command.PutPolicy(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		cmd.ProcessedAtUnixNano = time.Now().UnixNano()
		data, err := command.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, &raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: data})
	}
	for _, r := range fsm.ApplyBatch(logs) {
		if res, ok := r.(*commandv1.Result); ok {
			if err := command.ResultErr(res); err != nil {
				t.Fatal(err)
			}
		}
	}
	x, err := New(st)
	if err != nil {
		t.Fatal(err)
	}
	acme := policy.Identity{Org: "acme", Team: "t", Employee: "e"}
	names := func(s *Set) []string {
		var out []string
		for _, rp := range s.Policies {
			out = append(out, rp.Policy.Name)
		}
		return out
	}
	full := x.SetFor(acme, "c1", Caps{Rollouts: true, Shadow: true})
	if got := names(full); len(got) != 2 || got[1] != "acme.shadow" {
		t.Fatalf("shadow-capable set = %v, want acme.enforced and acme.shadow", got)
	}
	if rp, _ := full.Lookup("acme.shadow"); !rp.Policy.Shadow() {
		t.Error("acme.shadow is not marked shadow in the set")
	}
	if !full.HasShadow() {
		t.Error("HasShadow = false for a set holding a shadow policy")
	}
	v1 := x.SetFor(acme, "c2", Caps{})
	if got := names(v1); len(got) != 1 || got[0] != "acme.enforced" {
		t.Fatalf("v1 set = %v, want acme.enforced only", got)
	}
	if v1.Version == full.Version {
		t.Error("the set without shadow policies has the full set's version")
	}
	if again := x.SetFor(acme, "c3", Caps{Rollouts: true}); again != v1 {
		t.Error("SetFor without shadow gave another *Set for the same identity")
	}
	// The version is the content hash, as store.PolicySet's would be for
	// the enforced policies alone.
	h := store.NewSetHash()
	h.Add(v1.Policies[0].Policy.Name, v1.Policies[0].Stored)
	if v1.Version != h.Sum() {
		t.Errorf("v1 version %s, want the hash of its content %s", v1.Version, h.Sum())
	}
	other := x.SetFor(policy.Identity{Org: "other"}, "c4", Caps{Shadow: true})
	if other.WithoutShadow() != other || other.HasShadow() {
		t.Error("a set without shadow policies is not its own WithoutShadow")
	}
	if x.SetFor(policy.Identity{Org: "other"}, "c5", Caps{}) != other {
		t.Error("clients with and without shadow got other sets where no shadow policy applies")
	}
}
