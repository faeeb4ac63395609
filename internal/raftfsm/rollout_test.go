package raftfsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

func polMsg(t testing.TB, name, org, action string) *commandv1.Policy {
	t.Helper()
	pb, err := command.PolicyMessage(pol(name, org, action))
	if err != nil {
		t.Fatal(err)
	}
	return pb
}

// testRollout puts each of puts (org acme, action allow) and deletes each
// of deletes, in stages 50% and 100% of a minute each.
func testRollout(t testing.TB, onHalt string, puts []string, deletes ...string) *commandv1.Rollout {
	r := &commandv1.Rollout{
		MaxNackRatio: 0.1, MinAckCoverage: 1, OnHalt: onHalt,
		Stages: []*commandv1.RolloutStage{{Percent: 50, BakeMs: 60000}, {Percent: 100, BakeMs: 60000}},
	}
	for _, n := range puts {
		r.Changes = append(r.Changes, &commandv1.RolloutChange{Op: store.OpPut, Policy: polMsg(t, n, "acme", "allow")})
	}
	for _, n := range deletes {
		r.Changes = append(r.Changes, &commandv1.RolloutChange{Op: store.OpDelete, Name: n})
	}
	return r
}

func startCmd(t testing.TB, r *commandv1.Rollout) *commandv1.Command {
	t.Helper()
	return withAudit(mustCmd(t)(command.RolloutStart(r)), "token:ops", "req-start")
}

func moveCmd(t testing.TB, id, fromState string, fromStage uint32, to string, stage uint32) *commandv1.Command {
	t.Helper()
	return withAudit(mustCmd(t)(command.RolloutTransition(&commandv1.RolloutTransition{
		Id: id, ExpectState: fromState, ExpectStage: fromStage, State: to, Stage: stage, AtUnixMs: 4242, Reason: "why",
	})), command.ActorRollout, "")
}

