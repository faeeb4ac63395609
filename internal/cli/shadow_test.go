package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/adminclient"
)

// TestPolicyShadowCommand: `policy shadow NAME` reads
// GET /v1/policies/NAME/shadow and prints its scopes and totals as a table,
// or the view as JSON with -o json; a 404 exits non-zero.
func TestPolicyShadowCommand(t *testing.T) {
	view := adminclient.ShadowView{
		Policy: "acme.s",
		Totals: adminclient.ShadowTotals{WouldBlock: 7, WouldAllow: 2, Evaluated: 90},
		ByScope: []adminclient.ShadowScope{
			{Scope: "acme/red/e1", ShadowTotals: adminclient.ShadowTotals{WouldBlock: 7, WouldAllow: 2, Evaluated: 90}},
		},
		Unreachable: []string{"n3"},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/policies/acme.s/shadow" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"policy \"acme.x\": not found"}}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(view)
	}))
	defer srv.Close()

	out, err := runCLI(t, "--server", srv.URL, "policy", "shadow", "acme.s")
	if err != nil {
		t.Fatalf("policy shadow: %v\n%s", err, out)
	}
	for _, want := range []string{"acme/red/e1", "TOTAL", "7", "90", "unreachable nodes", "n3"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, "--server", srv.URL, "-o", "json", "policy", "shadow", "acme.s")
	if err != nil {
		t.Fatalf("policy shadow -o json: %v\n%s", err, out)
	}
	var got adminclient.ShadowView
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if diff := cmp.Diff(view, got); diff != "" {
		t.Errorf("-o json (-want +got):\n%s", diff)
	}
	if out, err := runCLI(t, "--server", srv.URL, "policy", "shadow", "acme.x"); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("policy shadow of an unknown policy: %v\n%s", err, out)
	}
}
