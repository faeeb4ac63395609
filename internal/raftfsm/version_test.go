package raftfsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
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
		cmd  *command.Command
	}{
		{"policy", mustTyped(t)(command.PutPolicy(pol("acme.deny", "acme", "deny"), nil))},
		{"policy with labels and escapes", mustTyped(t)(command.PutPolicy(labelled, nil))},
		{"policy with a precondition", mustTyped(t)(command.PutPolicy(pol("acme.cas", "acme", "audit"), &rev))},
		{"employee", mustTyped(t)(command.PutEmployee(emp("alice", "acme"), nil))},
		{"delete is the same in both", mustTyped(t)(command.DeletePolicy("acme.deny", nil))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			same, err := command.ForVersion(tc.cmd, command.CommandVersion)
			if err != nil {
				t.Fatal(err)
			}
			if same != tc.cmd {
				t.Error("command.ForVersion(command.CommandVersion) rewrote the command")
			}
			old, err := command.ForVersion(tc.cmd, 1)
			if err != nil {
				t.Fatal(err)
			}
			switch old.Type() {
			case command.TypePutPolicy:
				if pp := old.Body.GetPutPolicy(); pp.GetPolicy() != nil || len(pp.GetPolicyJson()) == 0 {
					t.Fatalf("version 1 put policy = %v, want JSON only", pp)
				}
			case command.TypePutEmployee:
				if pe := old.Body.GetPutEmployee(); pe.GetEmployee() != nil || len(pe.GetEmployeeJson()) == 0 {
					t.Fatalf("version 1 put employee = %v, want JSON only", pe)
				}
			}
			// Both forms, applied after the same history, store the same.
			typed, st1 := newFSM(t)
			json1, st2 := newFSM(t)
			seed := putPolicy(t, "acme.cas", "acme", nil)
			r1 := applyAll(t, typed, entry(t, 1, seed), entry(t, 2, enc(t, tc.cmd)))
			r2 := applyAll(t, json1, entry(t, 1, seed), entry(t, 2, enc(t, old)))
			if diff := cmp.Diff(r1, r2, protocmp.Transform()); diff != "" {
				t.Errorf("results differ (-typed +version 1):\n%s", diff)
			}
			if d1, d2 := digest(t, st1), digest(t, st2); d1 != d2 {
				t.Errorf("state digests differ: typed %s, version 1 %s", d1, d2)
			}
		})
	}
}

// TestForVersionRefusesShadow: a shadow policy cannot be written for a
// member below command version 4, which would drop the field and enforce
// it; an enforced one can, and version 4 keeps the field.
func TestForVersionRefusesShadow(t *testing.T) {
	shadow := pol("acme.shadow", "acme", "deny")
	shadow.Enforcement = policy.EnforcementShadow
	cmd := mustTyped(t)(command.PutPolicy(shadow, nil))
	if !command.IsShadowPut(cmd) {
		t.Fatal("IsShadowPut = false for a shadow policy")
	}
	for _, v := range []uint32{1, 2, 3} {
		if _, err := command.ForVersion(cmd, v); err == nil {
			t.Errorf("command.ForVersion(shadow, %d) succeeded", v)
		}
	}
	out, err := command.ForVersion(cmd, command.RolloutVersion)
	if err != nil {
		t.Fatal(err)
	}
	if pp := out.Body.GetPutPolicy(); pp.GetPolicy().GetEnforcement() != "shadow" {
		t.Errorf("version 4 put policy = %v, want enforcement shadow", pp)
	}
	enforced := pol("acme.enforced", "acme", "deny")
	enforced.Enforcement = policy.EnforcementEnforce
	cmd = mustTyped(t)(command.PutPolicy(enforced, nil))
	if command.IsShadowPut(cmd) {
		t.Error("IsShadowPut = true for an enforced policy")
	}
	if pp := cmd.Body.GetPutPolicy(); pp.GetPolicy().GetEnforcement() != "" {
		t.Errorf("enforce is stored as %q, want \"\"", pp.GetPolicy().GetEnforcement())
	}
	if _, err := command.ForVersion(cmd, 1); err != nil {
		t.Errorf("command.ForVersion(enforced, 1): %v", err)
	}
}