// TestRolloutCommands applies a rollout's life, entry by entry: the
// conflicts of overlapping rollouts and plain writes, the compare-and-set
// and the state machine on transitions, and completion writing the changes
// as ordinary revisions with the rollout's actor.
func TestRolloutCommands(t *testing.T) {
	f, st := newFSM(t)
	sub := st.SubscribeWithData()
	defer sub.Close()
	applyAll(t, f,
		entry(t, 1, putPolicy(t, "acme.a", "acme", nil)),
		entry(t, 2, putPolicy(t, "acme.d", "acme", nil)),
		entry(t, 3, mustCmd(t)(command.PutPolicy(&policy.Policy{Name: "acme.m", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "beta"},
			Spec: json.RawMessage(`{"action":"deny","tool_name":"Bash"}`)}, nil))),
	)
	sub.Next()
	const id = "r4"
	steps := []struct {
		name  string
		cmd   *commandv1.Command
		code  string // "" success, else the result's code
		msg   string // in the message
		state string // the rollout's state after the step, when it succeeded
		stage uint32
	}{
		{"start", startCmd(t, testRollout(t, store.OnHaltStay, []string{"acme.a", "acme.n", "acme.m"}, "acme.d")), "", "", store.RolloutRunning, 0},
		{"overlapping start", startCmd(t, testRollout(t, store.OnHaltRollback, []string{"acme.x", "acme.n"})), command.CodeConflict, `policy "acme.n" is under rollout r4`, "", 0},
		{"delete of a missing policy", startCmd(t, testRollout(t, store.OnHaltRollback, nil, "acme.none")), command.CodeConflict, `"acme.none" does not exist`, "", 0},
		{"put under rollout", putPolicy(t, "acme.a", "acme", nil), command.CodeConflict, `policy "acme.a" is under rollout r4`, "", 0},
		{"delete under rollout", mustCmd(t)(command.DeletePolicy("acme.d", nil)), command.CodeConflict, `policy "acme.d" is under rollout r4`, "", 0},
		{"stale expectation", moveCmd(t, id, store.RolloutPaused, 0, store.RolloutRunning, 0), command.CodeConflict, "is running at stage 0, not paused at stage 0", "", 0},
		{"unknown rollout", moveCmd(t, "r99", store.RolloutRunning, 0, store.RolloutPaused, 0), command.CodeNotFound, "r99", "", 0},
		{"skipping a stage", moveCmd(t, id, store.RolloutRunning, 0, store.RolloutRunning, 2), command.CodeConflict, "cannot go from running at stage 0 to running at stage 2", "", 0},
		{"rolled back with on_halt stay", moveCmd(t, id, store.RolloutRunning, 0, store.RolloutRolledBack, 0), command.CodeConflict, "cannot go", "", 0},
		{"halt", moveCmd(t, id, store.RolloutRunning, 0, store.RolloutHalted, 0), "", "", store.RolloutHalted, 0},
		{"advance while halted", moveCmd(t, id, store.RolloutHalted, 0, store.RolloutRunning, 1), command.CodeConflict, "cannot go", "", 0},
		{"resume", moveCmd(t, id, store.RolloutHalted, 0, store.RolloutRunning, 0), "", "", store.RolloutRunning, 0},
		{"advance", moveCmd(t, id, store.RolloutRunning, 0, store.RolloutRunning, 1), "", "", store.RolloutRunning, 1},
		{"the same decision again", moveCmd(t, id, store.RolloutRunning, 0, store.RolloutRunning, 1), command.CodeConflict, "at stage 1, not running at stage 0", "", 0},
		{"past the last stage", moveCmd(t, id, store.RolloutRunning, 1, store.RolloutRunning, 2), command.CodeConflict, "cannot go", "", 0},
		{"pause", moveCmd(t, id, store.RolloutRunning, 1, store.RolloutPaused, 1), "", "", store.RolloutPaused, 1},
		{"complete", moveCmd(t, id, store.RolloutPaused, 1, store.RolloutCompleted, 1), "", "", store.RolloutCompleted, 1},
		{"abort after completion", moveCmd(t, id, store.RolloutCompleted, 1, store.RolloutAborted, 1), command.CodeConflict, "cannot go", "", 0},
		{"put after completion", putPolicy(t, "acme.a", "acme", nil), "", "", "", 0},
	}
	for i, s := range steps {
		idx := uint64(4 + i)
		res := applyAll(t, f, entry(t, idx, s.cmd))[0]
		if res.GetCode() != s.code || !strings.Contains(res.GetMessage(), s.msg) {
			t.Fatalf("step %d %s: result %q %q, want %q with %q", idx, s.name, res.GetCode(), res.GetMessage(), s.code, s.msg)
		}
		if s.state == "" {
			continue
		}
		r, err := st.Rollout(id)
		if err != nil {
			t.Fatal(err)
		}
		if r.GetState() != s.state || r.GetStage() != s.stage {
			t.Fatalf("step %d %s: rollout %s at %d, want %s at %d", idx, s.name, r.GetState(), r.GetStage(), s.state, s.stage)
		}
		var doc store.RolloutDoc
		if err := json.Unmarshal(res.GetValue(), &doc); err != nil || doc.State != s.state || doc.ID != id {
			t.Fatalf("step %d %s: result value %s (%v)", idx, s.name, res.GetValue(), err)
		}
	}

	r, err := st.Rollout(id)
	if err != nil {
		t.Fatal(err)
	}
	if r.GetActor() != "token:ops" || r.GetRequestId() != "req-start" || r.GetCreatedAtUnixMs() != processedAt(4).UnixMilli() {
		t.Errorf("rollout audit: %q %q %d", r.GetActor(), r.GetRequestId(), r.GetCreatedAtUnixMs())
	}
	if r.GetStageStartedAtUnixMs() != 4242 {
		t.Errorf("stage_started_at = %d, want the advance's 4242", r.GetStageStartedAtUnixMs())
	}
	const done = 20 // the completing entry
	for _, name := range []string{"acme.n", "acme.m"} {
		p, err := st.GetPolicy(name)
		if err != nil {
			t.Fatalf("%s after completion: %v", name, err)
		}
		if p.Revision != done || !strings.Contains(string(p.Spec), `"allow"`) {
			t.Errorf("%s after completion: revision %d spec %s", name, p.Revision, p.Spec)
		}
	}
	if _, err := st.GetPolicy("acme.d"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("acme.d after completion: %v", err)
	}
	for _, name := range []string{"acme.n", "acme.m", "acme.d"} {
		ev, err := st.Revision(store.EntityPolicy, name, done)
		if name == "acme.d" {
			// A delete is not a revision; its event is in the history.
			h, _, herr := st.History(store.EntityPolicy, name)
			if herr != nil || h[len(h)-1].ID != done || h[len(h)-1].Actor != "token:ops" {
				t.Errorf("history of acme.d: %+v %v", h, herr)
			}
			continue
		}
		if err != nil || ev.Actor != "token:ops" || ev.RequestID != "req-start" {
			t.Errorf("revision %d of %s: %+v %v", done, name, ev, err)
		}
	}
	page, err := st.ListEvents(store.EventFilter{After: done - 1, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, ev := range page.Events {
		kinds = append(kinds, fmt.Sprintf("%d %s %s %s", ev.ID, ev.EntityType, ev.EntityID, ev.Action))
	}
	want := []string{
		"20 policy acme.a UPDATE", "20 policy acme.n CREATE", "20 policy acme.m UPDATE", "20 policy acme.d DELETE", "20 rollout r4 UPDATE",
	}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("events of the completion, a page of limit 1 (-want +got):\n%s", diff)
	}

	// Notifications: every rollout write carries the stored rollout and the
	// scopes of its policies, old and new; completion's policy writes come
	// first.
	var got []string
	for _, c := range sub.Next() {
		for _, e := range c.Entities {
			line := fmt.Sprintf("%d %s %s %s", e.Index, e.Type, e.ID, e.Action)
			if e.Type == store.EntityRollout {
				var r commandv1.Rollout
				if err := proto.Unmarshal(e.Data, &r); err != nil {
					t.Fatal(err)
				}
				var orgs []string
				for _, sc := range e.Scopes {
					orgs = append(orgs, sc.Org)
				}
				slices.Sort(orgs)
				line += fmt.Sprintf(" %s/%d %v", r.GetState(), r.GetStage(), orgs)
			}
			got = append(got, line)
		}
	}
	want = []string{
		"4 rollout r4 CREATE running/0 [acme beta]",
		"13 rollout r4 UPDATE halted/0 [acme beta]",
		"15 rollout r4 UPDATE running/0 [acme beta]",
		"16 rollout r4 UPDATE running/1 [acme beta]",
		"19 rollout r4 UPDATE paused/1 [acme beta]",
		"20 policy acme.a UPDATE", "20 policy acme.n CREATE", "20 policy acme.m UPDATE", "20 policy acme.d DELETE",
		"20 rollout r4 UPDATE completed/1 [acme beta]",
		"22 policy acme.a UPDATE",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("notifications (-want +got):\n%s", diff)
	}

	// Retention prunes the completion's events together.
	applyAll(t, f, entry(t, 23, mustCmd(t)(command.PruneEvents(processedAt(21)))))
	page, err = st.ListEvents(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) == 0 || page.Events[0].ID < 21 || page.PrunedThrough != done {
		t.Errorf("after pruning through entry 20: first event %+v, pruned through %d", page.Events[:min(1, len(page.Events))], page.PrunedThrough)
	}
	if _, err := st.Revision(store.EntityPolicy, "acme.n", done); !errors.Is(err, store.ErrPruned) {
		t.Errorf("pruned revision: %v, want ErrPruned", err)
	}
}

