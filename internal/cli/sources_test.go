package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/policyd/policyd/adminclient"
)

// TestSourcesCommand: status asks a follower, then the leader it names for
// the reconcilers' status, and prints the refusal; sync posts the request
// with --allow-prune.
func TestSourcesCommand(t *testing.T) {
	var got []string
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, "leader "+r.Method+" "+r.URL.Path)
		_ = json.NewEncoder(w).Encode(adminclient.SourceList{Sources: []adminclient.Source{{
			Name: "git:policies", Policies: 3, SyncedRevision: "0123456789abcdef", Owned: []string{"a", "b", "c"},
			Reconciler: &adminclient.SourceReconciler{Running: true, LastResult: "prune_refused", LastError: "sync would delete 3 of the 3",
				PruneRefused: &adminclient.SourcePruneRefusal{Deletes: 3, Owned: 3, MaxRatio: 0.5}},
		}}})
	}))
	defer leader.Close()
	follower := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, "follower "+r.Method+" "+r.URL.RequestURI())
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusAccepted)
			_ = json.NewEncoder(w).Encode(adminclient.SyncRequested{Source: "git:policies", RequestIndex: 42, AllowPrune: true})
			return
		}
		_ = json.NewEncoder(w).Encode(adminclient.SourceList{Leader: strings.TrimPrefix(leader.URL, "http://"),
			Sources: []adminclient.Source{{Name: "git:policies", Policies: 3}}})
	}))
	defer follower.Close()

	out, err := runCLI(t, "--server", follower.URL, "sources", "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"git:policies", "prune_refused", "prune refused: 3 of 3 policies", "0123456789ab"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	if want := []string{"follower GET /v1/sources", "leader GET /v1/sources"}; strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("requests %q, want %q", got, want)
	}
	got = nil
	out, err = runCLI(t, "--server", follower.URL, "sources", "sync", "git:policies", "--allow-prune")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "requested at index 42") || len(got) != 1 || got[0] != "follower POST /v1/sources/git:policies/sync?allow_prune=true" {
		t.Errorf("sync: %q, requests %q", out, got)
	}
}
