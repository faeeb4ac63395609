package server

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/store"
)

// These tests run staged rollouts against real SDK sidecars, half over the
// discovery stream and half over the WebSocket feed, spread over the three
// nodes of a real cluster.

// cohortFleet is the sidecars of one test, each with the member name its
// cohort is hashed from (client_address, or the feed's employee id).
type cohortFleet struct {
	t       *testing.T
	c       *cluster
	a       *api
	members []string
	sdks    []*sdkRun

	mu     sync.Mutex
	reject string // a reason the sidecars' Apply refuses to load
}

// newCohortFleet starts n sidecars (n/2 per transport) following org acme,
// which holds acme.p1 with reason "v1".
func newCohortFleet(t *testing.T, n int) *cohortFleet {
	c := newCluster(t, 3, nil)
	f := &cohortFleet{t: t, c: c, a: apiFor(t, c.leader())}
	f.a.putPolicy("acme.p1", "acme", "v1")
	for i := range n / 2 {
		if r := f.a.do(http.MethodPut, fmt.Sprintf("/v1/employees/e%d", i), []byte(`{"org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
			t.Fatalf("PUT employee: %d %s", r.status, r.body)
		}
	}
	c.waitConverged()
	apply := func(set []client.Policy) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, p := range set {
			if f.reject != "" && strings.Contains(string(p.Spec), `"reason":"`+f.reject+`"`) {
				return errors.New("cannot load this policy")
			}
		}
		return nil
	}
	// Each sidecar lists the three nodes starting from its own, so the
	// fleet is spread over them and fails over when one dies.
	servers := func(i int, addr func(*Node) string) []string {
		return []string{addr(c.nodes[i%3]), addr(c.nodes[(i+1)%3]), addr(c.nodes[(i+2)%3])}
	}
	for i := range n / 2 {
		addr := fmt.Sprintf("sc-%d", i)
		f.add(addr, startSDK(t, client.Config{Servers: servers(i, (*Node).GRPCAddr), ClientAddress: addr,
			Scope: client.Scope{Org: "acme"}, Apply: apply}))
		emp := fmt.Sprintf("e%d", i)
		f.add(emp, startSDK(t, client.Config{Servers: servers(i, (*Node).HTTPAddr), Transport: client.TransportWS, Employee: emp, Apply: apply}))
	}
	f.holds("every sidecar on v1", func(string) string { return "v1" })
	return f
}

func (f *cohortFleet) add(member string, s *sdkRun) {
	f.members = append(f.members, member)
	f.sdks = append(f.sdks, s)
}

// reason is the reason of acme.p1 in the set s holds.
func reason(s *sdkRun) string {
	for _, p := range s.Policies() {
		if p.Name == "acme.p1" {
			return reasonOf(p.Spec)
		}
	}
	return ""
}

func reasonOf(spec []byte) string {
	_, after, ok := strings.Cut(string(spec), `"reason":"`)
	if !ok {
		return ""
	}
	r, _, _ := strings.Cut(after, `"`)
	return r
}

// holds waits until every sidecar holds acme.p1 with want(member).
func (f *cohortFleet) holds(what string, want func(member string) string) {
	f.t.Helper()
	poll.Eventually(f.t, what, func() error {
		for i, s := range f.sdks {
			if got, w := reason(s), want(f.members[i]); got != w {
				return fmt.Errorf("%s holds %q, want %q", f.members[i], got, w)
			}
		}
		return nil
	}, poll.Within(20*time.Second))

}

// start starts a rollout of acme.p1 with reason and returns its id.
func (f *cohortFleet) start(reason string, maxNack float64, bake string, percents ...int) string {
	f.t.Helper()
	body := strings.Replace(string(rolloutBody([][]byte{toolPolicy("acme.p1", "acme", reason)}, nil, bake, percents...)),
		`"max_nack_ratio":0`, fmt.Sprintf(`"max_nack_ratio":%g`, maxNack), 1)
	r := f.a.do(http.MethodPost, "/v1/rollouts", []byte(body), nil)
	wantStatus(f.t, "start", r, http.StatusCreated)
	var ro adminclient.StagedRollout
	r.decode(f.t, &ro)
	return ro.ID
}

func (f *cohortFleet) get(id string) adminclient.StagedRollout {
	f.t.Helper()
	var ro adminclient.StagedRollout
	if err := apiFor(f.t, f.c.running()[0]).client.Do(f.t.Context(), http.MethodGet, "/v1/rollouts/"+id, nil, nil, &ro); err != nil {
		f.t.Fatal(err)
	}
	return ro
}

func (f *cohortFleet) action(id, verb string) {
	f.t.Helper()
	wantStatus(f.t, verb, apiFor(f.t, f.c.running()[0]).do(http.MethodPost, "/v1/rollouts/"+id+"/"+verb, nil, nil), http.StatusOK)
}

// cohortOf is the members in the cohort of id at percent.
func (f *cohortFleet) cohortOf(id string, percent uint32) map[string]bool {
	in := map[string]bool{}
	for _, m := range f.members {
		if policyset.InCohort(id, m, percent) {
			in[m] = true
		}
	}
	return in
}

// withinSpread fails unless k of n is within 4 standard deviations of the
// binomial mean at p.
func withinSpread(t *testing.T, what string, k, n int, p float64) {
	t.Helper()
	mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
	if math.Abs(float64(k)-mean) > 4*sd {
		t.Errorf("%s: %d of %d, want %.0f ± %.1f (4σ)", what, k, n, mean, 4*sd)
	}
}

// TestRolloutStagesReachOnlyTheCohort: 200 sidecars, stages 10 %, 50 %,
// 100 %. At each stage (held there by pause), exactly the members the hash
// puts in the cohort hold the candidate, the cohort's size is within the
// hash's spread, and the status counts it; completion makes it everyone's.
func TestRolloutStagesReachOnlyTheCohort(t *testing.T) {
	f := newCohortFleet(t, 200)
	id := f.start("v2", 0, "1s", 10, 50, 100)
	for stage, pct := range []uint32{10, 50, 100} {
		poll.Eventually(t, fmt.Sprintf("stage %d", stage), func() error {
			if ro := f.get(id); int(ro.Stage) < stage || ro.State == store.RolloutCompleted {
				return fmt.Errorf("%s at stage %d", ro.State, ro.Stage)
			}
			return nil
		}, poll.Within(20*time.Second))

		if stage < 2 {
			f.action(id, "pause")
		}
		ro := f.get(id)
		if int(ro.Stage) != stage {
			if stage == 2 && ro.State == store.RolloutCompleted {
				break // the last stage baked before we looked: completion is checked below
			}
			t.Fatalf("paused at stage %d, want %d", ro.Stage, stage)
		}
		in := f.cohortOf(id, pct)
		withinSpread(t, fmt.Sprintf("stage %d cohort", stage), len(in), len(f.members), float64(pct)/100)
		f.holds(fmt.Sprintf("stage %d: the %d%% cohort on v2, the rest on v1", stage, pct), func(m string) string {
			if in[m] {
				return "v2"
			}
			return "v1"
		})
		poll.Eventually(t, "the status counts the cohort", func() error {
			st := f.get(id).Status.Cohort
			if st.Size+st.SizeWS != len(in) || st.Acked != st.Size {
				return fmt.Errorf("status cohort %+v, want %d in all, every gRPC one acked", st, len(in))
			}
			return nil
		}, poll.Within(20*time.Second))

		t.Logf("stage %d (%d%%): %d of %d sidecars in the cohort", stage, pct, len(in), len(f.members))
		if stage < 2 {
			f.action(id, "resume")
		}
	}
	poll.Eventually(t, "completion", func() error {
		if ro := f.get(id); ro.State != store.RolloutCompleted {
			return fmt.Errorf("%s at stage %d", ro.State, ro.Stage)
		}
		return nil
	}, poll.Within(20*time.Second))

	f.holds("every sidecar on the completed v2", func(string) string { return "v2" })
	if p, err := f.c.running()[0].store.GetPolicy("acme.p1"); err != nil || reasonOf(p.Spec) != "v2" {
		t.Fatalf("acme.p1 after completion: %v, %v", p, err)
	}
}

// TestRolloutHaltAndRollback: a candidate the sidecars' Apply refuses is
// NACKed; the first NACK over the limit halts the rollout at its first
// stage, and the cohort gets the stable set back. Abort does the same on
// demand.
func TestRolloutHaltAndRollback(t *testing.T) {
	f := newCohortFleet(t, 200)

	id := f.start("v2", 0, "1h", 10, 100)
	in := f.cohortOf(id, 10)
	f.holds("the 10% cohort on v2", func(m string) string {
		if in[m] {
			return "v2"
		}
		return "v1"
	})
	f.action(id, "abort")
	f.holds("everyone back on v1 after abort", func(string) string { return "v1" })

	f.mu.Lock()
	f.reject = "bad"
	f.mu.Unlock()
	bad := f.start("bad", 0.01, "1h", 25, 100)
	var ro adminclient.StagedRollout
	poll.Eventually(t, "the halt", func() error {
		if ro = f.get(bad); ro.State != store.RolloutRolledBack {
			return fmt.Errorf("%s, cohort %+v", ro.State, ro.Status.Cohort)
		}
		return nil
	}, poll.Within(20*time.Second))

	if ro.Stage != 0 || !strings.Contains(ro.HaltReason, "nack ratio") {
		t.Errorf("halted at stage %d (%q), want stage 0 on the NACK ratio", ro.Stage, ro.HaltReason)
	}
	t.Logf("halted: %s", ro.HaltReason)
	f.holds("everyone on v1 after the rollback", func(string) string { return "v1" })
	// A NACKing sidecar kept v1 all along: none of them ever held "bad".
	for i, s := range f.sdks {
		s.mu.Lock()
		for _, u := range s.updates {
			for _, p := range u.Policies {
				if p.Name == "acme.p1" && reasonOf(p.Spec) == "bad" {
					t.Errorf("%s installed the rejected candidate", f.members[i])
				}
			}
		}
		s.mu.Unlock()
	}
}

// TestRolloutLeaderKilledMidStage: the leader dies while a stage bakes.
// The new leader holds the same stage, and no sidecar flips in or out of
// the cohort on the way, including those whose node died and that failed
// over to another; a v1 client in the cohort's hash range never sees the
// candidate.
func TestRolloutLeaderKilledMidStage(t *testing.T) {
	f := newCohortFleet(t, 200)
	id := f.start("v2", 0, "1h", 25, 100)
	in := f.cohortOf(id, 25)
	want := func(m string) string {
		if in[m] {
			return "v2"
		}
		return "v1"
	}
	f.holds("the 25% cohort on v2", want)

	// A client that declares no capabilities, with an address the hash
	// puts in the cohort, is served the stable set.
	v1addr := ""
	for i := 0; v1addr == ""; i++ {
		if a := fmt.Sprintf("v1-client-%d", i); policyset.InCohort(id, a, 25) {
			v1addr = a
		}
	}
	old := openStream(t, dialGRPC(t, f.c.nodes[0].GRPCAddr()), v1addr, policy.Scope{Org: "acme"})
	for _, p := range old.next().GetPolicies() {
		if p.GetName() == "acme.p1" && reasonOf(p.GetSpec()) != "v1" {
			t.Fatalf("a client without capabilities got %s", p.GetSpec())
		}
	}

	before := f.get(id)
	for i, n := range f.c.nodes {
		if n != nil && n.IsLeader() {
			f.c.crash(i)
			break
		}
	}
	poll.Eventually(t, "a new leader", func() error {
		for _, n := range f.c.running() {
			if n.IsLeader() {
				return nil
			}
		}
		return errors.New("no leader")
	}, poll.Within(20*time.Second))

	// Every sidecar is still on its side, and its history never crossed
	// over: a member never went back to v1 once it had v2, and nobody else
	// ever held v2.
	f.holds("the same cohort after the failover", want)
	after := f.get(id)
	if after.Stage != before.Stage || after.State != store.RolloutRunning || !after.StageStartedAt.Equal(before.StageStartedAt) {
		t.Fatalf("after the failover: stage %d %s started %v; before: stage %d started %v",
			after.Stage, after.State, after.StageStartedAt, before.Stage, before.StageStartedAt)
	}
	for i, s := range f.sdks {
		m := f.members[i]
		seen := ""
		s.mu.Lock()
		for _, u := range s.updates {
			for _, p := range u.Policies {
				if p.Name != "acme.p1" {
					continue
				}
				r := reasonOf(p.Spec)
				if r == "v2" && !in[m] || seen == "v2" && r == "v1" {
					t.Errorf("%s flipped: %s then %s", m, seen, r)
				}
				seen = r
			}
		}
		s.mu.Unlock()
	}
	f.action(id, "promote")
	f.holds("everyone on v2 after promote", func(string) string { return "v2" })
}
