package reload

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

// TestSeedScopePresentAtZero: once the controller has seen a scope, its
// per-scope counters are exposed at 0, before any restart, error, debounce
// or retry, so that alert rules on them see a series.
func TestSeedScopePresentAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, "ns", "app=web")
	if err != nil {
		t.Fatal(err)
	}
	perScope := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "env" {
						got[mf.GetName()+"{env="+l.GetValue()+"}"] = s.GetCounter().GetValue()
					}
				}
			}
		}
		return got
	}
	if got := perScope(); len(got) != 0 {
		t.Fatalf("per-scope series before any scope is seen: %v", got)
	}
	m.seedScope("test")
	m.seedScope("test") // idempotent
	want := map[string]float64{
		"configmap_reload_restarts_total{env=test}":  0,
		"configmap_reload_errors_total{env=test}":    0,
		"configmap_reload_debounced_total{env=test}": 0,
		"configmap_reload_retry_total{env=test}":     0,
	}
	if diff := cmp.Diff(want, perScope()); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}
