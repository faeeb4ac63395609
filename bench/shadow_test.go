package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
)

func TestShadowConfigValidate(t *testing.T) {
	good := func() shadowConfig {
		return shadowConfig{sidecars: 10, nodes: 1, rounds: 1, window: 12 * time.Second, evalRate: 2,
			connectTimeout: time.Minute, flushTimeout: time.Minute, startConcurrency: 4}
	}
	tests := []struct {
		name    string
		edit    func(c *shadowConfig)
		wantErr string
	}{
		{"defaults", func(*shadowConfig) {}, ""},
		{"no sidecars", func(c *shadowConfig) { c.sidecars = 0 }, "-sidecars"},
		{"no rounds", func(c *shadowConfig) { c.rounds = 0 }, "-rounds"},
		{"window under two intervals", func(c *shadowConfig) { c.window = 11 * time.Second }, "-window"},
		{"no evaluations", func(c *shadowConfig) { c.evalRate = 0 }, "-eval-rate"},
		{"no flush time", func(c *shadowConfig) { c.flushTimeout = 0 }, "-flush-timeout"},
		{"no dial concurrency", func(c *shadowConfig) { c.startConcurrency = 0 }, "-dial-concurrency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.edit(&c)
			err := c.validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("validate() = %v, want an error naming %s", err, tt.wantErr)
			}
		})
	}
}

func TestShadowPolicies(t *testing.T) {
	puts := shadowPolicies("o1")
	var got []string
	for _, p := range puts {
		var b struct {
			Name        string            `json:"name"`
			Kind        string            `json:"kind"`
			Enforcement string            `json:"enforcement"`
			Scope       map[string]string `json:"scope"`
		}
		if err := json.Unmarshal(p.body, &b); err != nil {
			t.Fatalf("%s: %v", p.path, err)
		}
		if p.path != "/v1/policies/"+b.Name || b.Scope["org"] != "o1" {
			t.Errorf("%s: name %q, scope %v", p.path, b.Name, b.Scope)
		}
		got = append(got, b.Kind+" "+b.Enforcement)
	}
	want := []string{"ToolPolicy "}
	for range shadowTools {
		want = append(want, "ToolPolicy shadow")
	}
	for range shadowValidating {
		want = append(want, "ValidatingPolicy shadow")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kinds and enforcement (-want +got):\n%s", diff)
	}
}

func TestSumCounter(t *testing.T) {
	text := `# HELP policyd_shadow_reports_rejected_total x
# TYPE policyd_shadow_reports_rejected_total counter
policyd_shadow_reports_rejected_total{node="n1",reason="rate_limited"} 3
policyd_shadow_reports_rejected_total{node="n1",reason="unknown_policy"} 1.5e+01
policyd_shadow_reports_rejected_total_other{node="n1"} 100
policyd_shadow_disagreements_total{kind="would_block",node="n1",policy="p"} 7
`
	tests := []struct {
		name string
		want float64
	}{
		{metricShadowRejected, 18},
		{"policyd_shadow_disagreements_total", 7},
		{"policyd_absent_total", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sumCounter([]byte(text), tt.name); got != tt.want {
				t.Errorf("sumCounter(%s) = %g, want %g", tt.name, got, tt.want)
			}
		})
	}
}

func TestReportGate(t *testing.T) {
	report := discoveryv1.PolicyDiscoveryService_ReportShadow_FullMethodName
	tests := []struct {
		name    string
		on      bool
		method  string
		answer  error
		sent    bool
		wantErr codes.Code
		want    [4]int64 // accepted, rate limited, failed, held
	}{
		{"off holds a report", false, report, nil, false, codes.Unavailable, [4]int64{0, 0, 0, 1}},
		{"off passes another RPC", false, "/x/HealthCheck", nil, true, codes.OK, [4]int64{}},
		{"on, accepted", true, report, nil, true, codes.OK, [4]int64{1, 0, 0, 0}},
		{"on, too soon", true, report, status.Error(codes.ResourceExhausted, "soon"), true, codes.ResourceExhausted, [4]int64{0, 1, 0, 0}},
		{"on, refused", true, report, status.Error(codes.FailedPrecondition, "no stream"), true, codes.FailedPrecondition, [4]int64{0, 0, 1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &reportGate{}
			g.on.Store(tt.on)
			sent := false
			invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				sent = true
				return tt.answer
			}
			err := g.intercept(context.Background(), tt.method, nil, nil, nil, invoker)
			if status.Code(err) != tt.wantErr || sent != tt.sent {
				t.Errorf("intercept: err %v, sent %v; want code %v, sent %v", err, sent, tt.wantErr, tt.sent)
			}
			got := [4]int64{g.accepted.Load(), g.rateLimited.Load(), g.failed.Load(), g.held.Load()}
			if got != tt.want {
				t.Errorf("counts %v, want %v", got, tt.want)
			}
		})
	}
}

func TestShadowFigure(t *testing.T) {
	f := &shadowFigure{ShadowPolicies: 10, Match: 10}
	// Round 1: 0.1 s off, 0.3 s on over 2,000 reports: 0.2 s per 2,000,
	// 100 ms per 1,000. Round 2: the off window twice as long.
	f.add(&shadowWindow{DurationS: 10, nodeCPUDur: 100 * time.Millisecond},
		&shadowWindow{DurationS: 10, Accepted: 2000, nodeCPUDur: 300 * time.Millisecond})
	f.add(&shadowWindow{DurationS: 20, nodeCPUDur: 200 * time.Millisecond},
		&shadowWindow{DurationS: 10, Accepted: 1000, nodeCPUDur: 250 * time.Millisecond})
	f.finish()
	want := &shadowFigure{ShadowPolicies: 10, Match: 10, PerRoundMs: []float64{100, 150}, MedianMs: 125, PooledMs: 116.67,
		NodeCPUOff: 0.01, NodeCPUOn: 0.028, ReportsPerS: 150, Accepted: 3000}
	if diff := cmp.Diff(want, f, cmpopts.IgnoreFields(shadowFigure{}, "Windows"), cmp.AllowUnexported(shadowFigure{}),
		cmpopts.IgnoreFields(shadowFigure{}, "onCPU", "offCPU", "onS", "offS")); diff != "" {
		t.Errorf("figure (-want +got):\n%s", diff)
	}
	if tg := f.targets(); len(tg) != 1 || !tg[0].Met {
		t.Errorf("targets() = %+v, want met", tg)
	}
	f.RateLimited = 1
	if tg := f.targets(); tg[0].Met {
		t.Errorf("targets() with a rate-limited report = %+v, want not met", tg)
	}
	f.RateLimited, f.Match = 0, 9
	if tg := f.targets(); tg[0].Met {
		t.Errorf("targets() with a mismatch = %+v, want not met", tg)
	}
}
