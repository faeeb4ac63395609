package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/policyd/policyd/adminclient"
	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/store"
)

// rolloutBody is a POST /v1/rollouts body: puts of the policies, deletes
// of the names, one stage per percent, each baking bake.
func rolloutBody(puts [][]byte, deletes []string, bake string, percents ...int) []byte {
	req := adminclient.StartRollout{}
	for _, p := range puts {
		req.Changes = append(req.Changes, adminclient.StartChange{Op: "put", Policy: p})
	}
	for _, n := range deletes {
		req.Changes = append(req.Changes, adminclient.StartChange{Op: "delete", Name: n})
	}
	for _, p := range percents {
		req.Stages = append(req.Stages, adminclient.StartStage{Percent: p, Bake: bake})
	}
	b, _ := json.Marshal(req)
	return b
}

// wantStatus fails unless r has status want and, for an error, its
// message holds every one of msgs.
func wantStatus(t *testing.T, what string, r response, want int, msgs ...string) {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: %d %s, want %d", what, r.status, r.body, want)
	}
	for _, m := range msgs {
		if !strings.Contains(string(r.body), m) {
			t.Errorf("%s: body %s lacks %q", what, r.body, m)
		}
	}
}

// TestRolloutLifecycle drives rollouts through the REST API of a 3-node
// cluster without sidecars: start (through a follower), the 409s on plain
// writes and overlapping rollouts, pause, resume, promote (the changes
// become ordinary revisions with events and the rollout's actor) and abort,
// and the actions' 409 and 404.
func TestRolloutLifecycle(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader, follower := apiFor(t, c.leader()), apiFor(t, c.follower())
	leader.putPolicy("acme.p1", "acme", "v1")
	leader.putPolicy("acme.p3", "acme", "doomed")

	// A bake of an hour: with no sidecars the cohort is empty, and only
	// the bake time holds a stage.
	body := rolloutBody([][]byte{toolPolicy("acme.p1", "acme", "v2"), toolPolicy("acme.p2", "acme", "new")}, []string{"acme.p3"}, "1h", 10, 50, 100)
	r := follower.do(http.MethodPost, "/v1/rollouts", body, map[string]string{"X-Request-Id": "start-1"})
	wantStatus(t, "start", r, http.StatusCreated)
	var ro adminclient.StagedRollout
	r.decode(t, &ro)
	if ro.State != store.RolloutRunning || ro.Stage != 0 || !strings.HasPrefix(ro.ID, "r") || ro.Actor != "anonymous" || ro.RequestID != "start-1" {
		t.Fatalf("started rollout = %+v", ro)
	}
	if len(ro.Changes) != 3 || ro.Changes[0].Policy == nil || ro.Changes[0].Policy.Revision != 0 || !ro.Changes[0].Policy.CreatedAt.Equal(ro.CreatedAt) {
		t.Fatalf("changes = %+v: want the candidates, revision 0 and created at the rollout's start", ro.Changes)
	}
	under := fmt.Sprintf("is under rollout %s", ro.ID)
	wantStatus(t, "PUT under rollout", leader.do(http.MethodPut, "/v1/policies/acme.p1", toolPolicy("acme.p1", "acme", "v3"), nil), http.StatusConflict, `policy \"acme.p1\" `+under)
	wantStatus(t, "DELETE under rollout", follower.do(http.MethodDelete, "/v1/policies/acme.p3", nil, nil), http.StatusConflict, under)
	wantStatus(t, "invalid stages through a follower", follower.do(http.MethodPost, "/v1/rollouts", rolloutBody([][]byte{toolPolicy("acme.v", "acme", "x")}, nil, "1m", 50, 40), nil),
		http.StatusBadRequest, "stages[1].percent: 40 does not exceed", "the last stage must be 100")
	wantStatus(t, "overlapping rollout", leader.do(http.MethodPost, "/v1/rollouts", rolloutBody([][]byte{toolPolicy("acme.p2", "acme", "other")}, nil, "1m", 100), nil), http.StatusConflict, under)

	act := func(a *api, action string, want int) adminclient.StagedRollout {
		t.Helper()
		r := a.do(http.MethodPost, "/v1/rollouts/"+ro.ID+"/"+action, nil, nil)
		wantStatus(t, action, r, want)
		var out adminclient.StagedRollout
		if want == http.StatusOK {
			r.decode(t, &out)
		}
		return out
	}
	if got := act(follower, "pause", 200); got.State != store.RolloutPaused {
		t.Fatalf("after pause: %s", got.State)
	}
	act(leader, "pause", http.StatusConflict)
	if got := act(leader, "resume", 200); got.State != store.RolloutRunning || !got.StageStartedAt.After(ro.StageStartedAt) && !got.StageStartedAt.Equal(ro.StageStartedAt) {
		t.Fatalf("after resume: %+v", got)
	}
	wantStatus(t, "unknown rollout", leader.do(http.MethodPost, "/v1/rollouts/r999999/pause", nil, nil), http.StatusNotFound)

	var view adminclient.StagedRollout
	roundTrip(t, follower.do(http.MethodGet, "/v1/rollouts/"+ro.ID, nil, nil).body, &view)
	roundTrip(t, follower.do(http.MethodGet, "/v1/rollouts", nil, nil).body, &adminclient.StagedRolloutList{})
	if view.Status == nil || len(view.Status.Stages) != 3 || view.Status.Stages[0].State != "current" || view.Status.Cohort.Size != 0 {
		t.Fatalf("status = %+v", view.Status)
	}

	done := act(follower, "promote", 200)
	if done.State != store.RolloutCompleted {
		t.Fatalf("after promote: %s", done.State)
	}
	act(leader, "abort", http.StatusConflict)
	c.waitConverged()
	for _, n := range c.running() {
		p1, err := n.store.GetPolicy("acme.p1")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(p1.Spec), `"v2"`) {
			t.Errorf("%s: acme.p1 = %s after completion", n.ID(), p1.Spec)
		}
		if _, err := n.store.GetPolicy("acme.p2"); err != nil {
			t.Errorf("%s: acme.p2: %v", n.ID(), err)
		}
		if _, err := n.store.GetPolicy("acme.p3"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: acme.p3 after its delete completed: %v", n.ID(), err)
		}
	}
	// Each change is an ordinary revision with its own event and the
	// rollout's actor and request id; the rollout's moves are events too.
	page, err := leader.client.Events(t.Context(), adminclient.EventFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]adminclient.Event{}
	var moves []string
	for _, ev := range page.Events {
		if ev.EntityType == "rollout" {
			var d adminclient.StagedRollout
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			moves = append(moves, d.State)
			continue
		}
		seen[ev.EntityID+"/"+ev.Action] = ev
	}
	if got, want := strings.Join(moves, ","), "running,paused,running,completed"; got != want {
		t.Errorf("rollout events: %s, want %s", got, want)
	}
	for _, k := range []string{"acme.p1/UPDATE", "acme.p2/CREATE", "acme.p3/DELETE"} {
		ev, ok := seen[k]
		if !ok {
			t.Errorf("no event %s", k)
			continue
		}
		if ev.Actor != "anonymous" || ev.RequestID != "start-1" {
			t.Errorf("event %s: actor %q request %q, want the rollout's", k, ev.Actor, ev.RequestID)
		}
	}
	if seen["acme.p1/UPDATE"].ID != seen["acme.p2/CREATE"].ID {
		t.Errorf("completion events at %d and %d, want one entry", seen["acme.p1/UPDATE"].ID, seen["acme.p2/CREATE"].ID)
	}
	for _, name := range []string{"acme.p1", "acme.p2"} {
		if err := leader.client.Do(t.Context(), http.MethodGet, fmt.Sprintf("/v1/policies/%s/revisions/%d", name, seen["acme.p2/CREATE"].ID), nil, nil, nil); err != nil {
			t.Errorf("revision of %s written by the completion: %v", name, err)
		}
	}
	// Unlocked: plain writes go through again.
	wantStatus(t, "PUT after completion", leader.do(http.MethodPut, "/v1/policies/acme.p1", toolPolicy("acme.p1", "acme", "v3"), nil), http.StatusOK)

	// An aborted rollout changes nothing and records who aborted it.
	r = leader.do(http.MethodPost, "/v1/rollouts", rolloutBody([][]byte{toolPolicy("acme.p1", "acme", "v4")}, nil, "1h", 100), nil)
	wantStatus(t, "second start", r, http.StatusCreated)
	r.decode(t, &ro)
	if got := act(follower, "abort", 200); got.State != store.RolloutAborted || got.HaltReason != "aborted by anonymous" {
		t.Fatalf("after abort: %+v", got)
	}
	p1, err := c.leader().store.GetPolicy("acme.p1")
	if err != nil || !strings.Contains(string(p1.Spec), `"v3"`) {
		t.Fatalf("acme.p1 after an aborted rollout: %v %s", err, p1.Spec)
	}
	list, err := follower.client.StagedRollouts(t.Context(), "active")
	if err != nil || len(list.Rollouts) != 0 {
		t.Fatalf("active rollouts: %+v %v", list, err)
	}
	if list, err = follower.client.StagedRollouts(t.Context(), "all"); err != nil || len(list.Rollouts) != 2 {
		t.Fatalf("all rollouts: %+v %v", list, err)
	}
	c.waitConverged()
}

