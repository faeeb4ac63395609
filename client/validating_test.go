package client

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/policyd/policyd/api/celenv"
	"github.com/policyd/policyd/internal/poll"
)

// val is one validation of a ValidatingPolicy: expression, message, reason.
type val struct{ expr, msg, reason string }

// vp builds a ValidatingPolicy.
func vp(name string, vals ...val) Policy {
	list := make([]map[string]any, 0, len(vals))
	for _, v := range vals {
		m := map[string]any{"expression": v.expr, "message": v.msg}
		if v.reason != "" {
			m["reason"] = v.reason
		}
		list = append(list, m)
	}
	b, _ := json.Marshal(map[string]any{"validations": list})
	return Policy{Name: name, Kind: KindValidatingPolicy, Spec: b, Revision: 1}
}

func getReq(path string) Request {
	return Request{Request: map[string]any{"method": "GET", "path": path, "headers": map[string]any{"x-user": "alice"}}}
}

func TestEvaluateValidatingPolicy(t *testing.T) {
	onlyGet := vp("only-get", val{`request.method == "GET"`, "only GET is allowed", "MethodNotAllowed"})
	items := make([]any, 1000)
	for i := range items {
		items[i] = i
	}
	tests := []evalCase{
		{
			name: "allow",
			set:  []Policy{onlyGet},
			req:  getReq("/"),
			want: Decision{Allowed: true},
		},
		{
			name: "deny with message and reason",
			set:  []Policy{onlyGet},
			req:  Request{Request: map[string]any{"method": "DELETE"}},
			want: Decision{Policy: "only-get", Message: "only GET is allowed", Reason: "MethodNotAllowed"},
		},
		{
			name: "first failing validation of a policy wins",
			set: []Policy{vp("p",
				val{`request.method == "GET"`, "m1", ""},
				val{`request.path.startsWith("/api/")`, "m2", "r2"},
				val{`false`, "m3", "r3"},
			)},
			req:  getReq("/admin"),
			want: Decision{Policy: "p", Message: "m2", Reason: "r2"},
		},
		{
			name: "every policy must hold, in name order",
			set: []Policy{
				vp("a", val{`"x-user" in request.headers`, "needs a user", ""}),
				vp("b", val{`request.headers["x-user"] != "alice"`, "alice is out", ""}),
				vp("c", val{`false`, "never reached", ""}),
			},
			req:  getReq("/"),
			want: Decision{Policy: "b", Message: "alice is out"},
		},
		{
			name:       "runtime error denies and is counted",
			set:        []Policy{vp("p", val{`request.missing == "x"`, "needs missing", ""})},
			req:        getReq("/"),
			want:       Decision{Policy: "p", Message: "needs missing"},
			wantErr:    "no such key",
			wantErrors: 1,
		},
		{
			name:       "non-bool result denies and is counted",
			set:        []Policy{vp("p", val{`request.method`, "not a bool", ""})},
			req:        getReq("/"),
			want:       Decision{Policy: "p", Message: "not a bool"},
			wantErr:    "not a bool",
			wantErrors: 1,
		},
		{
			name:       "unset request is an empty map",
			set:        []Policy{onlyGet},
			req:        Request{Tool: "Read"},
			want:       Decision{Policy: "only-get", Message: "only GET is allowed", Reason: "MethodNotAllowed"},
			wantErr:    "no such key",
			wantErrors: 1,
		},
		{
			name:       "cost limit denies",
			set:        []Policy{vp("slow", val{`request.items.all(x, request.items.all(y, x + y >= 0))`, "too slow", ""})},
			req:        Request{Request: map[string]any{"items": items}},
			want:       Decision{Policy: "slow", Message: "too slow"},
			wantErr:    "cost limit",
			wantErrors: 1,
		},
		{
			name: "tool and input variables",
			set:  []Policy{vp("no-bash-sudo", val{`tool != "Bash" || !input.command.contains("sudo")`, "no sudo", ""})},
			req:  Request{Tool: "Bash", Input: map[string]any{"command": "sudo ls"}},
			want: Decision{Policy: "no-bash-sudo", Message: "no sudo"},
		},
		{
			name: "ToolPolicy deny wins",
			set:  []Policy{tp("deny-rm", "Bash", "deny", "no rm", "rm -rf"), vp("p", val{`true`, "m", ""})},
			req:  Request{Tool: "Bash", Input: map[string]any{"command": "rm -rf /"}},
			want: Decision{Policy: "deny-rm", Message: "no rm"},
		},
		{
			name: "ToolPolicy not matching, validations hold",
			set:  []Policy{tp("deny-rm", "Bash", "deny", "no rm", "rm -rf"), vp("p", val{`tool == "Bash"`, "m", ""})},
			req:  Request{Tool: "Bash", Input: map[string]any{"command": "ls"}},
			want: Decision{Allowed: true},
		},
		{
			name: "ToolPolicy ignored without a tool",
			set:  []Policy{tp("deny-all", "*", "deny", "nothing")},
			req:  getReq("/"),
			want: Decision{Allowed: true},
		},
	}
	runEvalCases(t, tests)
}

