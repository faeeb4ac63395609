package impactload

import (
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/goleak"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestWorkload: every set compiles, every record decodes as a record of
// the identity it names, and the change set flips decisions both ways.
func TestWorkload(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	evals := map[string]*client.Evaluator{}
	evaluator := func(set []client.Policy) *client.Evaluator {
		key := ""
		for _, p := range set {
			key += p.Name + string(p.Spec)
		}
		if e := evals[key]; e != nil {
			return e
		}
		e, err := client.NewEvaluator(set)
		if err != nil {
			t.Fatal(err)
		}
		evals[key] = e
		return e
	}
	var toDeny, toAllow, drops int
	for i := range 20_000 {
		var r decisionsv1.Record
		if err := json.Unmarshal(Record(i, start), &r); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if r.Unrecorded != nil {
			drops++
			continue
		}
		base, cand, affected := Sets(r.Org, r.Team, r.Employee)
		if !affected {
			continue
		}
		req := client.Request{Tool: r.Request.Tool, Input: r.Request.Input, Request: r.Request.HTTP}
		b, c := evaluator(base).Evaluate(t.Context(), req), evaluator(cand).Evaluate(t.Context(), req)
		if b.Err != nil || c.Err != nil {
			t.Fatalf("record %d: evaluation errors %v, %v", i, b.Err, c.Err)
		}
		switch {
		case b.Allowed && !c.Allowed:
			toDeny++
		case !b.Allowed && c.Allowed:
			toAllow++
		}
	}
	if toDeny == 0 || toAllow == 0 || drops != 20 {
		t.Errorf("allow→deny %d, deny→allow %d, drop entries %d: want flips both ways and 20 drop entries", toDeny, toAllow, drops)
	}
	if _, _, affected := Sets("org-9", "team-0", "e"); affected {
		t.Error("org-9 affected")
	}
}