// TestRolloutValidation: bad rollouts are refused with 400 naming the
// field, before anything is proposed.
func TestRolloutValidation(t *testing.T) {
	n, a := singleNode(t, nil)
	a.putPolicy("acme.there", "acme", "x")
	good := toolPolicy("acme.p", "acme", "x")
	stage := func(p int, bake string) string { return fmt.Sprintf(`{"percent":%d,"bake":%q}`, p, bake) }
	body := func(changes string, stages ...string) []byte {
		return []byte(`{"changes":[` + changes + `],"stages":[` + strings.Join(stages, ",") + `]}`)
	}
	put := `{"op":"put","policy":` + string(good) + `}`
	tests := []struct {
		name string
		body []byte
		want []string
	}{
		{"no changes", body("", stage(100, "1m")), []string{"changes: at least one"}},
		{"no stages", body(put), []string{"stages: at least one"}},
		{"percents not increasing", body(put, stage(50, "1m"), stage(50, "1m"), stage(100, "1m")), []string{"stages[1].percent"}},
		{"percent over 100", body(put, stage(150, "1m")), []string{"stages[0].percent: 150 is not within 1..100"}},
		{"last not 100", body(put, stage(5, "1m"), stage(50, "1m")), []string{"stages[1].percent: the last stage must be 100"}},
		{"bake 0", body(put, stage(100, "0s")), []string{"stages[0].bake"}},
		{"bake over a day", body(put, stage(100, "25h")), []string{"stages[0].bake"}},
		{"bake not a duration", body(put, stage(100, "soon")), []string{"stages[0].bake"}},
		{"eleven stages", body(put, stage(1, "1s"), stage(2, "1s"), stage(3, "1s"), stage(4, "1s"), stage(5, "1s"), stage(6, "1s"), stage(7, "1s"), stage(8, "1s"), stage(9, "1s"), stage(10, "1s"), stage(100, "1s")), []string{"stages: 11 stages"}},
		{"duplicate names", body(put+","+put, stage(100, "1m")), []string{`changes[1]: policy \"acme.p\" is also changed`}},
		{"invalid policy", body(`{"op":"put","policy":{"name":"acme.q","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"action":"maybe","tool_name":"Bash"}}}`, stage(100, "1m")), []string{"changes[0].policy.spec"}},
		{"unknown op", body(`{"op":"patch","name":"acme.p"}`, stage(100, "1m")), []string{"changes[0].op"}},
		{"delete of a missing policy", body(`{"op":"delete","name":"acme.gone"}`, stage(100, "1m")), []string{"changes[0].name"}},
		{"ratio over 1", []byte(`{"changes":[` + put + `],"stages":[` + stage(100, "1m") + `],"max_nack_ratio":1.5}`), []string{"max_nack_ratio"}},
		{"coverage below 0", []byte(`{"changes":[` + put + `],"stages":[` + stage(100, "1m") + `],"min_ack_coverage":-0.1}`), []string{"min_ack_coverage"}},
		{"unknown on_halt", []byte(`{"changes":[` + put + `],"stages":[` + stage(100, "1m") + `],"on_halt":"panic"}`), []string{"on_halt"}},
		{"every problem at once", []byte(`{"changes":[{"op":"put","policy":{"name":"acme.q","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"action":"maybe","tool_name":"Bash"}}}],"stages":[` + stage(0, "1m") + `,` + stage(60, "x") + `],"on_halt":"panic"}`),
			[]string{"changes[0].policy.spec", "stages[0].percent: 0 is not within", `stages[1].bake: \"x\" is not a duration`, "stages[1].percent: the last stage must be 100", "on_halt"}},
		{"unknown field", []byte(`{"changes":[` + put + `],"stages":[` + stage(100, "1m") + `],"speed":"fast"}`), []string{"speed"}},
	}
	many := make([]string, 101)
	for i := range many {
		many[i] = `{"op":"put","policy":` + string(toolPolicy(fmt.Sprintf("acme.m%d", i), "acme", "x")) + `}`
	}
	tests = append(tests, struct {
		name string
		body []byte
		want []string
	}{"101 changes", body(strings.Join(many, ","), stage(100, "1m")), []string{"changes: 101 changes"}})
	before, _, err := n.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := a.do(http.MethodPost, "/v1/rollouts", tc.body, nil)
			wantStatus(t, "POST", r, http.StatusBadRequest, tc.want...)
			if code := r.errCode(t); code != "invalid" {
				t.Errorf("code %q, want invalid", code)
			}
		})
	}
	if after, _, err := n.store.Digest(); err != nil || after != before {
		t.Fatalf("refused rollouts changed the state: %v", err)
	}
	wantStatus(t, "GET bad state", a.do(http.MethodGet, "/v1/rollouts?state=sideways", nil, nil), http.StatusBadRequest)
	wantStatus(t, "GET unknown", a.do(http.MethodGet, "/v1/rollouts/r12345", nil, nil), http.StatusNotFound)
}

