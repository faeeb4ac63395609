package client

import (
	"fmt"
	"testing"
)

// evaluateBenchSet is the Evaluate benchmarks' 20 ValidatingPolicies and 20 ToolPolicies,
// none of which denies their request.
func evaluateBenchSet() []Policy {
	var set []Policy
	for i := range 20 {
		set = append(set,
			vp(fmt.Sprintf("vp-%02d", i),
				val{`request.method in ["GET", "POST"]`, "method", ""},
				val{fmt.Sprintf(`!request.path.startsWith("/internal/%d/")`, i), "path", ""},
				val{`!("x-evil" in request.headers) && request.headers["x-user"] != ""`, "headers", ""},
			),
			tp(fmt.Sprintf("tp-%02d", i), "Bash", "deny", "no", fmt.Sprintf(`^rm -rf /%d`, i)),
		)
	}
	return set
}

// BenchmarkEvaluate decides one request against 20 ValidatingPolicies and
// 20 ToolPolicies, in process, with every policy evaluated and none denying:
// the slowest path a request that is allowed takes.
func BenchmarkEvaluate(b *testing.B) {
	set := evaluateBenchSet()
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.install(sortByName(set), "v1", 0, true, "bench"); err != nil {
		b.Fatal(err)
	}
	c.synced()
	req := Request{
		Request: map[string]any{"method": "GET", "path": "/api/v1/things", "headers": map[string]any{"x-user": "alice", "accept": "*/*"}},
		Tool:    "Bash",
		Input:   map[string]any{"command": "ls -la /tmp"},
	}
	if d := c.Evaluate(b.Context(), req); !d.Allowed {
		b.Fatalf("Evaluate = %+v, want allowed", d)
	}
	b.ReportAllocs()
	for b.Loop() {
		if d := c.Evaluate(b.Context(), req); !d.Allowed {
			b.Fatal("denied")
		}
	}
}

// BenchmarkEvaluateMatchConditions is BenchmarkEvaluate's set with a match
// condition on every ValidatingPolicy: an HTTP request, for which they
// hold and every validation runs, and a tool call, which skips them all.
func BenchmarkEvaluateMatchConditions(b *testing.B) {
	var set []Policy
	for i := range 20 {
		set = append(set,
			vpWhen(fmt.Sprintf("vp-%02d", i), []when{{"http", `has(request.method)`}},
				val{`request.method in ["GET", "POST"]`, "method", ""},
				val{fmt.Sprintf(`!request.path.startsWith("/internal/%d/")`, i), "path", ""},
				val{`!("x-evil" in request.headers) && request.headers["x-user"] != ""`, "headers", ""},
			),
			tp(fmt.Sprintf("tp-%02d", i), "Bash", "deny", "no", fmt.Sprintf(`^rm -rf /%d`, i)),
		)
	}
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.install(sortByName(set), "v1", 0, true, "bench"); err != nil {
		b.Fatal(err)
	}
	c.synced()
	for _, bc := range []struct {
		name string
		req  Request
	}{
		{"http", Request{Request: map[string]any{"method": "GET", "path": "/api/v1/things", "headers": map[string]any{"x-user": "alice", "accept": "*/*"}}}},
		{"tool", Request{Tool: "Bash", Input: map[string]any{"command": "ls -la /tmp"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if d := c.Evaluate(b.Context(), bc.req); !d.Allowed {
				b.Fatalf("Evaluate = %+v, want allowed", d)
			}
			b.ReportAllocs()
			for b.Loop() {
				if d := c.Evaluate(b.Context(), bc.req); !d.Allowed {
					b.Fatal("denied")
				}
			}
		})
	}
}

// BenchmarkEvaluateDecisionLog is BenchmarkEvaluate's request with the
// decision log off, on with allows sampled at 0.1 (the default), and on
// recording every decision. The rate cap is out of reach, so every
// sampled decision is masked, encoded and buffered; nothing takes the
// records, so the buffer is full and each one drops the oldest.
func BenchmarkEvaluateDecisionLog(b *testing.B) {
	set := evaluateBenchSet()
	req := Request{
		Request: map[string]any{"method": "GET", "path": "/api/v1/things", "headers": map[string]any{
			"x-user": "alice", "accept": "*/*", "authorization": "Bearer secret"}},
		Tool:  "Bash",
		Input: map[string]any{"command": "ls -la /tmp"},
	}
	for _, bc := range []struct {
		name string
		dl   *DecisionLog
	}{
		{"off", nil},
		{"sampled-0.1", &DecisionLog{RatePerSecond: unlimited, Burst: 1 << 30}},
		{"all-1.0", &DecisionLog{AllowSampleRate: new(1.0), RatePerSecond: unlimited, Burst: 1 << 30}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := New(Config{Servers: []string{"127.0.0.1:1"}, DecisionLog: bc.dl}, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := c.install(sortByName(set), "v1", 0, true, "bench"); err != nil {
				b.Fatal(err)
			}
			c.synced()
			if d := c.Evaluate(b.Context(), req); !d.Allowed {
				b.Fatalf("Evaluate = %+v, want allowed", d)
			}
			b.ReportAllocs()
			for b.Loop() {
				if d := c.Evaluate(b.Context(), req); !d.Allowed {
					b.Fatal("denied")
				}
			}
		})
	}
}