// TestEvaluateCostLimitConfigurable: Config.CELCostLimit is the budget.
func TestEvaluateCostLimitConfigurable(t *testing.T) {
	set := []Policy{vp("p", val{`request.items.all(x, x >= 0)`, "m", ""})}
	req := Request{Request: map[string]any{"items": []any{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}}
	for _, tc := range []struct {
		limit   uint64
		allowed bool
	}{{limit: 5, allowed: false}, {limit: 1000, allowed: true}} {
		t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
			c, err := New(Config{Servers: []string{"127.0.0.1:1"}, CELCostLimit: tc.limit}, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.install(set, "v1", 0, true, "test"); err != nil {
				t.Fatal(err)
			}
			c.synced()
			if d := c.Evaluate(t.Context(), req); d.Allowed != tc.allowed {
				t.Fatalf("Evaluate = %+v, want allowed %v", d, tc.allowed)
			}
		})
	}
}

func TestEvaluateCancelledContextDenies(t *testing.T) {
	c := readyClient(t, vp("p", val{`true`, "m", ""}))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if d := c.Evaluate(ctx, getReq("/")); d.Allowed || d.Err == nil {
		t.Fatalf("Evaluate = %+v, want a denial with an error", d)
	}
	if got := c.EvalErrors(); got != 1 {
		t.Fatalf("EvalErrors = %d, want 1", got)
	}
}

// TestInvalidValidatingPolicyRejectsTheSet: a ValidatingPolicy that does not
// compile makes the whole set fail to apply, and the previous one stays.
func TestInvalidValidatingPolicyRejectsTheSet(t *testing.T) {
	tests := []struct {
		name    string
		p       Policy
		mention string
	}{
		{"syntax error", vp("bad", val{`request.method ==`, "m", ""}), "validations[0].expression"},
		{"undeclared variable", vp("bad", val{`true`, "m", ""}, val{`nope == 1`, "m", ""}), "validations[1].expression"},
		{"not a bool", vp("bad", val{`"yes"`, "m", ""}), "must evaluate to bool"},
		{"no validations", vp("bad"), "spec.validations"},
		{"spec not an object", Policy{Name: "bad", Kind: KindValidatingPolicy, Spec: json.RawMessage(`[1]`)}, "spec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t, vp("good", val{`request.method == "GET"`, "kept", ""}))
			err := c.install([]Policy{tc.p}, "v2", 0, true, "test")
			if err == nil || !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), "bad") {
				t.Fatalf("install = %v, want an error naming the policy and mentioning %q", err, tc.mention)
			}
			if got, want := c.Version(), "v1"; got != want {
				t.Fatalf("version = %q, want %q", got, want)
			}
			if d := c.Evaluate(t.Context(), Request{Request: map[string]any{"method": "PUT"}}); d.Allowed || d.Message != "kept" {
				t.Fatalf("previous set not in force: %+v", d)
			}
			if got := c.Stats().Rejected; got != 1 {
				t.Fatalf("rejected = %d, want 1", got)
			}
		})
	}
}

// TestValidatorsCompiledOncePerSpec: an unchanged ValidatingPolicy keeps its
// compiled programs across sets; a changed one is recompiled.
func TestValidatorsCompiledOncePerSpec(t *testing.T) {
	a, b := vp("a", val{`true`, "a", ""}), vp("b", val{`true`, "b", ""})
	c := readyClient(t, a, b)
	first := c.view.Load().validators
	b2 := vp("b", val{`false`, "b2", ""})
	if err := c.install([]Policy{a, b2, tp("t", "Bash", "deny", "")}, "v2", 0, true, "test"); err != nil {
		t.Fatal(err)
	}
	second := c.view.Load().validators
	if len(second) != 2 || second[0] != first[0] || second[1] == first[1] {
		t.Fatalf("validators %v after %v: want a reused and b recompiled", second, first)
	}
	if d := c.Evaluate(t.Context(), getReq("/")); d.Message != "b2" {
		t.Fatalf("Evaluate = %+v, want b2's denial", d)
	}
}

