package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/poll"
)

// exitCode runs the CLI and returns its combined output and exit code.
func exitCode(t *testing.T, dir, stdin string, args ...string) (string, int) {
	t.Helper()
	out, err := cliInput(t, dir, stdin, args...)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out, 0
	case errors.As(err, &ee):
		return out, ee.ExitCode()
	}
	t.Fatalf("policyd %s: %v", strings.Join(args, " "), err)
	return "", -1
}

// TestCLIEndToEnd drives every admin subcommand and output format against
// a real 3-node cluster: apply of multi-document streams, the new
// operator commands, leadership transfer, failover to the second --server
// and the exit codes.
func TestCLIEndToEnd(t *testing.T) {
	c := newProcCluster(t, 3)
	c.converged(0, 1, 2)
	all := strings.Join(c.http, ",")
	run := func(args ...string) (string, int) {
		t.Helper()
		return exitCode(t, c.dir, "", append([]string{"--server", all}, args...)...)
	}
	must := func(args ...string) string {
		t.Helper()
		out, code := run(args...)
		if code != 0 {
			t.Fatalf("policyd %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
		return out
	}

	t.Run("apply stream with a bad document", func(t *testing.T) {
		stream := policyYAML("acme.first") + "---\n" +
			strings.Replace(policyYAML("acme.bogus"), "kind: ToolPolicy", "kind: NoSuchKind", 1) + "---\n" +
			"- " + strings.ReplaceAll(strings.TrimSpace(policyYAML("acme.third")), "\n", "\n  ") + "\n"
		out, code := exitCode(t, c.dir, stream, "--server", all, "policy", "apply", "-f", "-")
		if code != 1 {
			t.Fatalf("exit %d, want 1 (some failed)\n%s", code, out)
		}
		for _, want := range []string{"policy/acme.first applied", "document 2: policy/acme.bogus: 400 invalid", "policy/acme.third applied", "1 of 3 documents failed"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		for name, want := range map[string]int{"acme.first": 0, "acme.third": 0, "acme.bogus": 1} {
			if _, code := run("policy", "get", name); code != want {
				t.Errorf("policy get %s: exit %d, want %d", name, code, want)
			}
		}
	})

	t.Run("malformed stream applies nothing", func(t *testing.T) {
		stream := policyYAML("acme.never") + "---\nname: [unclosed\n"
		out, code := exitCode(t, c.dir, stream, "--server", all, "policy", "apply", "-f", "-")
		if code != 1 || !strings.Contains(out, "document 2: not valid YAML") || !strings.Contains(out, "nothing was applied") {
			t.Fatalf("exit %d, want 1 naming document 2:\n%s", code, out)
		}
		if out, code := run("policy", "get", "acme.never"); code != 1 || !strings.Contains(out, "404 not_found") {
			t.Fatalf("a document before the malformed one was applied: exit %d\n%s", code, out)
		}
	})

	t.Run("apply JSON stream, json output", func(t *testing.T) {
		stream := policyDoc("acme.json-one") + "\n" + policyDoc("acme.json-two")
		out, code := exitCode(t, c.dir, stream, "--server", all, "-o", "json", "policy", "apply", "-f", "-")
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
		var res []applyResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if len(res) != 2 || res[0].Key != "acme.json-one" || res[1].Revision == 0 || res[0].Error != "" {
			t.Fatalf("results %+v", res)
		}
	})
	if out, err := cliInput(t, c.dir, `{"id": "alice", "org": "acme", "team": "red"}`, "--server", all, "employee", "apply", "-f", "-"); err != nil {
		t.Fatalf("employee apply: %v\n%s", err, out)
	}

	// A discovery sidecar, so that clients and rollout have something to
	// show.
	st, err := getStatus(c.http[0])
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := ""
	for _, m := range st.Members {
		if m.ID == c.ids[1] {
			grpcAddr = m.GRPCAddr
		}
	}
	sdk, err := client.New(client.Config{Servers: []string{grpcAddr}, Scope: client.Scope{Org: "acme", Team: "red"}, ClientAddress: "e2e-sidecar"},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sdkDone := make(chan error, 1)
	go func() { sdkDone <- sdk.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-sdkDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("sidecar: %v", err)
		}
	}()
	poll.Eventually(t, "the sidecar to ACK", func() error {
		out, code := run("clients", "--state", "acked", "--node", c.ids[1], "--scope", "acme/red")
		if code != 0 || !strings.Contains(out, "e2e-sidecar") {
			return fmt.Errorf("exit %d: %s", code, out)
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	if out := must("clients", "--scope", "other"); strings.Contains(out, "e2e-sidecar") {
		t.Errorf("--scope other lists the acme sidecar:\n%s", out)
	}
	if out := must("rollout", "--wait", "10s"); !strings.Contains(out, "VERSION") {
		t.Errorf("rollout table:\n%s", out)
	}

	t.Run("every command in every format", func(t *testing.T) {
		backup := filepath.Join(c.dir, "e2e-backup.db")
		must("snapshot", "save", backup)
		cmds := []struct {
			args  []string
			table string // a word the default output holds
		}{
			{[]string{"policy", "list"}, "acme.first"},
			{[]string{"policy", "get", "acme.first"}, `"name": "acme.first"`},
			{[]string{"employee", "list"}, "alice"},
			{[]string{"employee", "get", "alice"}, `"id": "alice"`},
			{[]string{"events", "list", "--limit", "5"}, "ENTITY"},
			{[]string{"cluster", "status"}, "COMMAND_VERSION"},
			{[]string{"clients"}, "e2e-sidecar"},
			{[]string{"proxy-status"}, "ACKED"},
			{[]string{"rollout"}, "ACKED"},
			{[]string{"reload", "status"}, "controller"},
			{[]string{"drift", "list"}, "PHASE"},
			{[]string{"version"}, "server node3"},
			{[]string{"snapshot", "inspect", backup}, "policyd state database at applied index"},
		}
		for _, tc := range cmds {
			t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
				if out := must(tc.args...); !strings.Contains(out, tc.table) {
					t.Errorf("default output lacks %q:\n%s", tc.table, out)
				}
				if out := must(append([]string{"-o", "table"}, tc.args...)...); !strings.Contains(out, tc.table) {
					t.Errorf("-o table lacks %q:\n%s", tc.table, out)
				}
				var fromJSON, fromYAML map[string]any
				stdout := func(args ...string) string {
					return cliStdout(t, c.dir, append([]string{"--server", all}, args...)...)
				}
				if err := json.Unmarshal([]byte(stdout(append([]string{"-o", "json"}, tc.args...)...)), &fromJSON); err != nil {
					t.Fatalf("-o json: %v", err)
				}
				y := stdout(append([]string{"-o", "yaml"}, tc.args...)...)
				if err := yaml.Unmarshal([]byte(y), &fromYAML); err != nil || strings.HasPrefix(strings.TrimSpace(y), "{") {
					t.Fatalf("-o yaml is not YAML (%v):\n%s", err, y)
				}
				keys := func(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
				if diff := cmp.Diff(keys(fromJSON), keys(fromYAML)); diff != "" || len(fromJSON) == 0 {
					t.Errorf("json and yaml fields differ (-json +yaml):\n%s", diff)
				}
			})
		}
	})

	t.Run("client types round-trip real answers", func(t *testing.T) {
		for path, v := range map[string]any{
			"/v1/policies":                    &adminclient.PolicyList{},
			"/v1/policies/acme.first":         &adminclient.Policy{},
			"/v1/policies/acme.first/history": &adminclient.History{},
			"/v1/employees":                   &adminclient.EmployeeList{},
			"/v1/employees/alice":             &adminclient.Employee{},
			"/v1/events?limit=50":             &adminclient.EventPage{},
			"/v1/cluster":                     &adminclient.ClusterStatus{},
			"/v1/clients":                     &adminclient.ClientList{},
			"/v1/clients?offset=0&limit=10":   &adminclient.ClientList{},
			"/v1/rollout":                     &adminclient.ProxyStatus{},
			"/v1/proxy-status":                &adminclient.ProxyStatus{},
			"/v1/reload":                      &adminclient.ReloadView{},
			"/v1/drift":                       &adminclient.DriftList{},
			"/v1/version":                     &adminclient.VersionInfo{},
		} {
			var raw json.RawMessage
			if err := getJSON(c.http[1]+path, &raw); err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(v); err != nil {
				t.Errorf("%s: %v\n%s", path, err, raw)
				continue
			}
			back, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			var want, got any
			_ = json.Unmarshal(raw, &want)
			_ = json.Unmarshal(back, &got)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s does not round-trip (-server +client):\n%s", path, diff)
			}
		}
	})

	t.Run("drift get of an unknown report", func(t *testing.T) {
		if out, code := run("drift", "get", "no-such-report"); code != 1 || !strings.Contains(out, "not found") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})

	t.Run("transfer leader", func(t *testing.T) {
		from := c.leader(0, 1, 2)
		to := (from + 1) % 3
		// Through a follower: the client finds the leader.
		out := c.cli((from+2)%3, "cluster", "transfer-leader", c.ids[to])
		if !strings.Contains(out, "leadership transferred from "+c.ids[from]) {
			t.Fatalf("output %q", out)
		}
		if got := c.leader(0, 1, 2); got != to {
			t.Fatalf("leader is %s, want %s", c.ids[got], c.ids[to])
		}
		if out, code := run("cluster", "transfer-leader", "no-such-node"); code != 1 || !strings.Contains(out, "404 not_found") {
			t.Fatalf("unknown target: exit %d\n%s", code, out)
		}
		must("-o", "json", "cluster", "transfer-leader")
		if got := c.leader(0, 1, 2); got == to {
			t.Fatalf("leader still %s after a transfer to any voter", c.ids[got])
		}
	})

	t.Run("rollout with a NACK", func(t *testing.T) {
		rejecter, err := client.New(client.Config{
			Servers: []string{grpcAddr}, Scope: client.Scope{Org: "acme", Team: "blue"}, ClientAddress: "e2e-rejecter",
			Apply: func(ps []client.Policy) error {
				for _, p := range ps {
					if p.Name == "acme.reject" {
						return errors.New("acme.reject is not for me")
					}
				}
				return nil
			},
		}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(context.Background())
		rdone := make(chan error, 1)
		go func() { rdone <- rejecter.Run(rctx) }()
		defer func() {
			rcancel()
			if err := <-rdone; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("rejecting sidecar: %v", err)
			}
		}()
		poll.Eventually(t, "both sidecars to ACK", func() error {
			if out, code := run("clients", "--state", "acked"); code != 0 || !strings.Contains(out, "e2e-rejecter") || !strings.Contains(out, "e2e-sidecar") {
				return fmt.Errorf("exit %d: %s", code, out)
			}
			return nil
		}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

		if out, code := exitCode(t, c.dir, policyDoc("acme.reject"), "--server", all, "policy", "apply", "-f", "-"); code != 0 {
			t.Fatalf("apply: exit %d\n%s", code, out)
		}
		poll.Eventually(t, "the NACK", func() error {
			out, code := run("clients", "--state", "nacked")
			if code != 0 || !strings.Contains(out, "e2e-rejecter") || !strings.Contains(out, "acme.reject is not for me") {
				return fmt.Errorf("exit %d: %s", code, out)
			}
			return nil
		}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

		out, code := run("rollout", "--wait", "1s")
		if code != 1 || !strings.Contains(out, "NACK e2e-rejecter") || !strings.Contains(out, "1 NACK(s) pending") {
			t.Fatalf("rollout with a NACK pending: exit %d, want 1\n%s", code, out)
		}
		must("policy", "delete", "acme.reject")
		if out, code := run("rollout", "--wait", "20s"); code != 0 {
			t.Fatalf("rollout after the rejected policy went: exit %d\n%s", code, out)
		}
	})

	t.Run("usage exit codes", func(t *testing.T) {
		for _, args := range [][]string{{"policy", "lst"}, {"clients", "--bogus"}, {"drift", "nope"}, {"rollout", "extra"}, {"-o", "xml", "policy", "list"}, {"cluster", "transfer-leader", "a", "b"}} {
			if out, code := run(args...); code != 2 {
				t.Errorf("policyd %s: exit %d, want 2\n%s", strings.Join(args, " "), code, out)
			}
		}
	})

	t.Run("unreachable servers", func(t *testing.T) {
		dead := freePorts(t, 2)
		list := fmt.Sprintf("http://127.0.0.1:%d,http://127.0.0.1:%d", dead[0], dead[1])
		out, code := exitCode(t, c.dir, "", "--server", list, "policy", "list")
		if code != 1 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "no server answered") || !strings.Contains(out, fmt.Sprint(dead[1])) {
			t.Fatalf("exit %d, want 1 and one line naming both servers:\n%s", code, out)
		}
	})

	t.Run("failover to the second server", func(t *testing.T) {
		c.daemons[0].kill(t)
		list := c.http[0] + "," + c.http[1]
		poll.Eventually(t, "a write with the first server down", func() error {
			out, code := exitCode(t, c.dir, policyDoc("acme.failover"), "--server", list, "policy", "apply", "-f", "-")
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, out)
			}
			return nil
		}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

		if out, code := exitCode(t, c.dir, "", "--server", list, "policy", "get", "acme.failover"); code != 0 || !strings.Contains(out, "acme.failover") {
			t.Fatalf("read with the first server down: exit %d\n%s", code, out)
		}
		// version names the member that is down, and says so in its
		// exit code.
		if out, code := exitCode(t, c.dir, "", "--server", list, "version"); code != 1 || !strings.Contains(out, "server "+c.ids[0]+": ") {
			t.Fatalf("version with a member down: exit %d\n%s", code, out)
		}
	})
}

// applyResult is one document's outcome as apply -o json prints it.
type applyResult struct {
	Document string `json:"document"`
	Key      string `json:"key"`
	Revision uint64 `json:"revision"`
	Error    string `json:"error"`
}

func getStatus(base string) (*adminclient.ClusterStatus, error) {
	var st adminclient.ClusterStatus
	return &st, getJSON(base+"/v1/cluster", &st)
}

// policyYAML is policyDoc as a YAML document.
func policyYAML(name string) string {
	return fmt.Sprintf(`name: %s
kind: ToolPolicy
scope: {org: acme}
spec:
  tool_name: Bash
  action: deny
  reason: r
  conditions: {patterns: ["rm -rf"]}
`, name)
}