// TestRegisterAfreshResetsVersions: a node's first registration since start
// clears every other member's command version, its own kept.
func TestRegisterAfreshResetsVersions(t *testing.T) {
	f, st := newFSM(t)
	mem := func(id string) store.Member {
		return store.Member{ID: id, RaftAddr: "127.0.0.1:7000", CommandVersion: command.CommandVersion}
	}
	applyAll(t, f,
		entry(t, 1, mustCmd(t)(command.RegisterMember(mem("n1")))),
		entry(t, 2, mustCmd(t)(command.RegisterMember(mem("n2")))),
		entry(t, 3, mustCmd(t)(command.RegisterMemberAfresh(mem("n3")))),
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

// TestForVersionStripsAudit: for every command type in the table, a
// cluster below version 3 gets the command without its audit fields (a
// version 2 node would drop them unread, and its events would lack what the
// others record), its type and payload otherwise as version 2 writes them;
// version 3 gets it unchanged, and the caller's command is never modified.
func TestForVersionStripsAudit(t *testing.T) {
	if command.CommandVersion < 3 {
		t.Fatalf("command.CommandVersion = %d: want at least 3", command.CommandVersion)
	}
	for typ := range knownTypes {
		t.Run(fmt.Sprintf("type 0x%02x", uint8(typ)), func(t *testing.T) {
			plain, err := command.Decode(&commandv1.Command{Type: uint32(typ), OriginatedAtUnixNano: 7})
			if err != nil {
				t.Fatal(err)
			}
			if typ == command.TypePutPolicy {
				plain = mustTyped(t)(command.PutPolicy(pol("acme.p", "acme", "deny"), nil))
			}
			audited := *plain
			audited.Actor, audited.RequestID, audited.RevertedTo = "token:ops", "req-1", 4
			keep := enc(t, &audited)

			if !command.IsRolloutType(typ) && !command.IsSourceType(typ) {
				same, err := command.ForVersion(&audited, 3)
				if err != nil {
					t.Fatal(err)
				}
				if same != &audited {
					t.Error("command.ForVersion(3) rewrote the command")
				}
			}
			for _, v := range []uint32{0, 1, 2} {
				got, err := command.ForVersion(&audited, v)
				if command.IsRolloutType(typ) || command.IsSourceType(typ) {
					// Below RolloutVersion a rollout is refused, audit or
					// not, and so is a source's command below SourceVersion.
					var nu *command.NotUpgradedError
					if !errors.As(err, &nu) {
						t.Errorf("command.ForVersion(rollout, %d) = %v, want a NotUpgradedError", v, err)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if command.HasAudit(got) {
					t.Errorf("command.ForVersion(%d) kept audit fields: %v", v, got)
				}
				want, err := command.ForVersion(plain, v)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(enc(t, want), enc(t, got), protocmp.Transform()); diff != "" {
					t.Errorf("command.ForVersion(%d) differs from the command without audit fields (-want +got):\n%s", v, diff)
				}
			}
			if diff := cmp.Diff(keep, enc(t, &audited), protocmp.Transform()); diff != "" {
				t.Errorf("ForVersion modified its argument (-before +after):\n%s", diff)
			}
		})
	}
}

// TestAuditRecorded: a put, a delete, a revert and a retention prune with an
// actor record it, with the request id, in their events; a prune without an
// actor (a cluster below version 3) records no event, as a version 2 node
// would not, and neither does one that removed only earlier records.
func TestAuditRecorded(t *testing.T) {
	f, st := newFSM(t)
	audit := func(cmd *commandv1.Command, actor, rid string, to uint64) *commandv1.Command {
		cmd.Actor, cmd.RequestId, cmd.RevertedTo = actor, rid, to
		return cmd
	}
	applyAll(t, f,
		entry(t, 1, audit(putPolicy(t, "acme.p", "acme", nil), "token:ci", "r1", 0)),
		entry(t, 2, audit(putPolicy(t, "acme.p", "acme", nil), "cert:CN=alice", "r2", 1)),
		entry(t, 3, audit(mustCmd(t)(command.DeletePolicy("acme.p", nil)), "token:ops", "r3", 0)),
		entry(t, 4, mustCmd(t)(command.PruneEvents(processedAt(2)))),
		entry(t, 5, audit(mustCmd(t)(command.PruneEvents(processedAt(3))), command.ActorRetention, "", 0)),
		entry(t, 6, audit(mustCmd(t)(command.PruneEvents(processedAt(3))), command.ActorRetention, "", 0)), // nothing left to prune
	)
	page, err := st.ListEvents(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID         uint64
		Type       store.EntityType
		Actor, RID string
		To         uint64
	}
	var got []row
	for _, ev := range page.Events {
		got = append(got, row{ev.ID, ev.EntityType, ev.Actor, ev.RequestID, ev.RevertedTo})
	}
	want := []row{
		{3, store.EntityPolicy, "token:ops", "r3", 0},
		{5, store.EntityRetention, command.ActorRetention, "", 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if page.PrunedThrough != 2 {
		t.Errorf("pruned through %d, want 2", page.PrunedThrough)
	}

	// A prune of a policy's event and a record is recorded; one that
	// removes only a record is not, or records would never run out.
	applyAll(t, f,
		entry(t, 7, audit(mustCmd(t)(command.PruneEvents(processedAt(6))), command.ActorRetention, "", 0)),
		entry(t, 8, audit(mustCmd(t)(command.PruneEvents(processedAt(8))), command.ActorRetention, "", 0)),
	)
	if page, err = st.ListEvents(store.EventFilter{}); err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 0 || page.PrunedThrough != 7 {
		t.Errorf("after pruning the record: events %+v, pruned through %d; want none, through 7", page.Events, page.PrunedThrough)
	}
}

func TestCheckEnvelope(t *testing.T) {
	tests := []struct {
		name       string
		actor, rid string
		want       string // in the error; "" for none
	}{
		{"none", "", "", ""},
		{"token", "token:ops", "0af3", ""},
		{"certificate subject", "cert:CN=Ünïcode,O=acme", "", ""},
		{"control character", "token:ops\x1b[2J", "", "control character U+001B"},
		{"newline", "token:a\nb", "", "control character U+000A"},
		{"C1 control", "token:a\u0085", "", "control character U+0085"},
		{"invalid UTF-8", "token:\xff", "", "not valid UTF-8"},
		{"too long", strings.Repeat("a", command.MaxActorLen+1), "", "more than 1024"},
		{"request id with a space is fine", "", "a b", ""},
		{"request id not ASCII", "", "é", "printable ASCII"},
		{"request id too long", "", strings.Repeat("r", command.MaxRequestIDLen+1), "printable ASCII"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := command.CheckEnvelope(&command.Command{Actor: tc.actor, RequestID: tc.rid})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckEnvelope: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("CheckEnvelope: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
