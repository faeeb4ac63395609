package client

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
)

// tp builds a ToolPolicy.
func tp(name, tool, action, reason string, patterns ...string) Policy {
	spec := map[string]any{"tool_name": tool, "action": action, "reason": reason}
	if patterns != nil {
		spec["conditions"] = map[string]any{"patterns": patterns}
	}
	b, _ := json.Marshal(spec)
	return Policy{Name: name, Kind: KindToolPolicy, Spec: b, Revision: 1}
}

// readyClient is a client holding set, in state ready, without a server.
func readyClient(t *testing.T, set ...Policy) *Client {
	t.Helper()
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.install(sortByName(set), "v1", 0, true, "test"); err != nil {
		t.Fatal(err)
	}
	c.synced()
	return c
}

type deepInput struct{ Cmd string }

func TestIsBlockedToolPolicySemantics(t *testing.T) {
	shell := map[string]any{"command": "rm -rf /tmp/x"}
	nested := map[string]any{"args": []any{"-c", map[string]any{"script": []string{"echo hi", "rm -rf /"}}}}
	tests := []struct {
		name       string
		set        []Policy
		tool       string
		input      map[string]any
		wantBlock  bool
		wantReason string
	}{
		{"no policies", nil, "Bash", shell, false, ""},
		{"deny without patterns blocks the tool", []Policy{tp("a", "Bash", "deny", "no shell")}, "Bash", nil, true, "no shell"},
		{"deny for another tool", []Policy{tp("a", "Write", "deny", "no writes")}, "Bash", shell, false, ""},
		{"tool names are case sensitive", []Policy{tp("a", "bash", "deny", "x")}, "Bash", shell, false, ""},
		{"wildcard tool", []Policy{tp("a", "*", "deny", "nothing runs")}, "Anything", nil, true, "nothing runs"},
		{"pattern matches a leaf", []Policy{tp("a", "Bash", "deny", "rm", "rm -rf")}, "Bash", shell, true, "rm"},
		{"pattern does not match", []Policy{tp("a", "Bash", "deny", "rm", "^sudo ")}, "Bash", shell, false, ""},
		{"patterns are unanchored RE2", []Policy{tp("a", "Bash", "deny", "tmp", `/tmp/\w+$`)}, "Bash", shell, true, "tmp"},
		{"any pattern suffices", []Policy{tp("a", "Bash", "deny", "r", "^sudo", "rm")}, "Bash", shell, true, "r"},
		{"nested leaves in slices and maps", []Policy{tp("a", "Bash", "deny", "deep", `rm -rf /$`)}, "Bash", nested, true, "deep"},
		{"map keys are not inspected", []Policy{tp("a", "Bash", "deny", "k", "command")}, "Bash", shell, false, ""},
		{"numbers are not inspected", []Policy{tp("a", "Bash", "deny", "n", "42")}, "Bash", map[string]any{"n": 42.0}, false, ""},
		{"pointer leaves are inspected", []Policy{tp("a", "Bash", "deny", "p", "secret")}, "Bash", map[string]any{"p": &[]string{"a secret"}}, true, "p"},
		{"struct fields are not inspected", []Policy{tp("a", "Bash", "deny", "s", "secret")}, "Bash", map[string]any{"s": deepInput{Cmd: "secret"}}, false, ""},
		{"deny wins over allow", []Policy{tp("a-allow", "Bash", "allow", ""), tp("b-deny", "Bash", "deny", "denied")}, "Bash", shell, true, "denied"},
		{"allow alone does not block", []Policy{tp("a", "Bash", "allow", "")}, "Bash", shell, false, ""},
		{"audit does not block", []Policy{tp("a", "Bash", "audit", "watched", "rm")}, "Bash", shell, false, ""},
		{"deny wins over audit", []Policy{tp("a", "Bash", "audit", ""), tp("b", "Bash", "deny", "no")}, "Bash", shell, true, "no"},
		{"first deny by name gives the reason", []Policy{tp("z", "Bash", "deny", "from z"), tp("m", "*", "deny", "from m")}, "Bash", shell, true, "from m"},
		{"wildcard deny applies to a tool with its own rules", []Policy{tp("a", "Bash", "audit", ""), tp("b", "*", "deny", "all")}, "Bash", nil, true, "all"},
		{"empty reason names the policy", []Policy{tp("acme.deny", "Bash", "deny", "")}, "Bash", nil, true, "blocked by policy acme.deny"},
		{"other kinds never block", []Policy{{Name: "v", Kind: "ValidatingPolicy", Spec: json.RawMessage(`{"validations":[{"expression":"false","message":"m"}]}`)}}, "Bash", shell, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t, tc.set...)
			reason, blocked := c.IsBlocked(tc.tool, tc.input)
			if blocked != tc.wantBlock || reason != tc.wantReason {
				t.Fatalf("IsBlocked(%q) = (%q, %v), want (%q, %v)", tc.tool, reason, blocked, tc.wantReason, tc.wantBlock)
			}
		})
	}
}

