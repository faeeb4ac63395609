package store

import (
	"encoding/json"
	"testing"
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/policy"
)

// TestCandidatePolicy: a candidate is the put's policy at revision 0,
// created and updated when the rollout was, so that its stored bytes (and
// a set's version) are the same on every node; the rollout's JSON carries
// it in that form.
func TestCandidatePolicy(t *testing.T) {
	created := time.Date(2026, 11, 27, 12, 0, 0, 123e6, time.UTC)
	p := &commandv1.Policy{Name: "acme.p", Kind: policy.KindToolPolicy, Scope: &commandv1.Scope{Org: "acme", Team: "red"},
		Labels: map[string]string{"tier": "1"}, Spec: []byte(`{"action":"deny","tool_name":"Bash"}`)}
	r := &commandv1.Rollout{Id: "r9", CreatedAtUnixMs: created.UnixMilli(),
		Changes: []*commandv1.RolloutChange{{Op: OpPut, Policy: p}, {Op: OpDelete, Name: "acme.old"}},
		Stages:  []*commandv1.RolloutStage{{Percent: 100, BakeMs: 90000}}}
	got, err := CandidatePolicy(r, p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"acme.p","kind":"ToolPolicy","scope":{"org":"acme","team":"red","employee":""},"labels":{"tier":"1"},` +
		`"spec":{"action":"deny","tool_name":"Bash"},"revision":0,"created_at":"2026-11-27T12:00:00.123Z","updated_at":"2026-11-27T12:00:00.123Z"}`
	if string(got.Stored) != want {
		t.Errorf("stored\n got %s\nwant %s", got.Stored, want)
	}
	if got.Policy.Revision != 0 || !got.Policy.CreatedAt.Equal(created) || got.Policy.Scope.Team != "red" {
		t.Errorf("policy = %+v", got.Policy)
	}
	doc, err := RolloutJSON(r)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Changes []struct {
			Op     string          `json:"op"`
			Policy json.RawMessage `json:"policy"`
			Name   string          `json:"name"`
		} `json:"changes"`
		Stages []RolloutStageDoc `json:"stages"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Changes) != 2 || string(d.Changes[0].Policy) != want || d.Changes[1].Name != "acme.old" || d.Stages[0].Bake != "1m30s" {
		t.Errorf("rollout JSON %s", doc)
	}
	for st, active := range map[string]bool{RolloutRunning: true, RolloutPaused: true, RolloutHalted: true,
		RolloutRolledBack: false, RolloutCompleted: false, RolloutAborted: false} {
		if RolloutActive(st) != active {
			t.Errorf("RolloutActive(%s) = %v", st, !active)
		}
	}
}
