package raftfsm

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

func syncCmd(t testing.TB, s *commandv1.SyncSource) *commandv1.Command {
	t.Helper()
	if s.Parts == 0 {
		s.Parts = 1
	}
	return withAudit(mustCmd(t)(command.SyncSource(s)), command.ActorSource(s.Source, s.Revision), "")
}

// TestSyncSource applies syncs entry by entry: one entry puts and deletes
// many policies with one event each; the source owns them, so the API's
// writes of them are refused with its name, and another source's or the
// API's policy is refused unless adopted; a refused sync writes nothing.
func TestSyncSource(t *testing.T) {
	f, st := newFSM(t)
	git := "git:policies"
	steps := []struct {
		name     string
		cmd      *commandv1.Command
		wantErr  string // "" for success
		wantOwn  map[string]string
		wantRecs []store.SourceRecord
	}{
		{
			name:    "api policy",
			cmd:     putPolicy(t, "acme.api", "acme", nil),
			wantOwn: map[string]string{"acme.api": ""},
		},
		{
			name: "first sync puts three",
			cmd: syncCmd(t, &commandv1.SyncSource{Source: git, Revision: "c1", Puts: []*commandv1.Policy{
				polMsg(t, "acme.a", "acme", "deny"), polMsg(t, "acme.b", "acme", "deny"), polMsg(t, "acme.c", "acme", "audit"),
			}}),
			wantOwn:  map[string]string{"acme.api": "", "acme.a": git, "acme.b": git, "acme.c": git},
			wantRecs: []store.SourceRecord{{Source: git, Revision: "c1", SyncIndex: 2, Policies: 3}},
		},
		{
			name:    "api put of a managed policy",
			cmd:     putPolicy(t, "acme.a", "acme", nil),
			wantErr: "managed by git:policies (ToolPolicy acme.a); change it there",
		},
		{
			name:    "api delete of a managed policy",
			cmd:     mustCmd(t)(command.DeletePolicy("acme.b", nil)),
			wantErr: "managed by git:policies (ToolPolicy acme.b); change it there",
		},
		{
			name: "sync taking the api's policy is refused whole",
			cmd: syncCmd(t, &commandv1.SyncSource{Source: git, Revision: "c2", Puts: []*commandv1.Policy{
				polMsg(t, "acme.d", "acme", "deny"), polMsg(t, "acme.api", "acme", "deny"),
			}, Deletes: []string{"acme.c"}}),
			wantErr: `policy "acme.api" is owned by the API, not git:policies`,
			wantOwn: map[string]string{"acme.api": "", "acme.a": git, "acme.b": git, "acme.c": git},
		},
		{
			name: "another source cannot take them",
			cmd: syncCmd(t, &commandv1.SyncSource{Source: "kubernetes", Puts: []*commandv1.Policy{
				polMsg(t, "acme.a", "acme", "deny"),
			}}),
			wantErr: `policy "acme.a" is owned by git:policies, not kubernetes`,
		},
		{
			name: "adopt and delete in one sync",
			cmd: syncCmd(t, &commandv1.SyncSource{Source: git, Revision: "c3", Puts: []*commandv1.Policy{
				polMsg(t, "acme.api", "acme", "deny"),
			}, Adopt: []string{"acme.api"}, Deletes: []string{"acme.c", "acme.gone"}}),
			wantOwn:  map[string]string{"acme.api": git, "acme.a": git, "acme.b": git},
			wantRecs: []store.SourceRecord{{Source: git, Revision: "c3", SyncIndex: 7, Policies: 3}},
		},
		{
			name: "kubernetes adopts one from git",
			cmd: syncCmd(t, &commandv1.SyncSource{Source: "kubernetes", Revision: "rv9", Puts: []*commandv1.Policy{
				polMsg(t, "acme.b", "acme", "allow"),
			}, Adopt: []string{"acme.b"}}),
			wantOwn: map[string]string{"acme.api": git, "acme.a": git, "acme.b": "kubernetes"},
			wantRecs: []store.SourceRecord{
				{Source: git, Revision: "c3", SyncIndex: 7, Policies: 2},
				{Source: "kubernetes", Revision: "rv9", SyncIndex: 8, Policies: 1},
			},
		},
	}
	for i, step := range steps {
		idx := uint64(i + 1)
		res := applyAll(t, f, entry(t, idx, step.cmd))[0]
		err := command.ResultErr(res)
		switch {
		case step.wantErr == "" && err != nil:
			t.Fatalf("%s: %v", step.name, err)
		case step.wantErr != "" && (err == nil || !strings.Contains(err.Error(), step.wantErr)):
			t.Fatalf("%s: error %v, want one containing %q", step.name, err, step.wantErr)
		case step.wantErr != "" && !errors.Is(err, store.ErrConflict):
			t.Errorf("%s: error %v is not a conflict", step.name, err)
		}
		if step.wantOwn != nil {
			ps, err := st.ListPolicies(store.PolicyFilter{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, p := range ps {
				got[p.Name] = p.Source
			}
			if diff := cmp.Diff(step.wantOwn, got); diff != "" {
				t.Errorf("%s: owners (-want +got):\n%s", step.name, diff)
			}
		}
		if step.wantRecs != nil {
			recs, err := st.Sources()
			if err != nil {
				t.Fatal(err)
			}
			for i := range recs {
				recs[i].SyncedAt = recs[i].SyncedAt.UTC().Truncate(0)
			}
			want := step.wantRecs
			for i := range want {
				want[i].SyncedAt = processedAt(want[i].SyncIndex).UTC()
			}
			if diff := cmp.Diff(want, recs); diff != "" {
				t.Errorf("%s: source records (-want +got):\n%s", step.name, diff)
			}
		}
	}
	// The first sync was one entry with an event per policy, each with the
	// source's actor.
	page, err := st.ListEvents(store.EventFilter{Type: store.EntityPolicy, After: 1, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range page.Events {
		if ev.ID == 2 {
			got = append(got, ev.EntityID+" "+string(ev.Action)+" "+ev.Actor)
		}
	}
	want := []string{"acme.a CREATE source:git:policies@c1", "acme.b CREATE source:git:policies@c1", "acme.c CREATE source:git:policies@c1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events of the first sync (-want +got):\n%s", diff)
	}
}

// TestSyncParts: a sync split in parts records its revision with the last
// part only, and a request's prune grant is used up by the sync that
// answers it.
func TestSyncParts(t *testing.T) {
	f, st := newFSM(t)
	git := "git:policies"
	applyAll(t, f,
		entry(t, 1, mustCmd(t)(command.RequestSourceSync(git, true))),
		entry(t, 2, syncCmd(t, &commandv1.SyncSource{Source: git, Revision: "c1", Part: 0, Parts: 2, Request: 1,
			Puts: []*commandv1.Policy{polMsg(t, "acme.a", "acme", "deny")}})),
	)
	rec, err := st.Source(git)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Revision != "" || rec.AllowPrune {
		t.Errorf("after the first part: revision %q, allow prune %v; want none and used up", rec.Revision, rec.AllowPrune)
	}
	applyAll(t, f, entry(t, 3, syncCmd(t, &commandv1.SyncSource{Source: git, Revision: "c1", Part: 1, Parts: 2,
		Puts: []*commandv1.Policy{polMsg(t, "acme.b", "acme", "deny")}})))
	if rec, err = st.Source(git); err != nil {
		t.Fatal(err)
	}
	if rec.Revision != "c1" || rec.Policies != 2 || rec.RequestIndex != 1 {
		t.Errorf("after the last part: %+v; want revision c1, 2 policies, request 1", rec)
	}
}

// TestSyncSourceChecked: malformed syncs never reach the store.
func TestSyncSourceChecked(t *testing.T) {
	p := &commandv1.Policy{Name: "acme.a", Kind: "ToolPolicy", Spec: []byte(`{}`)}
	tests := []struct {
		name string
		s    *commandv1.SyncSource
		want string
	}{
		{"bad source", &commandv1.SyncSource{Source: "s3:x", Parts: 1}, "want kubernetes or git:NAME"},
		{"bad git name", &commandv1.SyncSource{Source: "git:Bad Name", Parts: 1}, "git:Bad Name"},
		{"no parts", &commandv1.SyncSource{Source: "kubernetes"}, "part 0 of 0"},
		{"named twice", &commandv1.SyncSource{Source: "kubernetes", Parts: 1, Puts: []*commandv1.Policy{p}, Deletes: []string{"acme.a"}}, "named twice"},
		{"adopt without put", &commandv1.SyncSource{Source: "kubernetes", Parts: 1, Adopt: []string{"acme.x"}}, "does not put"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := command.New(tc.s)
			if err != nil {
				t.Fatal(err)
			}
			_, err = prepare(store.Meta{Index: 1}, c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("prepare = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestRolloutOfManagedPolicy: the API cannot stage a change of a policy a
// source owns; the source can, and completion leaves the policy its own.
func TestRolloutOfManagedPolicy(t *testing.T) {
	f, st := newFSM(t)
	applyAll(t, f, entry(t, 1, syncCmd(t, &commandv1.SyncSource{Source: "kubernetes", Puts: []*commandv1.Policy{polMsg(t, "acme.a", "acme", "deny")}})))
	r := testRollout(t, store.OnHaltRollback, []string{"acme.a"})
	err := command.ResultErr(applyAll(t, f, entry(t, 2, startCmd(t, r)))[0])
	if err == nil || !strings.Contains(err.Error(), "managed by kubernetes") {
		t.Fatalf("the API's rollout of a managed policy: %v, want a conflict naming the source", err)
	}
	r.Source = "kubernetes"
	if err := command.ResultErr(applyAll(t, f, entry(t, 3, startCmd(t, r)))[0]); err != nil {
		t.Fatalf("the source's rollout: %v", err)
	}
	if err := command.ResultErr(applyAll(t, f, entry(t, 4, moveCmd(t, store.RolloutID(3), store.RolloutRunning, 0, store.RolloutCompleted, 0)))[0]); err != nil {
		t.Fatal(err)
	}
	p, err := st.GetPolicy("acme.a")
	if err != nil || p.Source != "kubernetes" || !strings.Contains(string(p.Spec), "allow") {
		t.Errorf("after completion: %+v, %v; want the candidate, owned by kubernetes", p, err)
	}
}
