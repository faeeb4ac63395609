package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/server/policyset"
	"github.com/policyd/policyd/store"
)

func sdkReason(s *sdkRun, name string) string {
	for _, p := range s.Policies() {
		if p.Name == name {
			return string(p.Spec)
		}
	}
	return ""
}

// TestRolloutSDKCohorts: real SDK sidecars over both transports on a
// 3-node cluster: only the cohort holds the candidate, abort returns it to
// the stable set, a candidate the SDK rejects halts and rolls back.
func TestRolloutSDKCohorts(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.leader())
	a.putPolicy("acme.p1", "acme", "v1")
	const n = 40
	for i := range n {
		if r := a.do(http.MethodPut, fmt.Sprintf("/v1/employees/e%d", i), []byte(`{"org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
			t.Fatalf("PUT employee: %d %s", r.status, r.body)
		}
	}
	c.waitConverged()
	var mu sync.Mutex
	reject := false
	apply := func(set []client.Policy) error {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range set {
			if reject && strings.Contains(string(p.Spec), "bad") {
				return errors.New("cannot load a bad policy")
			}
		}
		return nil
	}
	type sc struct {
		s      *sdkRun
		member string
	}
	var sdks []sc
	for i := range n {
		node := c.nodes[i%3]
		g := startSDK(t, client.Config{Servers: []string{node.GRPCAddr()}, ClientAddress: fmt.Sprintf("sc-%d", i),
			Scope: client.Scope{Org: "acme"}, Apply: apply})
		sdks = append(sdks, sc{g, fmt.Sprintf("sc-%d", i)})
		w := startSDK(t, client.Config{Servers: []string{node.HTTPAddr()}, Transport: client.TransportWS, Employee: fmt.Sprintf("e%d", i)})
		sdks = append(sdks, sc{w, fmt.Sprintf("e%d", i)})
	}
	start := func(reason string, maxNack float64, percents ...int) string {
		t.Helper()
		req := strings.Replace(string(rolloutBody([][]byte{toolPolicy("acme.p1", "acme", reason)}, nil, "1h", percents...)),
			`"max_nack_ratio":0`, fmt.Sprintf(`"max_nack_ratio":%g`, maxNack), 1)
		r := a.do(http.MethodPost, "/v1/rollouts", []byte(req), nil)
		wantStatus(t, "start", r, http.StatusCreated)
		var ro adminclient.StagedRollout
		r.decode(t, &ro)
		return ro.ID
	}
	// holds waits until every sidecar holds p1 with want(member).
	holds := func(what string, want func(member string) string) {
		t.Helper()
		waitFor(t, 10*time.Second, what, func() error {
			for _, s := range sdks {
				if got, w := sdkReason(s.s, "acme.p1"), want(s.member); !strings.Contains(got, `"reason":"`+w+`"`) {
					return fmt.Errorf("%s holds %s, want reason %s", s.member, got, w)
				}
			}
			return nil
		})
	}

	id := start("v2", 0, 10, 50, 100)
	inCohort := 0
	holds("the cohort to hold the candidate", func(m string) string {
		if policyset.InCohort(id, m, 10) {
			return "v2"
		}
		return "v1"
	})
	for _, s := range sdks {
		if policyset.InCohort(id, s.member, 10) {
			inCohort++
		}
	}
	t.Logf("rollout %s: %d of %d sidecars in the 10%% cohort", id, inCohort, len(sdks))
	waitFor(t, 10*time.Second, "the cohort in the status", func() error {
		var view adminclient.StagedRollout
		a.do(http.MethodGet, "/v1/rollouts/"+id, nil, nil).decode(t, &view)
		if got := view.Status.Cohort.Size + view.Status.Cohort.SizeWS; got != inCohort || view.Status.Cohort.Acked != view.Status.Cohort.Size {
			return fmt.Errorf("status cohort %+v, want %d in all", view.Status.Cohort, inCohort)
		}
		return nil
	})
	wantStatus(t, "abort", a.do(http.MethodPost, "/v1/rollouts/"+id+"/abort", nil, nil), http.StatusOK)
	holds("everyone back on the stable set", func(string) string { return "v1" })

	mu.Lock()
	reject = true
	mu.Unlock()
	bad := start("bad", 0.01, 50, 100)
	waitFor(t, 10*time.Second, "the halt", func() error {
		var view adminclient.StagedRollout
		a.do(http.MethodGet, "/v1/rollouts/"+bad, nil, nil).decode(t, &view)
		if view.State != store.RolloutRolledBack {
			return fmt.Errorf("state %s, cohort %+v", view.State, view.Status.Cohort)
		}
		t.Logf("halted: %s", view.HaltReason)
		return nil
	})
	holds("everyone on the stable set after the rollback", func(string) string { return "v1" })
	_ = context.Background
}
