package client

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// shadowOf marks p a shadow policy.
func shadowOf(p Policy) Policy {
	p.Enforcement = EnforcementShadow
	return p
}

// TestEvaluatorDecidesAsClient: for each set and request, an Evaluator
// gives the decision a ready Client holding the set gives, error included.
func TestEvaluatorDecidesAsClient(t *testing.T) {
	onlyGet := vp("only-get", val{`request.method == "GET"`, "only GET is allowed", "MethodNotAllowed"})
	denyRm := tp("deny-rm", "Bash", "deny", "no rm", "rm -rf")
	items := make([]any, 1000)
	for i := range items {
		items[i] = i
	}
	bash := func(cmd string) Request { return Request{Tool: "Bash", Input: map[string]any{"command": cmd}} }
	tests := []struct {
		name    string
		set     []Policy
		req     Request
		allowed bool
	}{
		{name: "empty set allows", req: bash("rm -rf /"), allowed: true},
		{name: "validation holds", set: []Policy{onlyGet}, req: getReq("/"), allowed: true},
		{name: "validation denies", set: []Policy{onlyGet}, req: Request{Request: map[string]any{"method": "PUT"}}},
		{name: "ToolPolicy denies", set: []Policy{denyRm, onlyGet}, req: bash("rm -rf /")},
		{name: "ToolPolicy does not match", set: []Policy{denyRm}, req: bash("ls"), allowed: true},
		{name: "audit never denies", set: []Policy{tp("audit", "*", "audit", "seen")}, req: bash("ls"), allowed: true},
		{name: "allow rule changes nothing", set: []Policy{tp("a", "Bash", "allow", ""), denyRm}, req: bash("rm -rf /")},
		{name: "wildcard and name order", set: []Policy{tp("z", "Bash", "deny", "z"), tp("a", "*", "deny", "a")}, req: bash("x")},
		{name: "set out of order", set: []Policy{vp("c", val{`false`, "c", ""}), vp("b", val{`false`, "b", ""})}, req: getReq("/")},
		{name: "last of a name wins", set: []Policy{vp("p", val{`false`, "first", ""}), vp("p", val{`true`, "second", ""})}, req: getReq("/"), allowed: true},
		{name: "runtime error denies", set: []Policy{vp("p", val{`request.missing == "x"`, "m", ""})}, req: getReq("/")},
		{name: "cost limit denies", set: []Policy{vp("slow", val{`request.items.all(x, request.items.all(y, x + y >= 0))`, "too slow", ""})},
			req: Request{Request: map[string]any{"items": items}}},
		{name: "false match condition skips", set: []Policy{vpWhen("http", []when{{"is-http", `has(request.method)`}}, val{`false`, "m", ""})},
			req: bash("ls"), allowed: true},
		{name: "failing match condition denies", set: []Policy{vpWhen("p", []when{{"bad", `request.nope`}}, val{`true`, "m", ""})}, req: getReq("/")},
		{name: "shadow ToolPolicy does not decide", set: []Policy{shadowOf(tp("s", "*", "deny", "shadow"))}, req: bash("ls"), allowed: true},
		{name: "shadow ValidatingPolicy does not decide", set: []Policy{shadowOf(vp("s", val{`false`, "shadow", ""}))}, req: getReq("/"), allowed: true},
		{name: "enforced decides beside shadow", set: []Policy{shadowOf(vp("a", val{`true`, "a", ""})), vp("b", val{`false`, "b", ""})}, req: getReq("/")},
		{name: "other kinds ignored", set: []Policy{{Name: "k", Kind: "SomethingElse", Spec: []byte(`{}`)}}, req: getReq("/"), allowed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t, tc.set...)
			e, err := NewEvaluator(tc.set)
			if err != nil {
				t.Fatal(err)
			}
			want := c.Evaluate(t.Context(), tc.req)
			got := e.Evaluate(t.Context(), tc.req)
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Decision{}, "Err")); diff != "" {
				t.Errorf("Evaluator (-Client +Evaluator):\n%s", diff)
			}
			if fmt.Sprint(want.Err) != fmt.Sprint(got.Err) {
				t.Errorf("Err = %v, Client's %v", got.Err, want.Err)
			}
			if got.Allowed != tc.allowed {
				t.Errorf("Allowed = %v, want %v (%+v)", got.Allowed, tc.allowed, got)
			}
			if e.EvalErrors() != c.EvalErrors() {
				t.Errorf("EvalErrors = %d, Client's %d", e.EvalErrors(), c.EvalErrors())
			}
		})
	}
}

// TestNewEvaluatorRejectsWhatClientRejects: a policy that does not compile
// fails the Evaluator as it fails a Client's install, with the same error.
func TestNewEvaluatorRejectsWhatClientRejects(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
	}{
		{"CEL syntax", vp("bad", val{`request.method ==`, "m", ""})},
		{"not a bool", vp("bad", val{`"yes"`, "m", ""})},
		{"regexp", tp("bad", "Bash", "deny", "", "(")},
		{"action", tp("bad", "Bash", "block", "")},
		{"shadow that does not compile", shadowOf(vp("bad", val{`nope`, "m", ""}))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t)
			cerr := c.install([]Policy{tc.p}, "v2", 0, true, "test")
			_, err := NewEvaluator([]Policy{tc.p})
			if tc.p.isShadow() {
				// The Evaluator never compiles shadow policies: they
				// cannot change its decisions.
				if err != nil || cerr == nil {
					t.Fatalf("NewEvaluator = %v, Client install = %v: want nil and an error", err, cerr)
				}
				return
			}
			if err == nil || cerr == nil || err.Error() != cerr.Error() {
				t.Fatalf("NewEvaluator = %v, Client install = %v: want the same error", err, cerr)
			}
			if !strings.Contains(err.Error(), "bad") {
				t.Fatalf("error %q does not name the policy", err)
			}
		})
	}
}

// TestEvaluatorCancelledContextDenies: as Client.Evaluate, an ended ctx
// denies with an error before a ValidatingPolicy runs.
func TestEvaluatorCancelledContextDenies(t *testing.T) {
	e, err := NewEvaluator([]Policy{vp("p", val{`true`, "m", ""})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if d := e.Evaluate(ctx, getReq("/")); d.Allowed || d.Err == nil {
		t.Fatalf("Evaluate = %+v, want a denial with an error", d)
	}
	if got := e.EvalErrors(); got != 1 {
		t.Fatalf("EvalErrors = %d, want 1", got)
	}
}

// TestEvaluatorConcurrent: one Evaluator serves concurrent callers (run
// with -race).
func TestEvaluatorConcurrent(t *testing.T) {
	e, err := NewEvaluator([]Policy{tp("deny-rm", "Bash", "deny", "no rm", "rm -rf"), vp("p", val{`tool != "Bash" || input.command != "sudo"`, "no sudo", ""})})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				cmd := []string{"ls", "rm -rf /", "sudo"}[(i+j)%3]
				d := e.Evaluate(context.Background(), Request{Tool: "Bash", Input: map[string]any{"command": cmd}})
				if d.Allowed != (cmd == "ls") {
					t.Errorf("%s: %+v", cmd, d)
				}
			}
		})
	}
	wg.Wait()
}
