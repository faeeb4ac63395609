package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/adminclient"
)

// rolloutAPI is a canned admin API for the staged rollout commands: it
// records each request and answers GET /v1/rollouts/{id} from states, one
// per call (the last repeats).
type rolloutAPI struct {
	mu       sync.Mutex
	requests []string
	bodies   [][]byte
	states   []string
}

func (a *rolloutAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.requests = append(a.requests, r.Method+" "+r.URL.RequestURI())
	a.bodies = append(a.bodies, body)
	state := "running"
	if len(a.states) > 0 {
		state = a.states[0]
		if len(a.states) > 1 {
			a.states = a.states[1:]
		}
	}
	a.mu.Unlock()
	ro := adminclient.StagedRollout{ID: "r5", State: state, Stages: []adminclient.StagedRolloutStage{{Percent: 5, Bake: "2m0s"}, {Percent: 100, Bake: "2m0s"}},
		Changes: []adminclient.StagedChange{{Op: "put", Policy: &adminclient.Policy{Name: "acme.p"}}, {Op: "delete", Name: "acme.old"}}}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/rollouts":
		_ = json.NewEncoder(w).Encode(adminclient.StagedRolloutList{Rollouts: []adminclient.StagedRollout{ro}})
	case r.Method == http.MethodGet:
		if state == "rolled_back" {
			ro.HaltReason = "nack ratio 0.50 > 0.01 at stage 0 (5%)"
		}
		ro.Status = &adminclient.StagedRolloutStatus{Cohort: adminclient.RolloutCohort{Size: 4, Acked: 2, Nacked: 2}}
		_ = json.NewEncoder(w).Encode(ro)
	case r.URL.Path == "/v1/rollouts":
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(ro)
	default:
		_ = json.NewEncoder(w).Encode(ro)
	}
}

// set replaces the states to answer and forgets the requests.
func (a *rolloutAPI) set(states ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.states, a.requests, a.bodies = states, nil, nil
}

// seen is the requests so far and their bodies.
func (a *rolloutAPI) seen() (string, [][]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.requests, ";"), a.bodies
}

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := Run(t.Context(), args, &stdout, &stderr)
	return stdout.String() + stderr.String(), err
}

func TestRolloutStartCommand(t *testing.T) {
	api := &rolloutAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "changes.yaml")
	changes := `name: acme.p
kind: ToolPolicy
scope: {org: acme}
spec: {tool_name: Bash, action: deny}
---
delete: acme.old
`
	if err := os.WriteFile(path, []byte(changes), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "--server", srv.URL, "rollout", "start", "-f", path, "--stages", "5%,25%:10m,100%", "--bake", "2m",
		"--max-nack-ratio", "0.01", "--on-halt", "stay")
	if err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	if !strings.Contains(out, "r5") || !strings.Contains(out, "acme.p,-acme.old") {
		t.Errorf("start printed:\n%s", out)
	}
	reqs, bodies := api.seen()
	if want := "POST /v1/rollouts"; reqs != want {
		t.Fatalf("requests %s, want %s", reqs, want)
	}
	var got, want any
	if err := json.Unmarshal(bodies[0], &got); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal([]byte(`{"changes":[
		{"op":"put","policy":{"name":"acme.p","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"deny"}}},
		{"op":"delete","name":"acme.old"}],
		"stages":[{"percent":5,"bake":"2m0s"},{"percent":25,"bake":"10m0s"},{"percent":100,"bake":"2m0s"}],
		"max_nack_ratio":0.01,"on_halt":"stay"}`), &want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request body (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no file", []string{"rollout", "start", "--stages", "100%"}},
		{"bad percent", []string{"rollout", "start", "-f", path, "--stages", "5x,100%"}},
		{"bad bake", []string{"rollout", "start", "-f", path, "--stages", "5%:soon,100%"}},
		{"wait without id", []string{"rollout", "status", "--wait"}},
		{"action without id", []string{"rollout", "pause"}},
		{"unknown subcommand", []string{"rollout", "launch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runCLI(t, append([]string{"--server", srv.URL}, tc.args...)...)
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Errorf("%v: %v, want a usage error", tc.args, err)
			}
		})
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("delete: acme.x\nname: y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, "--server", srv.URL, "rollout", "start", "-f", bad); err == nil || !strings.Contains(err.Error(), "{delete: NAME} alone") {
		t.Errorf("a delete with other keys: %v\n%s", err, out)
	}
}

