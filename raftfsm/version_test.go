package raftfsm

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/store"
)

// TestForVersion: a typed command written for a cluster of version 1 is the
// JSON a release node reads, and applies to the same state as the typed
// one; for version 2 it is unchanged.
func TestForVersion(t *testing.T) {
	labelled := pol("acme.labelled", "acme", "deny")
	labelled.Labels = map[string]string{"tier": "prod", "team": "a<b"}
	labelled.Spec = json.RawMessage(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["rm -rf","<&>"]}}`)
	rev := uint64(1)
	tests := []struct {
		name string
		cmd  *commandv1.Command
	}{
		{"policy", putPolicy(t, "acme.deny", "acme", nil)},
		{"policy with labels and escapes", mustCmd(t)(PutPolicy(labelled, nil))},
		{"policy with a precondition", mustCmd(t)(PutPolicy(pol("acme.cas", "acme", "audit"), &rev))},
		{"employee", mustCmd(t)(PutEmployee(emp("alice", "acme"), nil))},
		{"delete is the same in both", mustCmd(t)(DeletePolicy("acme.deny", nil))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			same, err := ForVersion(tc.cmd, CommandVersion)
			if err != nil {
				t.Fatal(err)
			}
			if same != tc.cmd {
				t.Error("ForVersion(CommandVersion) rewrote the command")
			}
			old, err := ForVersion(tc.cmd, 1)
			if err != nil {
				t.Fatal(err)
			}
			var pp commandv1.PutPolicy
			var pe commandv1.PutEmployee
			switch Type(old.GetType()) {
			case TypePutPolicy:
				if err := proto.Unmarshal(old.GetPayload(), &pp); err != nil || pp.GetPolicy() != nil || len(pp.GetPolicyJson()) == 0 {
					t.Fatalf("version 1 put policy = %v (%v), want JSON only", &pp, err)
				}
			case TypePutEmployee:
				if err := proto.Unmarshal(old.GetPayload(), &pe); err != nil || pe.GetEmployee() != nil || len(pe.GetEmployeeJson()) == 0 {
					t.Fatalf("version 1 put employee = %v (%v), want JSON only", &pe, err)
				}
			}
			// Both forms, applied after the same history, store the same.
			typed, st1 := newFSM(t)
			json1, st2 := newFSM(t)
			seed := putPolicy(t, "acme.cas", "acme", nil)
			r1 := applyAll(t, typed, entry(t, 1, seed), entry(t, 2, tc.cmd))
			r2 := applyAll(t, json1, entry(t, 1, seed), entry(t, 2, old))
			if diff := cmp.Diff(r1, r2, protocmp.Transform()); diff != "" {
				t.Errorf("results differ (-typed +version 1):\n%s", diff)
			}
			if d1, d2 := digest(t, st1), digest(t, st2); d1 != d2 {
				t.Errorf("state digests differ: typed %s, version 1 %s", d1, d2)
			}
		})
	}
}

// TestRegisterAfreshResetsVersions: a node's first registration since start
// clears every other member's command version, its own kept.
func TestRegisterAfreshResetsVersions(t *testing.T) {
	f, st := newFSM(t)
	mem := func(id string) store.Member {
		return store.Member{ID: id, RaftAddr: "127.0.0.1:7000", CommandVersion: CommandVersion}
	}
	applyAll(t, f,
		entry(t, 1, mustCmd(t)(RegisterMember(mem("n1")))),
		entry(t, 2, mustCmd(t)(RegisterMember(mem("n2")))),
		entry(t, 3, mustCmd(t)(RegisterMemberAfresh(mem("n3")))),
	)
	got, err := st.Members()
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Member{mem("n1"), mem("n2"), mem("n3")}
	want[0].CommandVersion, want[1].CommandVersion = 0, 0
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
}
