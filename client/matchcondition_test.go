package client

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
)

// when is one match condition: name, expression.
type when struct{ name, expr string }

// vpWhen builds a ValidatingPolicy with match conditions.
func vpWhen(name string, conds []when, vals ...val) Policy {
	p := vp(name, vals...)
	var spec map[string]any
	if err := json.Unmarshal(p.Spec, &spec); err != nil {
		panic(err)
	}
	list := make([]map[string]any, 0, len(conds))
	for _, c := range conds {
		list = append(list, map[string]any{"name": c.name, "expression": c.expr})
	}
	spec["matchConditions"] = list
	p.Spec, _ = json.Marshal(spec)
	return p
}

func TestEvaluateMatchConditions(t *testing.T) {
	// httpOnly is the example: a policy about HTTP requests that
	// must leave an agent's tool calls alone.
	httpOnly := vpWhen("http-only", []when{{"is-http", `has(request.method)`}},
		val{`request.method == "GET"`, "only GET", "MethodNotAllowed"})
	items := make([]any, 1000)
	for i := range items {
		items[i] = i
	}
	tests := []evalCase{
		{
			name: "all true: validations apply and allow",
			set:  []Policy{httpOnly},
			req:  getReq("/"),
			want: Decision{Allowed: true},
		},
		{
			name: "all true: validations apply and deny",
			set:  []Policy{httpOnly},
			req:  Request{Request: map[string]any{"method": "DELETE"}},
			want: Decision{Policy: "http-only", Message: "only GET", Reason: "MethodNotAllowed"},
		},
		{
			name: "false: a tool call skips the HTTP policy",
			set:  []Policy{httpOnly},
			req:  Request{Tool: "Bash", Input: map[string]any{"command": "ls"}},
			want: Decision{Allowed: true},
		},
		{
			name: "one false of several skips",
			set: []Policy{vpWhen("p", []when{{"a", `true`}, {"b", `request.path.startsWith("/api/")`}, {"c", `true`}},
				val{`false`, "never", ""})},
			req:  getReq("/admin"),
			want: Decision{Allowed: true},
		},
		{
			name: "a skipped policy does not stop the next",
			set: []Policy{
				vpWhen("a", []when{{"never", `false`}}, val{`false`, "a denies", ""}),
				vpWhen("b", []when{{"always", `true`}}, val{`false`, "b denies", ""}),
			},
			req:  getReq("/"),
			want: Decision{Policy: "b", Message: "b denies"},
		},
		{
			name:       "runtime error denies, fail closed",
			set:        []Policy{vpWhen("p", []when{{"is-get", `request.method == "GET"`}}, val{`true`, "m", ""})},
			req:        Request{Tool: "Bash"},
			want:       Decision{Policy: "p", Message: "match condition is-get failed"},
			wantErr:    "no such key",
			wantErrors: 1,
		},
		{
			name:       "non-bool result denies",
			set:        []Policy{vpWhen("p", []when{{"flag", `request.flag`}}, val{`true`, "m", ""})},
			req:        Request{Request: map[string]any{"flag": "yes"}},
			want:       Decision{Policy: "p", Message: "match condition flag failed"},
			wantErr:    "not a bool",
			wantErrors: 1,
		},
		{
			name:       "cost limit denies",
			set:        []Policy{vpWhen("p", []when{{"slow", `request.items.all(x, request.items.all(y, x + y >= 0))`}}, val{`true`, "m", ""})},
			req:        Request{Request: map[string]any{"items": items}},
			want:       Decision{Policy: "p", Message: "match condition slow failed"},
			wantErr:    "cost limit",
			wantErrors: 1,
		},
		{
			name:       "the first failure is named",
			set:        []Policy{vpWhen("p", []when{{"ok", `true`}, {"first", `request.x`}, {"second", `request.y`}}, val{`true`, "m", ""})},
			req:        getReq("/"),
			want:       Decision{Policy: "p", Message: "match condition first failed"},
			wantErr:    "match condition first",
			wantErrors: 1,
		},
		{
			name: "false wins over an error before it",
			set:  []Policy{vpWhen("p", []when{{"broken", `request.x == 1`}, {"not-get", `request.method != "GET"`}}, val{`false`, "m", ""})},
			req:  getReq("/"),
			want: Decision{Allowed: true},
		},
		{
			name: "false wins over an error after it",
			set:  []Policy{vpWhen("p", []when{{"not-get", `request.method != "GET"`}, {"broken", `request.x == 1`}}, val{`false`, "m", ""})},
			req:  getReq("/"),
			want: Decision{Allowed: true},
		},
		{
			name: "ToolPolicy deny still wins",
			set:  []Policy{tp("deny-rm", "Bash", "deny", "no rm", "rm -rf"), vpWhen("p", []when{{"broken", `request.x`}}, val{`true`, "m", ""})},
			req:  Request{Tool: "Bash", Input: map[string]any{"command": "rm -rf /"}},
			want: Decision{Policy: "deny-rm", Message: "no rm"},
		},
	}
	runEvalCases(t, tests)
}