// TestRolloutReplicasAgree: two replicas applying the same entries, one
// by one and in one batch, hold the same bytes; a snapshot carries the
// rollouts and their locks.
func TestRolloutReplicasAgree(t *testing.T) {
	logs := []*raft.Log{
		entry(t, 1, putPolicy(t, "acme.a", "acme", nil)),
		entry(t, 2, startCmd(t, testRollout(t, store.OnHaltRollback, []string{"acme.a", "acme.b", "acme.c"}))),
		entry(t, 3, moveCmd(t, "r2", store.RolloutRunning, 0, store.RolloutRunning, 1)),
		entry(t, 4, startCmd(t, testRollout(t, store.OnHaltRollback, []string{"acme.z"}))),
	}
	a, stA := newFSM(t)
	for _, l := range logs {
		applyAll(t, a, l)
	}
	b, stB := newFSM(t)
	applyAll(t, b, logs...)
	if da, db := digest(t, stA), digest(t, stB); da != db {
		t.Fatalf("replicas differ: %s %s", da, db)
	}
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &bufSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	c, stC := newFSM(t)
	if err := c.Restore(&trackingReader{Reader: bytes.NewReader(sink.buf.Bytes())}); err != nil {
		t.Fatal(err)
	}
	want, idx, err := stA.Rollouts()
	if err != nil {
		t.Fatal(err)
	}
	got, gotIdx, err := stC.Rollouts()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" || idx != gotIdx || len(got) != 2 || got[0].GetId() != "r2" {
		t.Errorf("restored rollouts at %d (want %d) (-want +got):\n%s", gotIdx, idx, diff)
	}
	res := applyAll(t, c, entry(t, 5, putPolicy(t, "acme.b", "acme", nil)))[0]
	if !strings.Contains(res.GetMessage(), "under rollout r2") {
		t.Errorf("put after restore: %q, want the lock kept", res.GetMessage())
	}
}

