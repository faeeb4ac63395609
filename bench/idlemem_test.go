package main

import (
	"math"
	"testing"
	"time"
)

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		name    string
		status  string
		want    int64
		wantErr bool
	}{
		{"typical", "Name:\tpolicyd\nVmPeak:\t 1000 kB\nVmRSS:\t   53412 kB\nRssAnon:\t 40000 kB\n", 53412 * 1024, false},
		{"zero", "VmRSS:\t0 kB\n", 0, false},
		{"no trailing newline", "VmRSS:\t12 kB", 12 * 1024, false},
		{"missing (kernel thread)", "Name:\tkthreadd\nState:\tS\n", 0, true},
		{"other unit", "VmRSS:\t12 MB\n", 0, true},
		{"not a number", "VmRSS:\tlots kB\n", 0, true},
		{"empty", "", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseVmRSS([]byte(tc.status))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseVmRSS = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseStatusKB(t *testing.T) {
	status := []byte("VmRSS:\t   53412 kB\nRssAnon:\t 40000 kB\nRssFile:\t 13000 kB\nRssShmem:\t 412 kB\n")
	for field, want := range map[string]int64{"VmRSS": 53412 << 10, "RssAnon": 40000 << 10, "RssFile": 13000 << 10} {
		if got, err := parseStatusKB(status, field); err != nil || got != want {
			t.Errorf("parseStatusKB(%s) = %d, %v; want %d", field, got, err, want)
		}
	}
	if _, err := parseStatusKB(status, "RssHuge"); err == nil {
		t.Error("parseStatusKB(RssHuge) found a line that is not there")
	}
}

func TestParsePromText(t *testing.T) {
	text := `# HELP go_gc_duration_seconds A summary of the wall-time pause.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.1e-05
go_gc_duration_seconds_sum 0.0012
go_gc_duration_seconds_count 17
# TYPE go_goroutines gauge
go_goroutines 3042
go_memstats_heap_inuse_bytes 1.2345678e+07
go_memstats_heap_alloc_bytes 9876543
policyd_discovery_streams{scope="a/b/c"} 5
broken_line
bad_value abc
  go_memstats_stack_inuse_bytes   2.4576e+06  
`
	got := parsePromText([]byte(text))
	want := map[string]float64{
		"go_gc_duration_seconds_sum":    0.0012,
		"go_gc_duration_seconds_count":  17,
		"go_goroutines":                 3042,
		"go_memstats_heap_inuse_bytes":  12345678,
		"go_memstats_heap_alloc_bytes":  9876543,
		"go_memstats_stack_inuse_bytes": 2457600,
	}
	if len(got) != len(want) {
		t.Errorf("got %d samples %v, want %d", len(got), got, len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestStableMem(t *testing.T) {
	base := memSample{RSS: 100_000_000, HeapInuse: 50_000_000, HasGo: true}
	tests := []struct {
		name string
		cur  memSample
		want bool
	}{
		{"same", base, true},
		{"within 2%", memSample{RSS: 101_900_000, HeapInuse: 49_100_000, HasGo: true}, true},
		{"rss moved", memSample{RSS: 103_000_000, HeapInuse: 50_000_000, HasGo: true}, false},
		{"heap moved", memSample{RSS: 100_000_000, HeapInuse: 52_000_000, HasGo: true}, false},
		{"heap unknown", memSample{RSS: 100_000_000, HeapInuse: 0}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := stableMem(base, tc.cur, settleTolerance); got != tc.want {
				t.Errorf("stableMem(%+v, %+v) = %v, want %v", base, tc.cur, got, tc.want)
			}
		})
	}
}

func TestIdleMemFigure(t *testing.T) {
	cfg := idleMemoryConfig{sidecarFlags: sidecarFlags{nodes: 1, policies: 10, streamsPerConn: 100}}
	nd := &node{id: "node1"}
	before := memPhase{memSample: memSample{RSS: 50 << 20, HeapInuse: 10 << 20, StackInuse: 1 << 20, Goroutines: 40, HasGo: true}, postGC: true, settled: true}
	after := memPhase{memSample: memSample{RSS: 50<<20 + 1000*40<<10, HeapInuse: 10<<20 + 1000*30<<10, StackInuse: 1<<20 + 1000*24<<10, Goroutines: 3040, HasGo: true}, postGC: true, settled: true}
	g := idleMemFigureFor(cfg, nd, kindGRPC, 1000, before, after)
	if g.RSSPerConn != 40<<10 || g.HeapInusePerConn != 30<<10 || g.StackPerConn != 24<<10 || g.GoroutinesPerConn != 3 {
		t.Errorf("per conn: rss %d heap %d stack %d goroutines %v", g.RSSPerConn, g.HeapInusePerConn, g.StackPerConn, g.GoroutinesPerConn)
	}
	if g.TargetBytes != 48<<10 || !g.TargetMetRSS || g.TargetMetGo || !g.PostGC || !g.Settled || !g.GoMetrics {
		t.Errorf("grpc figure = %+v", g)
	}
	w := idleMemFigureFor(cfg, nd, kindWS, 1000, before, after)
	if w.TargetBytes != 16<<10 || w.TargetMetRSS || w.StreamsPerConn != 0 {
		t.Errorf("ws figure = %+v", w)
	}
	after.postGC = false
	after.HasGo = false
	if f := idleMemFigureFor(cfg, nd, kindWS, 1000, before, after); f.PostGC || f.GoMetrics || f.TargetMetGo {
		t.Errorf("figure without GC or Go metrics = %+v", f)
	}
	if len(g.row()) != len(g.columns()) {
		t.Errorf("row has %d cells, columns %d", len(g.row()), len(g.columns()))
	}
}

func TestPromHistogram(t *testing.T) {
	text := `# TYPE policyd_discovery_push_latency_seconds histogram
policyd_discovery_push_latency_seconds_bucket{node="node1",le="0.01"} 10
policyd_discovery_push_latency_seconds_bucket{node="node1",le="0.1"} 80
policyd_discovery_push_latency_seconds_bucket{node="node1",le="+Inf"} 100
policyd_discovery_push_latency_seconds_sum{node="node1"} 4.2
policyd_discovery_push_latency_seconds_count{node="node1"} 100
policyd_discovery_push_latency_seconds_bucket{node="node2",le="0.01"} 0
policyd_discovery_push_latency_seconds_bucket{node="node2",le="0.1"} 20
policyd_discovery_push_latency_seconds_bucket{node="node2",le="+Inf"} 100
other_bucket{le="0.01"} 5
`
	after := parsePromHistogram([]byte(text), "policyd_discovery_push_latency_seconds")
	want := map[float64]float64{0.01: 10, 0.1: 100, math.Inf(1): 200}
	if len(after) != len(want) {
		t.Fatalf("buckets = %v, want %v", after, want)
	}
	for b, v := range want {
		if after[b] != v {
			t.Errorf("bucket %v = %v, want %v", b, after[b], v)
		}
	}
	before := map[float64]float64{0.01: 10, 0.1: 50, math.Inf(1): 100}
	// Delta: 0.01 → 0, 0.1 → 50, +Inf → 100.
	tests := []struct {
		q    float64
		want float64
	}{
		{0.01, 0.1}, {0.5, 0.1}, {0.51, math.Inf(1)}, {0.99, math.Inf(1)},
	}
	for _, tc := range tests {
		got, n := histogramQuantile(before, after, tc.q)
		if got != tc.want || n != 100 {
			t.Errorf("histogramQuantile(q=%v) = %v, %d; want %v, 100", tc.q, got, n, tc.want)
		}
	}
	if got, n := histogramQuantile(after, after, 0.5); got != 0 || n != 0 {
		t.Errorf("no new observations: %v, %d; want 0, 0", got, n)
	}
	if got, n := histogramQuantile(nil, map[float64]float64{}, 0.5); got != 0 || n != 0 {
		t.Errorf("no buckets: %v, %d; want 0, 0", got, n)
	}
}

func TestParseProcStatCPU(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    time.Duration
		wantErr bool
	}{
		{"typical", "1234 (policyd) S 1 1234 1234 0 -1 4194560 5000 0 0 0 250 75 0 0 20 0 12 0 100 0 0", 3250 * time.Millisecond, false},
		{"name with spaces and parens", "42 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 100 1 0 0", 1010 * time.Millisecond, false},
		{"too short", "42 (x) R 1 2 3", 0, true},
		{"no name", "42 x R 1 2 3 4 5 6 7 8 9 10 100 1", 0, true},
		{"bad number", "42 (x) R 1 2 3 4 5 6 7 8 9 10 lots 1", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStatCPU([]byte(tc.stat))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseProcStatCPU = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseProcIOSyscw(t *testing.T) {
	tests := []struct {
		name    string
		io      string
		want    uint64
		wantErr bool
	}{
		{"typical", "rchar: 10\nwchar: 20\nsyscr: 3\nsyscw: 138560\nread_bytes: 0\n", 138560, false},
		{"last line without newline", "syscr: 3\nsyscw: 7", 7, false},
		{"missing", "rchar: 10\nwchar: 20\n", 0, true},
		{"bad number", "syscw: many\n", 0, true},
		{"syscr is not syscw", "syscr: 5\n", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcIOSyscw([]byte(tc.io))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseProcIOSyscw = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
