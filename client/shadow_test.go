package client

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func shadow(p Policy) Policy { p.Enforcement = EnforcementShadow; return p }

// TestShadowCounts: shadow policies never decide; each one that applies is
// evaluated alone against the enforced decision and counted.
func TestShadowCounts(t *testing.T) {
	rmrf := map[string]any{"command": "rm -rf /"}
	ls := map[string]any{"command": "ls"}
	tests := []struct {
		name        string
		set         []Policy
		tool        string
		input       map[string]any
		req         *Request // Evaluate instead of IsBlocked
		wantBlocked bool
		want        []ShadowCount
	}{
		{
			name: "no shadow policy",
			set:  []Policy{tp("deny-rm", "Bash", "deny", "no", "rm ")},
			tool: "Bash", input: rmrf, wantBlocked: true,
		},
		{
			name: "would block: shadow denies, enforced allows",
			set:  []Policy{tp("deny-rm", "Bash", "deny", "no", "rm "), shadow(tp("deny-ls", "Bash", "deny", "", "^ls"))},
			tool: "Bash", input: ls,
			want: []ShadowCount{{Policy: "deny-ls", WouldBlock: 1, Evaluated: 1}},
		},
		{
			name: "would allow: shadow allows, enforced denies",
			set:  []Policy{tp("deny-rm", "Bash", "deny", "no", "rm "), shadow(tp("deny-rm-tmp", "Bash", "deny", "", "rm -rf /tmp"))},
			tool: "Bash", input: rmrf, wantBlocked: true,
			want: []ShadowCount{{Policy: "deny-rm-tmp", WouldAllow: 1, Evaluated: 1}},
		},
		{
			name: "both agree to deny",
			set:  []Policy{tp("deny-rm", "Bash", "deny", "no", "rm "), shadow(tp("deny-rm-2", "*", "deny", "", "rm -rf"))},
			tool: "Bash", input: rmrf, wantBlocked: true,
			want: []ShadowCount{{Policy: "deny-rm-2", Evaluated: 1}},
		},
		{
			name: "both agree to allow",
			set:  []Policy{shadow(tp("deny-rm-2", "Bash", "deny", "", "rm -rf"))},
			tool: "Bash", input: ls,
			want: []ShadowCount{{Policy: "deny-rm-2", Evaluated: 1}},
		},
		{
			name: "another tool's shadow policy is not evaluated",
			set:  []Policy{shadow(tp("deny-read", "Read", "deny", ""))},
			tool: "Bash", input: ls,
			want: []ShadowCount{{Policy: "deny-read"}},
		},
		{
			name: "shadow ValidatingPolicy would block",
			set:  []Policy{shadow(vp("only-get", val{`request.method == "GET"`, "GET only", ""}))},
			req:  &Request{Request: map[string]any{"method": "POST"}},
			want: []ShadowCount{{Policy: "only-get", WouldBlock: 1, Evaluated: 1}},
		},
		{
			name:        "shadow ValidatingPolicy would allow",
			set:         []Policy{vp("no-post", val{`request.method != "POST"`, "no POST", ""}), shadow(vp("only-get", val{`request.method != "PUT"`, "no PUT", ""}))},
			req:         &Request{Request: map[string]any{"method": "POST"}},
			wantBlocked: true,
			want:        []ShadowCount{{Policy: "only-get", WouldAllow: 1, Evaluated: 1}},
		},
		{
			name: "shadow ToolPolicy in Evaluate",
			set:  []Policy{shadow(tp("deny-ls", "Bash", "deny", "", "^ls"))},
			req:  &Request{Tool: "Bash", Input: ls},
			want: []ShadowCount{{Policy: "deny-ls", WouldBlock: 1, Evaluated: 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyClient(t, tc.set...)
			var blocked bool
			if tc.req != nil {
				blocked = !c.Evaluate(context.Background(), *tc.req).Allowed
			} else {
				_, blocked = c.IsBlocked(tc.tool, tc.input)
			}
			if blocked != tc.wantBlocked {
				t.Errorf("blocked = %v, want %v (shadow policies must not decide)", blocked, tc.wantBlocked)
			}
			s := c.Stats()
			if diff := cmp.Diff(tc.want, s.Shadow); diff != "" {
				t.Errorf("shadow counts (-want +got):\n%s", diff)
			}
			var wb, wa, ev uint64
			for _, sc := range tc.want {
				wb, wa, ev = wb+sc.WouldBlock, wa+sc.WouldAllow, ev+sc.Evaluated
			}
			if s.ShadowWouldBlock != wb || s.ShadowWouldAllow != wa || s.ShadowEvaluated != ev {
				t.Errorf("totals %d/%d/%d, want %d/%d/%d", s.ShadowWouldBlock, s.ShadowWouldAllow, s.ShadowEvaluated, wb, wa, ev)
			}
		})
	}
}

// TestShadowDeltas: a report carries what was counted since the last one
// that reached a node; one that did not is sent again with the next.
func TestShadowDeltas(t *testing.T) {
	c := readyClient(t, shadow(tp("deny-ls", "Bash", "deny", "", "^ls")))
	ls := map[string]any{"command": "ls"}
	for range 3 {
		c.IsBlocked("Bash", ls)
	}
	d := c.shadowDeltas()
	if diff := cmp.Diff([]ShadowCount{{Policy: "deny-ls", WouldBlock: 3, Evaluated: 3}}, d); diff != "" {
		t.Fatalf("first deltas (-want +got):\n%s", diff)
	}
	c.IsBlocked("Bash", ls)
	// d was not delivered: the next deltas hold it too.
	if diff := cmp.Diff([]ShadowCount{{Policy: "deny-ls", WouldBlock: 4, Evaluated: 4}}, c.shadowDeltas()); diff != "" {
		t.Fatalf("deltas after a failed report (-want +got):\n%s", diff)
	}
	// A new spec of the policy keeps counting where the old one was.
	if err := c.install([]Policy{shadow(tp("deny-ls", "Bash", "deny", "", "^ls "))}, "v1b", 0, true, "test"); err != nil {
		t.Fatal(err)
	}
	c.IsBlocked("Bash", map[string]any{"command": "ls -l"})
	if diff := cmp.Diff([]ShadowCount{{Policy: "deny-ls", WouldBlock: 5, Evaluated: 5}}, c.shadowDeltas()); diff != "" {
		t.Fatalf("deltas after a new spec (-want +got):\n%s", diff)
	}
	c.shadowReported(c.shadowDeltas())
	if d := c.shadowDeltas(); d != nil {
		t.Errorf("deltas after a report = %v, want none", d)
	}
	// A policy that went is forgotten once reported.
	if err := c.install(nil, "v2", 0, true, "test"); err != nil {
		t.Fatal(err)
	}
	c.shadowReported(nil)
	if s := c.Stats(); len(s.Shadow) != 0 {
		t.Errorf("counters of a reported, removed policy kept: %v", s.Shadow)
	}
}