func TestCheckRollout(t *testing.T) {
	base := func() *commandv1.Rollout { return testRollout(t, store.OnHaltRollback, []string{"acme.a"}, "acme.d") }
	tests := []struct {
		name   string
		mutate func(r *commandv1.Rollout)
		want   string // "" valid
	}{
		{"valid", func(*commandv1.Rollout) {}, ""},
		{"no changes", func(r *commandv1.Rollout) { r.Changes = nil }, "changes: at least one"},
		{"no stages", func(r *commandv1.Rollout) { r.Stages = nil }, "stages: at least one"},
		{"decreasing", func(r *commandv1.Rollout) { r.Stages[0].Percent = 100 }, "stages[1].percent: 100 does not exceed"},
		{"zero percent", func(r *commandv1.Rollout) { r.Stages[0].Percent = 0 }, "stages[0].percent: 0 is not within"},
		{"last below 100", func(r *commandv1.Rollout) { r.Stages[1].Percent = 90 }, "the last stage must be 100"},
		{"bake 0", func(r *commandv1.Rollout) { r.Stages[0].BakeMs = 0 }, "stages[0].bake"},
		{"bake over a day", func(r *commandv1.Rollout) { r.Stages[1].BakeMs = command.MaxBake.Milliseconds() + 1 }, "stages[1].bake"},
		{"bake a day", func(r *commandv1.Rollout) { r.Stages[1].BakeMs = command.MaxBake.Milliseconds() }, ""},
		{"nan ratio", func(r *commandv1.Rollout) { r.MaxNackRatio = nanF() }, "max_nack_ratio"},
		{"coverage over 1", func(r *commandv1.Rollout) { r.MinAckCoverage = 1.01 }, "min_ack_coverage"},
		{"on_halt empty", func(r *commandv1.Rollout) { r.OnHalt = "" }, "on_halt"},
		{"put without policy", func(r *commandv1.Rollout) { r.Changes[0].Policy = nil }, "changes[0].policy: required"},
		{"put without name", func(r *commandv1.Rollout) { r.Changes[0].Policy.Name = "" }, "changes[0].policy"},
		{"delete with a bad name", func(r *commandv1.Rollout) { r.Changes[1].Name = "Bad Name" }, "changes[1].name"},
		{"delete with a policy", func(r *commandv1.Rollout) { r.Changes[1].Policy = &commandv1.Policy{} }, "changes[1].policy: only for op put"},
		{"duplicate", func(r *commandv1.Rollout) { r.Changes[1].Name = "acme.a" }, "changes[1]: policy \"acme.a\" is also changed by changes[0]"},
		{"unknown op", func(r *commandv1.Rollout) { r.Changes[1].Op = "patch" }, "changes[1].op"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			tc.mutate(r)
			err := command.CheckRollout(r)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckRollout = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, policy.ErrInvalid) {
				t.Fatalf("CheckRollout = %v, want an invalid error with %q", err, tc.want)
			}
			// The FSM refuses such an entry before it is proposed.
			if _, derr := DecodeEntry(1, stamp(t, 1, mustCmd(t)(command.New(&commandv1.RolloutStart{Rollout: r})))); derr == nil {
				t.Error("DecodeEntry accepted it")
			}
		})
	}
}

func nanF() float64 { z := 0.0; return z / z }

// TestRolloutTypesNotIgnorable: an older node must stop on a rollout
// command rather than skip it.
func TestRolloutTypesNotIgnorable(t *testing.T) {
	for _, typ := range []command.Type{command.TypeRolloutStart, command.TypeRolloutTransition} {
		if typ&command.IgnoreUnknown != 0 || !command.IsRolloutType(typ) || !knownTypes[typ] {
			t.Errorf("type 0x%02x: ignorable or not in the table", uint8(typ))
		}
	}
	if command.CommandVersion < command.RolloutVersion {
		t.Errorf("CommandVersion %d below command.RolloutVersion %d", command.CommandVersion, command.RolloutVersion)
	}
}

// TestActiveRollouts: the driver's list holds the rollouts that stage
// their changes, not those that ended.
func TestActiveRollouts(t *testing.T) {
	f, st := newFSM(t)
	applyAll(t, f,
		entry(t, 1, putPolicy(t, "acme.a", "acme", nil)),
		entry(t, 2, startCmd(t, testRollout(t, store.OnHaltRollback, []string{"acme.a", "acme.b"}))),
		entry(t, 3, startCmd(t, testRollout(t, store.OnHaltRollback, []string{"acme.c"}))),
		entry(t, 4, moveCmd(t, "r2", store.RolloutRunning, 0, store.RolloutAborted, 0)),
		entry(t, 5, startCmd(t, testRollout(t, store.OnHaltStay, []string{"acme.d"}))),
		entry(t, 6, moveCmd(t, "r5", store.RolloutRunning, 0, store.RolloutHalted, 0)),
	)
	got, err := st.ActiveRollouts()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, r.GetId()+":"+r.GetState())
	}
	if want := []string{"r3:running", "r5:halted"}; !slices.Equal(ids, want) {
		t.Fatalf("ActiveRollouts = %v, want %v", ids, want)
	}
}