// TestRolloutLeaderFailover: the leader is killed mid-rollout; the new
// leader carries on from the stored stage and its start time, and with an
// empty cohort the stages pass on bake time alone until completion.
func TestRolloutLeaderFailover(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.follower())
	r := a.do(http.MethodPost, "/v1/rollouts", rolloutBody([][]byte{toolPolicy("acme.f", "acme", "x")}, nil, "2s", 20, 60, 100), nil)
	wantStatus(t, "start", r, http.StatusCreated)
	var ro adminclient.StagedRollout
	r.decode(t, &ro)
	get := func(n *Node) (*adminclient.StagedRollout, error) {
		var out adminclient.StagedRollout
		return &out, apiFor(t, n).client.Do(t.Context(), http.MethodGet, "/v1/rollouts/"+ro.ID, nil, nil, &out)
	}
	var mid *adminclient.StagedRollout
	poll.Eventually(t, "stage 1", func() (err error) {
		if mid, err = get(c.follower()); err != nil {
			return err
		}
		if mid.Stage < 1 {
			return fmt.Errorf("at stage %d", mid.Stage)
		}
		return nil
	}, poll.Within(10*time.Second))

	if mid.Stage != 1 || mid.State != store.RolloutRunning {
		t.Fatalf("mid-rollout: %+v", mid)
	}
	if d := mid.StageStartedAt.Sub(ro.StageStartedAt); d < 2*time.Second {
		t.Errorf("stage 1 began %v after stage 0: before its bake was over", d)
	}
	for i, n := range c.nodes {
		if n != nil && n.IsLeader() {
			c.crash(i)
			break
		}
	}
	survivor := c.running()[0]
	var end *adminclient.StagedRollout
	poll.Eventually(t, "completion under the new leader", func() (err error) {
		if end, err = get(survivor); err != nil {
			return err
		}
		if end.State != store.RolloutCompleted {
			return fmt.Errorf("%s at stage %d", end.State, end.Stage)
		}
		return nil
	}, poll.Within(20*time.Second))

	if end.Stage != 2 {
		t.Errorf("completed at stage %d, want 2 (the last)", end.Stage)
	}
	if d := end.UpdatedAt.Sub(mid.StageStartedAt); d < 4*time.Second {
		t.Errorf("completed %v after stage 1 began: a stage passed before its bake", d)
	}
	if _, err := survivor.store.GetPolicy("acme.f"); err != nil {
		t.Errorf("acme.f after completion: %v", err)
	}
}