// TestInvalidMatchConditionRejectsTheSet: a match condition that does not
// compile rejects the set, as a validation does.
func TestInvalidMatchConditionRejectsTheSet(t *testing.T) {
	tests := []struct {
		name    string
		p       Policy
		mention string
	}{
		{"syntax error", vpWhen("bad", []when{{"a", `true`}, {"b", `request.method ==`}}, val{`true`, "m", ""}), "spec.matchConditions[1].expression: compile"},
		{"undeclared variable", vpWhen("bad", []when{{"a", `nope`}}, val{`true`, "m", ""}), "spec.matchConditions[0].expression: compile"},
		{"not a bool", vpWhen("bad", []when{{"a", `"yes"`}}, val{`true`, "m", ""}), "spec.matchConditions[0].expression: must evaluate to bool"},
		{"not a list", Policy{Name: "bad", Kind: KindValidatingPolicy, Spec: json.RawMessage(`{"matchConditions":{},"validations":[{"expression":"true","message":"m"}]}`)}, "spec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t, vp("good", val{`request.method == "GET"`, "kept", ""}))
			err := c.install([]Policy{tc.p}, "v2", 0, true, "test")
			if err == nil || !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), "policy bad") {
				t.Fatalf("install = %v, want an error naming the policy and mentioning %q", err, tc.mention)
			}
			if got, want := c.Version(), "v1"; got != want {
				t.Fatalf("version = %q, want %q", got, want)
			}
			if d := c.Evaluate(t.Context(), Request{Request: map[string]any{"method": "PUT"}}); d.Allowed || d.Message != "kept" {
				t.Fatalf("previous set not in force: %+v", d)
			}
		})
	}
}

// TestCELEnvOptions: Config.CELEnvOptions restrict the environment the
// client compiles in, match conditions included; an option the
// environment refuses fails New.
func TestCELEnvOptions(t *testing.T) {
	cfg := Config{Servers: []string{"127.0.0.1:1"}, CELEnvOptions: []cel.EnvOption{cel.ParserExpressionSizeLimit(20)}}
	c, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	short := `request.m == "GET"` // 18 code points
	long := `request.method == "GET"`
	tests := []struct {
		name    string
		p       Policy
		mention string // "" when the set is accepted
	}{
		{"short", vpWhen("p", []when{{"a", short}}, val{short, "m", ""}), ""},
		{"long validation", vp("p", val{long, "m", ""}), "spec.validations[0].expression: compile"},
		{"long match condition", vpWhen("p", []when{{"a", long}}, val{short, "m", ""}), "spec.matchConditions[0].expression: compile"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := c.install([]Policy{tc.p}, tc.name, 0, true, "test")
			switch {
			case tc.mention == "" && err != nil:
				t.Fatalf("install = %v, want it accepted", err)
			case tc.mention != "" && (err == nil || !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), "size")):
				t.Fatalf("install = %v, want a size limit error mentioning %q", err, tc.mention)
			}
		})
	}
	// The default environment takes the long one.
	if err := readyClient(t).install([]Policy{vp("p", val{long, "m", ""})}, "v2", 0, true, "test"); err != nil {
		t.Fatalf("default environment: install = %v", err)
	}

	bad := Config{Servers: []string{"127.0.0.1:1"}, CELEnvOptions: []cel.EnvOption{cel.Container(".bad")}}
	if _, err := New(bad, nil); err == nil || !strings.Contains(err.Error(), "CEL env options") {
		t.Fatalf("New with an invalid container = %v, want a CEL environment error", err)
	}
}
