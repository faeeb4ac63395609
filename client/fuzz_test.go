package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// Run longer with:
//
//	go test ./client/ -run '^$' -fuzz '^FuzzFeedMessage$' -fuzztime 60s
//	go test ./client/ -run '^$' -fuzz '^FuzzToolPolicy$' -fuzztime 60s

// maxFuzzFrames bounds the frames of one FuzzFeedMessage input.
const maxFuzzFrames = 32

// FuzzFeedMessage feeds a sequence of frames (one per line) to a client the
// way a WebSocket session does: decodeFeedMessage, then applyFeed, with an
// error ending the session as Run does (lost, then a reconnect that resumes
// when it can) and a revocation ending it for good. Nothing may panic, and
// after every frame the client's invariants hold (checkClient).
func FuzzFeedMessage(f *testing.F) {
	deny := `{"name":"deny-rm","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"deny","reason":"no rm","conditions":{"patterns":["rm -rf"]}},"revision":3}`
	denyAll := `{"name":"b-deny-all","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Write","action":"deny"},"revision":1}`
	wild := `{"name":"a-wild","kind":"ToolPolicy","scope":{},"spec":{"tool_name":"*","action":"audit","conditions":{"patterns":["secret"]}},"revision":1}`
	other := `{"name":"v","kind":"ValidatingPolicy","scope":{"org":"acme"},"labels":{"tier":"prod"},"spec":{"validations":[{"expression":"request.method == 'GET'","message":"only GET"}]},"revision":2}`
	when := `{"name":"w","kind":"ValidatingPolicy","scope":{"org":"acme"},"spec":{"matchConditions":[{"name":"http","expression":"has(request.method)"}],"validations":[{"expression":"request.method == 'GET'","message":"only GET"}]},"revision":4}`
	bad := `{"name":"bad","kind":"ToolPolicy","scope":{},"spec":{"tool_name":"Bash","action":"deny","conditions":{"patterns":["("]}},"revision":1}`
	init := `{"type":"init","policies":[` + deny + `,` + wild + `,` + other + `],"version":10,"digest":"d1"}`
	for _, frames := range [][]string{
		{init},
		{init, `{"type":"upsert","policy":` + denyAll + `,"version":11,"digest":"d2"}`, `{"type":"delete","policy_name":"deny-rm","version":12,"digest":"d3"}`},
		{init, `{"type":"upsert","policy":` + when + `,"version":11,"digest":"d2"}`, `{"type":"upsert","policy":` + strings.Replace(when, "has(", "has", 1) + `,"version":12}`},
		{init, `{"type":"ping"}`, `{"type":"revoke","reason":"employee deactivated"}`, `{"type":"init","policies":[],"version":20,"digest":"d9"}`},
		{init, `{"type":"init","policies":[` + deny + `],"version":11,"digest":"d1"}`},
		{init, `{"type":"upsert","policy":` + bad + `,"version":11}`, `{"type":"upsert","policy":` + denyAll + `,"version":11}`},
		{init, `{"type":"upsert","version":11,"digest":"d2"}`, `{"type":"delete","policy_name":"missing","version":3}`},
		{init, `{"type":"delete","policy_name":"deny-rm","version":0}`, `{"type":"upsert","policy":` + deny + `,"version":18446744073709551615}`},
		{`{"type":"init","policies":[` + deny + `,` + deny + `,` + denyAll + `],"version":1,"digest":"dup"}`},
		{`{"type":"init","policies":[` + bad + `],"version":1,"digest":"x"}`, init},
		{`{"type":"upsert","policy":` + deny + `,"version":1}`, `{"type":"delete","policy_name":"x"}`},
		{init, `{"type":"future","extra":true}`, `{"type":"init","policies":null}`},
		{init, `not json`, `{"type":"init","policies":{}}`, `{"type":"upsert","policy":{"spec":"x"}}`},
		{`{"type":"init","policies":[{"name":"","kind":"ToolPolicy","spec":null}]}`},
		{`{"type":"init","policies":[{"name":"n","kind":"ToolPolicy","spec":{"tool_name":"","action":"deny"}}],"version":-1}`},
		{"\xff\x00", `[]`, `null`, `{"type":1}`, `{"type":"revoke"}`},
		{""},
	} {
		f.Add([]byte(strings.Join(frames, "\n")))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := New(Config{Servers: []string{"127.0.0.1:1"}, Transport: TransportWS, Employee: "alice", Clock: newFakeClock()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		frames := bytes.Split(data, []byte("\n"))
		if len(frames) > maxFuzzFrames {
			frames = frames[:maxFuzzFrames]
		}
		for _, frame := range frames {
			done, err := feedFrame(c, frame)
			var re *revokedError
			switch {
			case errors.As(err, &re):
				_ = c.revoke(re.reason)
			case err != nil:
				// The session ends and the next one starts, resuming
				// when it can, as Run and session do.
				c.lost()
				if _, _, index, has := c.snapshot(); has && index > 0 {
					c.synced()
				}
			case done:
				c.synced()
			}
			checkClient(t, c)
			if c.State() == StateRevoked {
				return // Run has returned
			}
		}
	})
}

// feedFrame is what a session does with one text frame, minus the socket:
// a ping is answered by handle and changes nothing.
func feedFrame(c *Client, frame []byte) (synced bool, err error) {
	m, err := decodeFeedMessage(frame)
	if err != nil {
		return false, err
	}
	if m.Type == feedv1.TypePing {
		return false, nil
	}
	return c.applyFeed(&m, "fuzz")
}

// checkClient checks the client's invariants: the set in force is sorted by
// name without duplicates, the compiled rules agree with it, the state is
// one the client can be in without Run's clock or stop (never stopped,
// grace never over), blocking follows the state, and ready means a set is
// held.
func checkClient(t *testing.T, c *Client) {
	t.Helper()
	ps := c.Policies()
	for i := 1; i < len(ps); i++ {
		if ps[i-1].Name >= ps[i].Name {
			t.Fatalf("Policies() not sorted by unique name: %q then %q", ps[i-1].Name, ps[i].Name)
		}
	}
	state, block := c.State(), c.ShouldBlockAll()
	switch state {
	case StateConnecting, StateRevoked:
		if !block {
			t.Fatalf("state %s does not block all", state)
		}
	case StateReady, StateDisconnected:
		if block {
			t.Fatalf("state %s blocks all (grace never elapsed, never stopped)", state)
		}
	default:
		t.Fatalf("unknown state %q", state)
	}
	if _, _, _, has := c.snapshot(); state == StateReady && !has {
		t.Fatal("ready without a set")
	}
	if block {
		if reason, blocked := c.IsBlocked("Bash", nil); !blocked || reason == "" {
			t.Fatalf("state %s: IsBlocked = (%q, %v), want blocked with a reason", state, reason, blocked)
		}
		return
	}
	for _, p := range ps {
		if p.Kind != KindToolPolicy {
			continue
		}
		var s toolSpec
		if err := json.Unmarshal(p.Spec, &s); err != nil {
			t.Fatalf("policy %q in force with a spec that does not decode: %v", p.Name, err)
		}
		input := map[string]any{"command": "rm -rf /", "args": []any{"secret", 1.0}}
		reason, blocked := c.IsBlocked(s.ToolName, input)
		if s.Action == ActionDeny && len(s.Conditions.Patterns) == 0 && (!blocked || reason == "") {
			t.Fatalf("policy %q denies %q without patterns, but IsBlocked = (%q, %v)", p.Name, s.ToolName, reason, blocked)
		}
	}
}

// FuzzToolPolicy compiles a fuzzed ToolPolicy spec (next to a fixed
// wildcard audit policy, so that merging is exercised) and asks IsBlocked
// about a fuzzed tool with the fuzzed input as a leaf: nothing panics, a
// compile error leaves no rules, recompiling against the previous rules
// decides the same, and the decision is the documented one (checked
// against a direct reading of the spec).
func FuzzToolPolicy(f *testing.F) {
	for _, s := range []struct{ spec, tool, input string }{
		{`{"tool_name":"Bash","action":"deny","reason":"no shell"}`, "Bash", "ls"},
		{`{"tool_name":"Bash","action":"deny","reason":"no rm","conditions":{"patterns":["rm -rf","^sudo "]}}`, "Bash", "rm -rf /"},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["rm -rf"]}}`, "Bash", "ls -la"},
		{`{"tool_name":"*","action":"deny","reason":"nothing runs"}`, "Anything", ""},
		{`{"tool_name":"bash","action":"deny"}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"audit","conditions":{"patterns":["."]}}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"allow"}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"DENY"}`, "Bash", "x"},
		{`{"tool_name":"","action":"deny"}`, "", "x"},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["("]}}`, "Bash", "("},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["x{1001}"]}}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":[]}}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":null}}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":[1]}}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"deny","conditions":"x"}`, "Bash", "x"},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["(?i)SECRET\\b"]}}`, "Bash", "a secret!"},
		{`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["\\xff"]}}`, "Bash", "\xff"},
		{`[]`, "Bash", "x"},
		{`null`, "Bash", "x"},
		{``, "Bash", "x"},
		{"\xff", "\xff", "\xff"},
	} {
		f.Add(s.spec, s.tool, s.input)
	}
	audit := Policy{Name: "a-audit", Kind: KindToolPolicy, Spec: json.RawMessage(`{"tool_name":"*","action":"audit","conditions":{"patterns":["x"]}}`)}
	f.Fuzz(func(t *testing.T, spec, tool, input string) {
		set := []Policy{audit, {Name: "p", Kind: KindToolPolicy, Spec: json.RawMessage(spec)}}
		rs, err := compileRules(set, nil)
		if err != nil {
			if rs != nil {
				t.Fatalf("compileRules returned rules with its error %v", err)
			}
			return
		}
		// Compiled, so the spec decodes and its patterns compile.
		var s toolSpec
		if err := json.Unmarshal([]byte(spec), &s); err != nil {
			t.Fatalf("compiled a spec that does not decode: %v", err)
		}
		want, wantReason := false, ""
		if s.Action == ActionDeny && (s.ToolName == tool || s.ToolName == WildcardTool) {
			want = len(s.Conditions.Patterns) == 0
			for _, pat := range s.Conditions.Patterns {
				want = want || regexp.MustCompile(pat).MatchString(input)
			}
			wantReason = s.Reason
			if wantReason == "" {
				wantReason = "blocked by policy p"
			}
		}
		if !want {
			wantReason = ""
		}

		c := fuzzReadyClient(t)
		input2 := map[string]any{"leaf": input, "nested": []any{map[string]any{"k": input}, 42.0, nil}}
		// Twice: the second install reuses the rules the first compiled.
		for range 2 {
			if err := c.install(set, "v", 0, true, "fuzz"); err != nil {
				t.Fatalf("install of a set that compiles: %v", err)
			}
			reason, blocked := c.IsBlocked(tool, map[string]any{"leaf": input})
			if blocked != want || reason != wantReason {
				t.Fatalf("spec %s, tool %q, input %q: IsBlocked = (%q, %v), want (%q, %v)", spec, tool, input, reason, blocked, wantReason, want)
			}
			if reason2, blocked2 := c.IsBlocked(tool, input2); reason2 != reason || blocked2 != blocked {
				t.Fatalf("nested input decided (%q, %v), flat (%q, %v)", reason2, blocked2, reason, blocked)
			}
		}
		// An unchanged set is not compiled again.
		if rs2, err := compileRules(set, rs); err != nil || rs2 != rs {
			t.Fatalf("recompiling an unchanged set: err %v, or the rule was not reused", err)
		}
	})
}

// fuzzReadyClient is a ready client without a server or a log.
func fuzzReadyClient(t *testing.T) *Client {
	t.Helper()
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}, Grace: time.Minute, Clock: newFakeClock()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.install(nil, "v0", 0, true, "fuzz"); err != nil {
		t.Fatal(err)
	}
	c.synced()
	return c
}
