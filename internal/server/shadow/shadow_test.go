package shadow

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/policyd/policyd/internal/policy"
)

func newAgg(t *testing.T) (*Aggregator, *time.Time) {
	t.Helper()
	a, err := New(Config{}, slog.New(slog.DiscardHandler), "n1", prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	a.now = func() time.Time { return now }
	return a, &now
}

func report(member string, id policy.Identity, counts ...Count) Report {
	return Report{
		Member: member, Identity: id, Counts: counts,
		Served: func(name string) bool { return name == "acme.s" || name == "acme.t" },
		Exists: func(name string) bool { return name == "acme.s" || name == "acme.t" || name == "acme.enforced" },
	}
}

// TestReport: reports are aggregated per policy and scope; a report too
// soon, too long or with absurd counts is ignored whole, an entry for a
// policy the sidecar is not served alone; each is counted by reason.
func TestReport(t *testing.T) {
	a, now := newAgg(t)
	red := policy.Identity{Org: "acme", Team: "red", Employee: "e1"}
	blue := policy.Identity{Org: "acme", Team: "blue", Employee: "e2"}
	tests := []struct {
		name    string
		advance time.Duration
		r       Report
		err     error
		reason  string
	}{
		{"first report", 0, report("m1", red, Count{"acme.s", 3, 1, 10}, Count{"acme.t", 0, 0, 4}), nil, ""},
		{"another sidecar", 0, report("m2", blue, Count{"acme.s", 1, 0, 2}), nil, ""},
		{"too soon", 4 * time.Second, report("m1", red, Count{"acme.s", 1, 0, 1}), ErrRateLimited, ReasonRateLimited},
		{"after 5s", time.Second, report("m1", red, Count{"acme.s", 2, 0, 5}), nil, ""},
		{"absurd count", 5 * time.Second, report("m1", red, Count{"acme.s", MaxCount + 1, 0, MaxCount + 1}), ErrInvalid, ReasonAbsurdCount},
		{"more disagreements than evaluations", 5 * time.Second, report("m1", red, Count{"acme.s", 3, 3, 5}), ErrInvalid, ReasonAbsurdCount},
		{"a policy named twice", 5 * time.Second, report("m1", red, Count{"acme.s", MaxCount, 0, MaxCount}, Count{"acme.s", MaxCount, 0, MaxCount}), ErrInvalid, ReasonDuplicate},
		{"too many entries", 5 * time.Second, report("m1", red, make([]Count, MaxEntries+1)...), ErrInvalid, ReasonTooManyEntries},
		{"unknown policy", 5 * time.Second, report("m1", red, Count{"acme.nope", 1, 0, 1}), nil, ReasonUnknownPolicy},
		{"not served", 5 * time.Second, report("m1", red, Count{"acme.enforced", 1, 0, 1}), nil, ReasonNotApplicable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			*now = now.Add(tc.advance)
			var before float64
			if tc.reason != "" {
				before = testutil.ToFloat64(a.rejected.WithLabelValues(tc.reason))
			}
			if err := a.Report(tc.r); !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("Report = %v, want %v", err, tc.err)
			}
			if tc.reason != "" {
				if got := testutil.ToFloat64(a.rejected.WithLabelValues(tc.reason)) - before; got != 1 {
					t.Errorf("rejected{reason=%s} grew by %v, want 1", tc.reason, got)
				}
			}
		})
	}
	want := []ScopeCount{
		{Scope: "acme/blue/e2", WouldBlock: 1, Evaluated: 2},
		{Scope: "acme/red/e1", WouldBlock: 5, WouldAllow: 1, Evaluated: 15},
	}
	if diff := cmp.Diff(want, a.Local("acme.s")); diff != "" {
		t.Errorf("Local(acme.s) (-want +got):\n%s", diff)
	}
	if got := testutil.ToFloat64(a.disagreements.WithLabelValues("acme.s", "would_block")); got != 6 {
		t.Errorf("disagreements{acme.s, would_block} = %v, want 6", got)
	}
	if got := a.Local("acme.nope"); got != nil {
		t.Errorf("Local of an unknown policy = %v", got)
	}
}

// BenchmarkReport is the node's cost of one report of 10 entries from one
// of 10,000 sidecars (the issue asks for the CPU per 1,000 reports).
func BenchmarkReport(b *testing.B) {
	a, err := New(Config{}, slog.New(slog.DiscardHandler), "n1", nil)
	if err != nil {
		b.Fatal(err)
	}
	served := map[string]bool{}
	counts := make([]Count, 10)
	for i := range counts {
		counts[i] = Count{Policy: fmt.Sprintf("acme.shadow-%d", i), WouldBlock: 3, WouldAllow: 1, Evaluated: 100}
		served[counts[i].Policy] = true
	}
	members := make([]string, 10_000)
	for i := range members {
		members[i] = fmt.Sprintf("sidecar-%d", i)
	}
	now := time.Unix(1_700_000_000, 0)
	a.now = func() time.Time { return now }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%len(members) == 0 {
			now = now.Add(DefaultMinInterval) // every sidecar may report again
		}
		err := a.Report(Report{
			Member: members[i%len(members)], Identity: policy.Identity{Org: "acme", Team: fmt.Sprint(i % 50), Employee: members[i%len(members)]},
			Counts: counts, Served: func(n string) bool { return served[n] }, Exists: func(string) bool { return true },
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
