package client

import (
	"math"
	"strings"
	"testing"

	"github.com/google/cel-go/interpreter"

	"github.com/policyd/policyd/api/celenv"
)

func compileProgram(t *testing.T, expr string) *program {
	t.Helper()
	env, err := celenv.New()
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		t.Fatal(iss.Err())
	}
	p, err := newProgram(env, ast, DefaultCELCostLimit)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProgramPlan: the size up to which the untracked program runs is the
// largest step whose estimated worst case fits the limit.
func TestProgramPlan(t *testing.T) {
	tests := []struct {
		expr string
		want uint64
	}{
		{`request.method == "GET"`, 4 << 20},
		{`has(request.method)`, 4 << 20},
		{`request.method in ["GET", "HEAD"] || ("x-role" in request.headers && request.headers["x-role"] == "admin")`, 16 << 10},
		{`request.path.matches("^/api/v[0-9]+/")`, 16 << 10},
		{`request.items.all(x, x > 0)`, 16 << 10},
		{`request.items.all(x, request.items.all(y, x + y >= 0))`, 64},
		{`request.items.all(x, request.items.all(y, request.items.all(z, x + y + z >= 0)))`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			p := compileProgram(t, tt.expr)
			if p.fastUpTo != tt.want {
				t.Fatalf("fastUpTo = %d, want %d", p.fastUpTo, tt.want)
			}
			if (p.fast != nil) != (tt.want > 0) {
				t.Fatalf("fast program = %v, want one only when fastUpTo > 0", p.fast)
			}
		})
	}
}

// TestFastAndTrackedAgree: both programs give the same answer wherever
// the fast one may run, and past its bound the tracked one still stops at
// the cost limit.
func TestFastAndTrackedAgree(t *testing.T) {
	items := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	tests := []struct {
		expr    string
		req     Request
		want    bool
		wantErr string
	}{
		{`request.method == "GET"`, Request{Request: map[string]any{"method": "GET"}}, true, ""},
		{`request.method == "GET"`, Request{Request: map[string]any{"method": "PUT"}}, false, ""},
		{`request.method == "GET"`, Request{}, false, "no such key"},
		{`"x-role" in request.headers && request.headers["x-role"] == "admin"`, Request{Request: map[string]any{"headers": map[string]string{"x-role": "admin"}}}, true, ""},
		{`request.path.matches("^/api/v[0-9]+/")`, Request{Request: map[string]any{"path": "/api/v2/x"}}, true, ""},
		{`request.items.all(x, request.items.all(y, x + y >= 0))`, Request{Request: map[string]any{"items": items(60)}}, true, ""},
		{`input.command.contains("sudo")`, Request{Tool: "Bash", Input: map[string]any{"command": "sudo ls"}}, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			p := compileProgram(t, tt.expr)
			vars, err := interpreter.NewActivation(map[string]any{
				"request": tt.req.Request, "input": tt.req.Input, "tool": tt.req.Tool,
				"object": nil, "oldObject": nil, "params": nil,
			})
			if err != nil {
				t.Fatal(err)
			}
			n := inputSize(&tt.req)
			if p.pick(n) != p.fast {
				t.Fatalf("input of size %d runs the tracked program (fastUpTo %d)", n, p.fastUpTo)
			}
			for name, prog := range map[string]*program{"fast": {tracked: p.fast}, "tracked": {tracked: p.tracked}} {
				got, err := evalBool(prog, 0, vars)
				if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
					t.Errorf("%s program = %v, %v; want %v, error containing %q", name, got, err, tt.want, tt.wantErr)
				}
			}
		})
	}

	// Past the fast program's bound, the tracked one runs and stops.
	p := compileProgram(t, `request.items.all(x, request.items.all(y, x + y >= 0))`)
	req := Request{Request: map[string]any{"items": items(1000)}}
	vars, err := interpreter.NewActivation(map[string]any{"request": req.Request})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evalBool(p, inputSize(&req), vars); err == nil || !strings.Contains(err.Error(), "cost limit") {
		t.Fatalf("1,000 items: %v, want the cost limit", err)
	}
}

func TestInputSize(t *testing.T) {
	type opaque struct{ s string }
	deep := any("leaf")
	for range maxWalkDepth + 2 {
		deep = []any{deep}
	}
	tests := []struct {
		name string
		req  Request
		want uint64
	}{
		{"empty", Request{}, 0},
		{"tool name", Request{Tool: "Bash"}, 4},
		{"longest string", Request{Request: map[string]any{"path": "/abc", "h": map[string]string{"k": "123456"}}}, 6},
		{"map entries", Request{Input: map[string]any{"a": 1, "b": 2, "c": true}}, 3},
		{"list length", Request{Object: []any{1, 2, 3, 4, 5}}, 5},
		{"map keys count", Request{Request: map[string]any{"abcdefgh": nil}}, 8},
		{"bytes", Request{Request: map[string]any{"rawBody": []byte("12345678901")}}, 11},
		{"string list", Request{Params: []string{"a", "bcd"}}, 3},
		{"unknown type is unbounded", Request{Object: opaque{"x"}}, math.MaxUint64},
		{"too deep is unbounded", Request{Object: deep}, math.MaxUint64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := inputSize(&tt.req); got != tt.want {
				t.Fatalf("inputSize = %d, want %d", got, tt.want)
			}
		})
	}
}
