package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/policyd/policyd/client"
)

// TestWatchServersFromEnv: POLICYD_WATCH_SERVERS is the default of
// --servers.
func TestWatchServersFromEnv(t *testing.T) {
	t.Setenv("POLICYD_WATCH_SERVERS", " a:1 , b:2 ")
	if got := fmt.Sprint(envList("POLICYD_WATCH_SERVERS")); got != "[a:1 b:2]" {
		t.Fatalf("envList = %s", got)
	}
}

// TestWatchPrinterFormats: each --output form of a state change.
func TestWatchPrinterFormats(t *testing.T) {
	tests := []struct {
		format string
		want   []string // in the output, in order
	}{
		{"text", []string{"state connecting -> current"}},
		{"json", []string{`{"event":"state",`, `"from":"connecting","to":"current"}`}},
		{"yaml", []string{"---\n", "event: state\n", "from: connecting\n", "to: current\n"}},
	}
	for _, tc := range tests {
		t.Run(tc.format, func(t *testing.T) {
			var b strings.Builder
			p := &watchPrinter{w: &b, format: tc.format}
			p.state("connecting", "current")
			out := b.String()
			for _, w := range tc.want {
				i := strings.Index(out, w)
				if i < 0 {
					t.Fatalf("output %q lacks %q", b.String(), w)
				}
				out = out[i+len(w):]
			}
		})
	}
}

// TestWatchMarksShadowPolicies: update lines mark shadow policies:
// name(shadow) in text, a "shadow" list in json.
func TestWatchMarksShadowPolicies(t *testing.T) {
	u := client.Update{Version: "v9", Server: "n1", Policies: []client.Policy{
		{Name: "acme.enforced"}, {Name: "acme.shadow", Enforcement: client.EnforcementShadow},
	}}
	var text, js strings.Builder
	(&watchPrinter{w: &text, format: "text"}).update(u)
	(&watchPrinter{w: &js, format: "json"}).update(u)
	if !strings.Contains(text.String(), "policies=acme.enforced,acme.shadow(shadow) ") {
		t.Errorf("text line %q does not mark the shadow policy", text.String())
	}
	var ev updateEvent
	if err := json.Unmarshal([]byte(js.String()), &ev); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ev.Policies, []string{"acme.enforced", "acme.shadow"}) || !slices.Equal(ev.Shadow, []string{"acme.shadow"}) {
		t.Errorf("json line policies %v shadow %v", ev.Policies, ev.Shadow)
	}
	js.Reset()
	(&watchPrinter{w: &js, format: "json"}).update(client.Update{Policies: []client.Policy{{Name: "a"}}})
	if strings.Contains(js.String(), `"shadow"`) {
		t.Errorf("json line without shadow policies has a shadow list: %s", js.String())
	}
}