// TestIsBlockedTooDeepFailsClosed: input nested deeper than the walk goes
// matches every pattern, so nesting cannot hide a string from a deny.
func TestIsBlockedTooDeepFailsClosed(t *testing.T) {
	c := readyClient(t, tp("a", "Bash", "deny", "deep", "never-present"))
	var v any = "leaf"
	for range maxInputDepth + 5 {
		v = []any{v}
	}
	if _, blocked := c.IsBlocked("Bash", map[string]any{"x": v}); !blocked {
		t.Fatal("input deeper than the walk was not blocked")
	}
	if _, blocked := c.IsBlocked("Bash", map[string]any{"x": []any{[]any{"leaf"}}}); blocked {
		t.Fatal("shallow input without a match was blocked")
	}
}

// TestInvalidToolPolicyRejectsTheSet: a bad pattern, action or spec makes
// the whole set fail to apply, and the previous one stays.
func TestInvalidToolPolicyRejectsTheSet(t *testing.T) {
	tests := []struct {
		name    string
		p       Policy
		mention string
	}{
		{"bad pattern", tp("bad", "Bash", "deny", "", "a(b"), "patterns[0]"},
		{"unknown action", tp("bad", "Bash", "block", ""), `"block"`},
		{"no tool name", tp("bad", "", "deny", ""), "tool_name"},
		{"spec not an object", Policy{Name: "bad", Kind: KindToolPolicy, Spec: json.RawMessage(`[1]`)}, "spec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t, tp("good", "Bash", "deny", "kept"))
			err := c.install([]Policy{tc.p}, "v2", 0, true, "test")
			if err == nil || !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), "bad") {
				t.Fatalf("install = %v, want an error naming the policy and mentioning %q", err, tc.mention)
			}
			if got, want := c.Version(), "v1"; got != want {
				t.Fatalf("version = %q, want %q", got, want)
			}
			if reason, blocked := c.IsBlocked("Bash", nil); !blocked || reason != "kept" {
				t.Fatalf("previous set not in force: (%q, %v)", reason, blocked)
			}
			if got := c.Stats().Rejected; got != 1 {
				t.Fatalf("rejected = %d, want 1", got)
			}
		})
	}
}

