package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/policyd/policyd/adminclient"
)

// TestRolloutCLIAgainstNode drives a staged rollout with the binary against
// a real node: start from a JSON stream, status, pause, the 409 of a plain
// write, promote, and the policies as ordinary revisions.
func TestRolloutCLIAgainstNode(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "--data-dir", filepath.Join(dir, "data"), "--node-id", "n1", "--bootstrap",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0")
	base := "http://" + daemonHTTPAddr(t, d)
	waitReady(t, base)
	srv := func(args ...string) []string { return append([]string{"--server", base}, args...) }
	if out, err := cliInput(t, dir, policyDoc("acme.old"), srv("policy", "apply", "-f", "-")...); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	changes := filepath.Join(dir, "changes.yaml")
	if err := os.WriteFile(changes, []byte(policyDoc("acme.new")+"\n"+`{"delete": "acme.old"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var ro adminclient.StagedRollout
	out := cli(t, dir, srv("-o", "json", "rollout", "start", "-f", changes, "--stages", "10%,100%", "--bake", "1h")...)
	if err := json.Unmarshal([]byte(out), &ro); err != nil || ro.State != "running" || len(ro.Changes) != 2 {
		t.Fatalf("start: %v\n%s", err, out)
	}
	if out := cli(t, dir, srv("rollout", "status")...); !strings.Contains(out, ro.ID) || !strings.Contains(out, "acme.new,-acme.old") {
		t.Errorf("status:\n%s", out)
	}
	if out := cli(t, dir, srv("rollout", "pause", ro.ID)...); !strings.Contains(out, "paused") {
		t.Errorf("pause:\n%s", out)
	}
	if out, code := exitCode(t, dir, "", srv("policy", "delete", "acme.old")...); code != 1 || !strings.Contains(out, "under rollout "+ro.ID) {
		t.Errorf("delete under rollout: exit %d\n%s", code, out)
	}
	if out, code := exitCode(t, dir, "", srv("rollout", "resume", ro.ID, "extra")...); code != 2 {
		t.Errorf("resume with two arguments: exit %d\n%s", code, out)
	}
	cli(t, dir, srv("rollout", "promote", ro.ID)...)
	if out := cli(t, dir, srv("rollout", "status", ro.ID, "--wait")...); !strings.Contains(out, "completed") {
		t.Errorf("status --wait:\n%s", out)
	}
	if out, code := exitCode(t, dir, "", srv("rollout", "abort", ro.ID)...); code != 1 || !strings.Contains(out, "409") {
		t.Errorf("abort after completion: exit %d\n%s", code, out)
	}
	cli(t, dir, srv("policy", "get", "acme.new")...)
	if out, code := exitCode(t, dir, "", srv("policy", "get", "acme.old")...); code != 1 || !strings.Contains(out, "404") {
		t.Errorf("acme.old after completion: exit %d\n%s", code, out)
	}
}