func TestRolloutStatusCommand(t *testing.T) {
	api := &rolloutAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	out, err := runCLI(t, "--server", srv.URL, "rollout", "status")
	if err != nil || !strings.Contains(out, "r5") || !strings.Contains(out, "5%") {
		t.Fatalf("status list: %v\n%s", err, out)
	}
	out, err = runCLI(t, "--server", srv.URL, "rollout", "status", "r5")
	if err != nil || !strings.Contains(out, "cohort: 4 discovery sidecars (acked 2, nacked 2") {
		t.Fatalf("status r5: %v\n%s", err, out)
	}

	api.set("running", "rolled_back")
	out, err = runCLI(t, "--server", srv.URL, "rollout", "status", "r5", "--wait")
	if !errors.Is(err, errRolloutFailed) || !strings.Contains(out, "nack ratio 0.50") {
		t.Fatalf("status --wait of a rollout that rolls back: %v\n%s", err, out)
	}
	api.set("paused", "completed")
	if out, err = runCLI(t, "--server", srv.URL, "-o", "json", "rollout", "status", "r5", "--wait"); err != nil {
		t.Fatalf("status --wait of a rollout that completes: %v\n%s", err, out)
	}
	var ro adminclient.StagedRollout
	if err := json.Unmarshal([]byte(out), &ro); err != nil || ro.State != "completed" {
		t.Fatalf("-o json: %v\n%s", err, out)
	}

	api.set()
	for _, action := range []string{"pause", "resume", "promote", "abort"} {
		if out, err := runCLI(t, "--server", srv.URL, "rollout", action, "r5"); err != nil {
			t.Fatalf("%s: %v\n%s", action, err, out)
		}
	}
	want := "POST /v1/rollouts/r5/pause;POST /v1/rollouts/r5/resume;POST /v1/rollouts/r5/promote;POST /v1/rollouts/r5/abort"
	if got, _ := api.seen(); got != want {
		t.Errorf("requests %s, want %s", got, want)
	}
}

// TestRolloutExitCode: rollout fails while a NACK is pending or clients
// have not answered, against canned answers of the API.
func TestRolloutExitCode(t *testing.T) {
	tests := []struct {
		name   string
		answer adminclient.ProxyStatus
		fail   string
	}{
		{"all acked", adminclient.ProxyStatus{Done: true, Versions: []adminclient.ProxyStatusVersion{{Version: "v1", Done: true, Acked: []adminclient.ClientRef{{Client: "a"}}}}}, ""},
		{"nack", adminclient.ProxyStatus{Done: true, Versions: []adminclient.ProxyStatusVersion{{Version: "v1", Done: true, Nacked: []adminclient.NackRef{{ClientRef: adminclient.ClientRef{Client: "a"}, Message: "bad"}}}}}, "1 NACK(s) pending"},
		{"pending", adminclient.ProxyStatus{Versions: []adminclient.ProxyStatusVersion{{Version: "v1", Pending: []adminclient.ClientRef{{Client: "a"}}}}}, "1 client(s) have not answered"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/rollout" || r.URL.Query().Get("wait") != "2s" {
					http.NotFound(w, r)
					return
				}
				_ = json.NewEncoder(w).Encode(tc.answer)
			}))
			defer srv.Close()
			var stdout, stderr bytes.Buffer
			err := Run(t.Context(), []string{"--server", srv.URL, "rollout", "--wait", "2s"}, &stdout, &stderr)
			switch {
			case tc.fail == "" && err != nil:
				t.Fatalf("rollout: %v\n%s", err, stderr.String())
			case tc.fail != "" && (err == nil || !strings.Contains(err.Error(), tc.fail)):
				t.Fatalf("rollout: %v, want an error with %q", err, tc.fail)
			}
			if !strings.Contains(stdout.String(), "VERSION") {
				t.Errorf("no table:\n%s", stdout.String())
			}
		})
	}
}