// TestEvaluateFollowsTheStateMachine: connecting, disconnected past grace
// and revoked deny everything; disconnected within grace serves the cache.
func TestEvaluateFollowsTheStateMachine(t *testing.T) {
	clock := newFakeClock()
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}, Grace: time.Minute, Clock: clock}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	req := getReq("/")
	check := func(when string, want Decision) {
		t.Helper()
		if diff := cmp.Diff(want, c.Evaluate(t.Context(), req)); diff != "" {
			t.Fatalf("%s: Evaluate (-want +got):\n%s", when, diff)
		}
	}
	check("connecting", Decision{Message: ReasonConnecting})
	if err := c.install([]Policy{vp("p", val{`request.method == "GET"`, "m", ""})}, "v1", 0, true, "test"); err != nil {
		t.Fatal(err)
	}
	check("connecting with a set", Decision{Message: ReasonConnecting})
	c.synced()
	check("ready", Decision{Allowed: true})
	c.lost()
	check("disconnected within grace", Decision{Allowed: true})
	clock.Advance(time.Minute)
	check("disconnected past grace", Decision{Message: ReasonDisconnected})
	c.synced()
	check("ready again", Decision{Allowed: true})
	_ = c.revoke("employee deactivated")
	check("revoked", Decision{Message: "Access revoked (employee deactivated). All requests blocked."})
}

// TestGRPCNackOfPolicyTheSidecarCannotCompile: with a sidecar whose CEL
// environment is stricter than the server's (Config.CELEnvOptions: a
// 10-character parser limit), a policy valid on the server is NACKed with the compile
// error and the previous set stays in force.
func TestGRPCNackOfPolicyTheSidecarCannotCompile(t *testing.T) {
	long := vp("long", val{`request.method == "GET"`, "long", ""})
	env, err := celenv.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, iss := env.Compile(`request.method == "GET"`); iss.Err() != nil {
		t.Fatalf("the server's environment rejects the expression: %v", iss.Err())
	}
	f := newFakeDiscovery("v1", vp("short", val{`true`, "short", ""}))
	n := serveDiscovery(t, f, "")
	r := runClient(t, Config{Servers: []string{n.addr}, CELEnvOptions: []cel.EnvOption{cel.ParserExpressionSizeLimit(10)}})
	r.waitState(t, StateReady)
	f.publish("v2", long)
	poll.Eventually(t, "the NACK", func() error {
		for _, req := range f.reqs() {
			if msg := req.GetErrorDetail().GetMessage(); msg != "" {
				if !strings.Contains(msg, "policy long: spec.validations[0].expression") {
					return fmt.Errorf("NACK message %q", msg)
				}
				return nil
			}
		}
		return fmt.Errorf("no NACK in %d requests", len(f.reqs()))
	})

	if got := r.Version(); got != "v1" {
		t.Fatalf("version %q, want v1 kept", got)
	}
	if d := r.Evaluate(t.Context(), Request{Request: map[string]any{"method": "PUT"}}); !d.Allowed {
		t.Fatalf("Evaluate = %+v, want the previous set (which allows) in force", d)
	}
}

// evalCase is one Evaluate table case: a set, a request, the decision and
// the evaluation errors it must give.
type evalCase struct {
	name       string
	set        []Policy
	req        Request
	want       Decision
	wantErr    string // a substring of Decision.Err; "" for none
	wantErrors uint64
}

// runEvalCases runs each case on a fresh ready client holding its set.
func runEvalCases(t *testing.T, tests []evalCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t, tc.set...)
			got := c.Evaluate(t.Context(), tc.req)
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(Decision{}, "Err")); diff != "" {
				t.Errorf("Evaluate (-want +got):\n%s", diff)
			}
			switch {
			case tc.wantErr == "" && got.Err != nil:
				t.Errorf("Err = %v, want none", got.Err)
			case tc.wantErr != "" && (got.Err == nil || !strings.Contains(got.Err.Error(), tc.wantErr)):
				t.Errorf("Err = %v, want one mentioning %q", got.Err, tc.wantErr)
			}
			if got := c.EvalErrors(); got != tc.wantErrors {
				t.Errorf("EvalErrors = %d, want %d", got, tc.wantErrors)
			}
		})
	}
}