// TestRulesCompiledOncePerSpec: applying a set reuses the compiled rules of
// unchanged policies, recompiles changed ones, returns the previous rules
// when nothing a rule is made of changed, and decides exactly as a compile
// from scratch.
func TestRulesCompiledOncePerSpec(t *testing.T) {
	a, b, c := tp("a", "Bash", "deny", "a", "x"), tp("b", "Write", "deny", "b", "y"), tp("c", "*", "audit", "c")
	b2 := tp("b", "Write", "deny", "b2", "y")
	cfg := Policy{Name: "bb", Kind: "Config", Spec: json.RawMessage(`{}`)}
	cfg2 := Policy{Name: "bb", Kind: "Config", Spec: json.RawMessage(`{"x":1}`)}
	tests := []struct {
		name       string
		prev, next []Policy
		reused     []string // rules that must be the previous compile's
		recompiled []string // rules that must be new
		samePrev   bool     // the previous rules themselves come back
	}{
		{name: "unchanged", prev: []Policy{a, b}, next: []Policy{a, b}, reused: []string{"a", "b"}, samePrev: true},
		{name: "one spec changed", prev: []Policy{a, b}, next: []Policy{a, b2}, reused: []string{"a"}, recompiled: []string{"b"}},
		{name: "first removed", prev: []Policy{a, b, c}, next: []Policy{b, c}, reused: []string{"b", "c"}},
		{name: "middle added", prev: []Policy{a, c}, next: []Policy{a, b, c}, reused: []string{"a", "c"}, recompiled: []string{"b"}},
		{name: "last removed", prev: []Policy{a, b, c}, next: []Policy{a, b}, reused: []string{"a", "b"}},
		{name: "only another kind changed", prev: []Policy{a, cfg, b}, next: []Policy{a, cfg2, b}, reused: []string{"a", "b"}, samePrev: true},
		{name: "out of order", prev: []Policy{a, b, c}, next: []Policy{c, b2, a}, reused: []string{"c"}, recompiled: []string{"b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs1, err := compileRules(tc.prev, nil)
			if err != nil {
				t.Fatal(err)
			}
			rs2, err := compileRules(tc.next, rs1)
			if err != nil {
				t.Fatal(err)
			}
			if (rs2 == rs1) != tc.samePrev {
				t.Errorf("previous rules returned: %v, want %v", rs2 == rs1, tc.samePrev)
			}
			for _, n := range tc.reused {
				if r := ruleNamed(rs2, n); r == nil || r != ruleNamed(rs1, n) {
					t.Errorf("unchanged policy %s was not reused", n)
				}
			}
			for _, n := range tc.recompiled {
				if r := ruleNamed(rs2, n); r == nil || r == ruleNamed(rs1, n) {
					t.Errorf("policy %s was not compiled anew", n)
				}
			}
			fresh, err := compileRules(tc.next, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := describeRules(rs2), describeRules(fresh); got != want {
				t.Errorf("rules after reuse:\n%s\nfrom scratch:\n%s", got, want)
			}
		})
	}
}

// describeRules renders what a rule set decides with: per tool, the deny
// and audit rules in order, with their reasons.
func describeRules(rs *ruleSet) string {
	var sb strings.Builder
	line := func(tool string, tr *toolRules) {
		sb.WriteString(tool + ":")
		for _, r := range tr.deny {
			sb.WriteString(" deny " + r.name + "=" + r.reason)
		}
		for _, r := range tr.audit {
			sb.WriteString(" audit " + r.name + "=" + r.reason)
		}
		sb.WriteString("\n")
	}
	tools := slices.Sorted(maps.Keys(rs.byTool))
	for _, tool := range tools {
		line(tool, rs.byTool[tool])
	}
	line("(any other)", &rs.wildcard)
	return sb.String()
}

// ruleNamed is the rule compiled for the policy named name, or nil.
func ruleNamed(rs *ruleSet, name string) *rule {
	for _, r := range rs.rules {
		if r.name == name {
			return r
		}
	}
	return nil
}

func TestShouldBlockAllWhileConnecting(t *testing.T) {
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.State(); got != StateConnecting {
		t.Fatalf("initial state %s", got)
	}
	if !c.ShouldBlockAll() {
		t.Fatal("a connecting client does not block all")
	}
	if reason, blocked := c.IsBlocked("Read", nil); !blocked || reason != ReasonConnecting {
		t.Fatalf("IsBlocked = (%q, %v)", reason, blocked)
	}
}

func BenchmarkIsBlocked(b *testing.B) {
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	set := []Policy{tp("a", "Bash", "deny", "rm", `rm\s+-rf`, `^sudo\b`), tp("b", "Write", "deny", "etc", "^/etc/"), tp("c", "*", "audit", "")}
	if err := c.install(sortByName(set), "v", 0, true, ""); err != nil {
		b.Fatal(err)
	}
	c.synced()
	in := map[string]any{"command": "ls -la /home/user", "cwd": "/home/user"}
	b.ReportAllocs()
	for b.Loop() {
		if _, blocked := c.IsBlocked("Bash", in); blocked {
			b.Fatal("blocked")
		}
	}
}

// TestAuditIsLogged: a matching audit policy is logged with the policy and
// the tool; a non-matching one, or a call that a deny blocks, is not.
func TestAuditIsLogged(t *testing.T) {
	var buf bytes.Buffer
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	set := []Policy{tp("audit-curl", "Bash", "audit", "curl watched", "curl"), tp("deny-rm", "Bash", "deny", "no rm", "rm ")}
	if err := c.install(sortByName(set), "v", 0, true, ""); err != nil {
		t.Fatal(err)
	}
	c.synced()
	logged := func() bool { return strings.Contains(buf.String(), "policy=audit-curl tool=Bash") }
	if _, blocked := c.IsBlocked("Bash", map[string]any{"command": "ls"}); blocked || logged() {
		t.Fatalf("ls: blocked %v, logged %v", blocked, logged())
	}
	if _, blocked := c.IsBlocked("Bash", map[string]any{"command": "rm x; curl y"}); !blocked || logged() {
		t.Fatalf("denied call: blocked %v, audit logged %v", blocked, logged())
	}
	if _, blocked := c.IsBlocked("Bash", map[string]any{"command": "curl example.com"}); blocked || !logged() {
		t.Fatalf("curl: blocked %v, logged %v:\n%s", blocked, logged(), buf.String())
	}
}
