package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDecisionsValidate(t *testing.T) {
	ok := decisionsConfig{requests: 10, warmup: 0, concurrency: 2, conns: 1, duration: time.Second, rounds: 1,
		idle: time.Second, settle: time.Second, authzCPUs: "1"}
	tests := []struct {
		name    string
		edit    func(c *decisionsConfig)
		mention string
	}{
		{"valid", func(*decisionsConfig) {}, ""},
		{"unpinned", func(c *decisionsConfig) { c.authzCPUs = "" }, ""},
		{"no rounds", func(c *decisionsConfig) { c.rounds = 0 }, "-rounds"},
		{"no requests", func(c *decisionsConfig) { c.requests = 0 }, "-requests"},
		{"negative warm-up", func(c *decisionsConfig) { c.warmup = -1 }, "-warmup"},
		{"no settle", func(c *decisionsConfig) { c.settle = 0 }, "-settle"},
		{"no idle", func(c *decisionsConfig) { c.idle = 0 }, "-idle"},
		{"bad CPUs", func(c *decisionsConfig) { c.authzCPUs = "x" }, "-authz-cpus"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.validate()
			if tc.mention == "" && err != nil || tc.mention != "" && (err == nil || !strings.Contains(err.Error(), tc.mention)) {
				t.Fatalf("validate = %v, want an error mentioning %q", err, tc.mention)
			}
		})
	}
}

func TestDecisionsVariants(t *testing.T) {
	names := func(vs []decisionsVariant) []string {
		var out []string
		for _, v := range vs {
			out = append(out, v.name)
		}
		return out
	}
	if got := names(decisionsVariants(false)); !cmp.Equal(got, []string{"off", "all"}) {
		t.Errorf("without sampled: %q", got)
	}
	vs := decisionsVariants(true)
	if got := names(vs); !cmp.Equal(got, []string{"off", "all", "sampled"}) {
		t.Errorf("with sampled: %q", got)
	}
	// Logging off must be first: the others' ratios are to it.
	if len(vs[0].args) != 0 || !cmp.Equal(vs[1].args, []string{"--decision-log", "--decision-log-allow-rate", "1"}) {
		t.Errorf("flags: off %q, all %q", vs[0].args, vs[1].args)
	}
}

func TestRotation(t *testing.T) {
	want := [][]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 1, 2}}
	for r, w := range want {
		if got := rotation(3, r); !cmp.Equal(got, w) {
			t.Errorf("rotation(3, %d) = %v, want %v", r, got, w)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := append([]float64(nil), tc.xs...)
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %g, want %g", tc.xs, got, tc.want)
		}
		if !cmp.Equal(in, tc.xs) {
			t.Errorf("median reordered its input: %v", tc.xs)
		}
	}
}

func TestRatio3(t *testing.T) {
	if got := ratio3(1.0501, 1); got != 1.05 {
		t.Errorf("ratio3(1.0501, 1) = %g", got)
	}
	if got := ratio3(0.909, 1); got != 0.909 {
		t.Errorf("ratio3(0.909, 1) = %g", got)
	}
	if got := ratio3(1, 0); got != 0 {
		t.Errorf("ratio3(1, 0) = %g", got)
	}
}

func TestCPUMsPer1000(t *testing.T) {
	// 0.5 CPU-s over 10 s at an idle 0.01 per s: 0.4 s above idle, for
	// 8,000 records: 50 ms per 1,000.
	if got := cpuMsPer1000(500*time.Millisecond, 10, 0.01, 8000); got != 50 {
		t.Errorf("cpuMsPer1000 = %g, want 50", got)
	}
	if got := cpuMsPer1000(time.Second, 10, 0, 0); got != 0 {
		t.Errorf("no records: %g, want 0", got)
	}
}

// TestDecisionsVariantFigure sums two rounds and compares them with
// logging off; the targets follow the ratios.
func TestDecisionsVariantFigure(t *testing.T) {
	run := func(mode string, p50, p99, perS, cpu float64, checks int) *decisionsRunFigure {
		f := &decisionsRunFigure{Logging: "x", Round: 1}
		f.Mode, f.P50Ms, f.P99Ms, f.DecisionsPerS, f.AuthzCPU, f.Checks, f.DurationS = mode, p50, p99, perS, cpu, checks, 1
		return f
	}
	t0 := time.Unix(0, 0)
	mark := func(s, cpu, records float64) nodeMark {
		return nodeMark{at: t0.Add(time.Duration(s * float64(time.Second))), cpu: time.Duration(cpu * float64(time.Second)), records: records}
	}
	off := &decisionsVariantFigure{Logging: "off", Rounds: 2}
	off.add(run("sequential", 0.2, 0.5, 4000, 0.7, 4000), run("concurrent", 2, 6, 10000, 1, 10000), mark(0, 0, 0), mark(10, 0.1, 0))
	off.add(run("sequential", 0.3, 0.7, 4000, 0.7, 4000), run("concurrent", 2, 6, 12000, 1, 12000), mark(10, 0.1, 0), mark(20, 0.2, 0))
	off.finish(0.01, nil)
	if off.P50Ms != 0.25 || off.P99Ms != 0.6 || off.DecisionsPerCPUS != 11000 || off.DecisionsPerS != 11000 || off.targets() != nil {
		t.Errorf("off: %+v, targets %v", off, off.targets())
	}

	on := &decisionsVariantFigure{Logging: "all", AllowRate: "1", Rounds: 2}
	on.add(run("sequential", 0.2, 0.6, 4000, 0.7, 4000), run("concurrent", 2, 6, 10000, 1.1, 11000), mark(0, 0, 0), mark(10, 0.3, 5000))
	on.add(run("sequential", 0.3, 0.66, 4000, 0.7, 4000), run("concurrent", 2, 6, 12000, 1.1, 11000), mark(10, 0.3, 5000), mark(20, 0.6, 10000))
	on.finish(0.01, off)
	// 0.6 CPU-s over 20 s, 0.2 of it idle, for 10,000 records.
	if on.P99Ratio != 1.05 || on.PerCPURatio != 0.909 || on.NodeCPUMsPer1000 != 40 || on.RecordsPerS != 500 || on.NodeCPU != 0.03 {
		t.Errorf("on: %+v", on)
	}
	ts := on.targets()
	if len(ts) != 2 || !ts[0].Met || !ts[1].Met || !strings.Contains(ts[0].Measured, "× 1.05") {
		t.Errorf("targets %+v", ts)
	}
	on.P99Ratio, on.PerCPURatio = 1.06, 0.89
	if ts := on.targets(); ts[0].Met || ts[1].Met {
		t.Errorf("targets %+v, want both missed", ts)
	}

	node := &decisionsNodeFigure{IdleNodeCPU: 0.01}
	node.add(on)
	node.finish(10000, 11_000_000)
	if node.NodeCPUMsPer1000 != 40 || node.BytesPerRecord != 1100 {
		t.Errorf("node: %+v", node)
	}
}