// TestRolloutDriver runs the leader's driver against sidecars it is told
// of: a NACK ratio over the limit rolls the rollout back at once, a stage
// whose cohort has ACKed passes once baked, and the metrics count both.
func TestRolloutDriver(t *testing.T) {
	n, a := singleNode(t, nil)
	start := func(maxNack float64, onHalt, name string) adminclient.StagedRollout {
		t.Helper()
		ro, err := a.client.StartRollout(t.Context(), adminclient.StartRollout{
			Changes:      []adminclient.StartChange{{Op: "put", Policy: toolPolicy(name, "acme", "x")}},
			Stages:       []adminclient.StartStage{{Percent: 50, Bake: "1h"}, {Percent: 100, Bake: "1h"}},
			MaxNackRatio: maxNack, OnHalt: onHalt,
		})
		if err != nil {
			t.Fatal(err)
		}
		return *ro
	}
	bad, good := start(0.1, "rollback", "acme.bad"), start(0, "stay", "acme.good")
	ci := func(state, tag string) *clusterv1.ClientInfo {
		return &clusterv1.ClientInfo{Transport: "grpc", State: state, Rollouts: []string{tag}}
	}
	var sidecars []*clusterv1.ClientInfo
	sidecars = append(sidecars, ci("acked", bad.ID+":0"), ci("acked", bad.ID+":0"), ci("acked", bad.ID+":0"), ci("nacked", bad.ID+":0"))
	sidecars = append(sidecars, ci("acked", good.ID+":0"), ci("acked", good.ID+":0"),
		&clusterv1.ClientInfo{Transport: "ws", Rollouts: []string{good.ID + ":0"}})
	d := newRolloutDriver(testLogger(t), n.store,
		func(context.Context) ([]*clusterv1.ClientInfo, []string, error) { return sidecars, nil, nil }, n.ProposeLocal)
	now := time.Now()
	d.now = func() time.Time { return now }

	d.tick(t.Context())
	if got := testutil.ToFloat64(d.halts); got != 1 {
		t.Errorf("halts = %v, want 1", got)
	}
	if got := testutil.ToFloat64(d.cohort.WithLabelValues(good.ID, "ws")); got != 1 {
		t.Errorf("cohort ws of %s = %v, want 1", good.ID, got)
	}
	ro, err := n.store.Rollout(bad.ID)
	if err != nil || ro.GetState() != store.RolloutRolledBack || !strings.Contains(ro.GetHaltReason(), "nack ratio 0.25 > 0.10 at stage 0 (50%)") {
		t.Fatalf("%s after a NACK in four: %v %v", bad.ID, ro, err)
	}
	if ro, _ := n.store.Rollout(good.ID); ro.GetState() != store.RolloutRunning || ro.GetStage() != 0 {
		t.Fatalf("%s moved while baking: %v", good.ID, ro)
	}

	now = now.Add(time.Hour)
	d.tick(t.Context())
	if ro, _ := n.store.Rollout(good.ID); ro.GetState() != store.RolloutRunning || ro.GetStage() != 1 || ro.GetStageStartedAtUnixMs() != now.UnixMilli() {
		t.Fatalf("%s after its bake: %v", good.ID, ro)
	}
	if got := testutil.CollectAndCount(d.cohort); got != 2 {
		t.Errorf("%d cohort series, want 2: those of %s alone, rolled back %s's gone", got, good.ID, bad.ID)
	}
	for to, want := range map[string]float64{"rolled_back": 1, "next_stage": 1, "completed": 0} {
		if got := testutil.ToFloat64(d.transitions.WithLabelValues(to)); got != want {
			t.Errorf("transitions{to=%s} = %v, want %v", to, got, want)
		}
	}
	// The sidecars still carry stage 0's tag: stage 1's cohort is empty,
	// and it passes on its bake alone.
	now = now.Add(time.Hour)
	d.tick(t.Context())
	if ro, _ := n.store.Rollout(good.ID); ro.GetState() != store.RolloutCompleted {
		t.Fatalf("%s after its last bake: %v", good.ID, ro)
	}
	if p, err := n.store.GetPolicy("acme.good"); err != nil || p.Revision == 0 {
		t.Fatalf("acme.good after completion: %v %v", p, err)
	}
	page, err := n.store.ListEvents(store.EventFilter{Type: store.EntityRollout, Actor: "task:rollout"})
	if err != nil || len(page.Events) != 3 {
		t.Fatalf("the driver's rollout events: %+v %v", page, err)
	}
	body := a.do(http.MethodGet, "/metrics", nil, nil).body
	for _, m := range []string{`policyd_rollouts{state="completed"} 1`, `policyd_rollouts{state="rolled_back"} 1`, `policyd_rollouts{state="running"} 0`} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

// TestRolloutSurvivesRestart: a full cluster restart keeps a paused
// rollout where it was, with its policies locked, and it can go on.
func TestRolloutSurvivesRestart(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.leader())
	ro, err := a.client.StartRollout(t.Context(), adminclient.StartRollout{
		Changes: []adminclient.StartChange{{Op: "put", Policy: toolPolicy("acme.r", "acme", "x")}},
		Stages:  []adminclient.StartStage{{Percent: 30, Bake: "1h"}, {Percent: 100, Bake: "1h"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.RolloutAction(t.Context(), ro.ID, adminclient.RolloutPause); err != nil {
		t.Fatal(err)
	}
	c.waitConverged()
	for i := range c.nodes {
		c.stop(i)
	}
	for i := range c.nodes {
		c.restart(i)
	}
	c.waitConverged()
	b := apiFor(t, c.follower())
	got, err := b.client.StagedRollout(t.Context(), ro.ID)
	if err != nil || got.State != store.RolloutPaused || got.Stage != 0 || !got.StageStartedAt.Equal(ro.StageStartedAt) {
		t.Fatalf("after a full restart: %+v %v", got, err)
	}
	wantStatus(t, "PUT under rollout after restart", b.do(http.MethodPut, "/v1/policies/acme.r", toolPolicy("acme.r", "acme", "y"), nil), http.StatusConflict, "under rollout "+ro.ID)
	if got, err := b.client.RolloutAction(t.Context(), ro.ID, adminclient.RolloutPromote); err != nil || got.State != store.RolloutCompleted {
		t.Fatalf("promote after restart: %+v %v", got, err)
	}
}

// roundTrip decodes raw into v strictly (adminclient knows every field the
// server sends) and fails unless v encodes back to the same JSON.
func roundTrip(t *testing.T, raw []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	back, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var want, got any
	_ = json.Unmarshal(raw, &want)
	_ = json.Unmarshal(back, &got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%T does not round-trip (-server +client):\n%s", v, diff)
	}
}
