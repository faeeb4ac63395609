package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/sources/gittest"
)

// TestSourcesAcrossProcesses runs both sources on the binary as a 3-node
// cluster of processes: kubectl applies and deletes a ToolPolicy against a
// real API server, a push to a loopback git server reaches the Git source,
// the CLI shows both and refuses to change a managed policy, and killing
// the leader leaves the new one to converge on a change made meanwhile.
func TestSourcesAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and an API server: not in -short")
	}
	env, err := kubetest.Start(kubetest.Options{CRDs: []string{filepath.Join("..", "..", "deploy", "kubernetes", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig, kubetest.Kubeconfig{}); err != nil {
		t.Fatal(err)
	}
	kubectl := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	srv := gittest.NewServer(t, "")
	repo := srv.Repo(t, "policies")
	repo.Write("policies/g.yaml", "name: acme.git-one\nkind: ToolPolicy\nscope: {org: acme}\nspec: {tool_name: Bash, action: deny, reason: from git}\n")
	repo.Commit("one policy")

	ports := freePorts(t, 9)
	var peers, servers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("    - {id: n%d, address: \"127.0.0.1:%d\"}", i+1, ports[3*i+2]))
		servers = append(servers, fmt.Sprintf("http://127.0.0.1:%d", ports[3*i]))
	}
	daemons := make([]*daemon, 3)
	start := func(i int) {
		cfg := fmt.Sprintf(`node_id: n%d
data_dir: %q
http: {addr: "127.0.0.1:%d"}
grpc: {addr: "127.0.0.1:%d"}
raft:
  addr: "127.0.0.1:%d"
  bootstrap: true
  peers:
%s
kubernetes: {kubeconfig: %q}
sources:
  kubernetes: {enabled: true}
  git:
  - {name: policies, url: %q, ref: main, path: policies, interval: 1s}
`, i+1, filepath.Join(dir, fmt.Sprintf("n%d", i+1)), ports[3*i], ports[3*i+1], ports[3*i+2], strings.Join(peers, "\n"), kubeconfig, repo.URL)
		path := filepath.Join(dir, fmt.Sprintf("n%d.yaml", i+1))
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		daemons[i] = startDaemon(t, dir, "--config", path)
	}
	for i := range 3 {
		start(i)
	}
	for _, s := range servers {
		waitReady(t, s)
	}
	all := strings.Join(servers, ",")
	owners := func(server string) map[string]string {
		t.Helper()
		out, err := cliErr(t, dir, "--server", server, "policy", "list", "-o", "json")
		if err != nil {
			return nil
		}
		var list adminclient.PolicyList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return nil
		}
		got := map[string]string{}
		for _, p := range list.Policies {
			got[p.Name] = p.Source
		}
		return got
	}
	converge := func(what string, want map[string]string, among ...int) {
		t.Helper()
		poll.Eventually(t, what, func() error {
			for _, i := range among {
				if got := owners(servers[i]); fmt.Sprint(got) != fmt.Sprint(want) {
					return fmt.Errorf("n%d holds %v, want %v", i+1, got, want)
				}
			}
			return nil
		}, poll.Within(30*time.Second))
	}

	tool := func(name, reason string) string {
		return fmt.Sprintf("apiVersion: policyd.io/v1alpha1\nkind: ToolPolicy\nmetadata: {name: %s}\nspec: {scope: {org: acme}, toolName: Bash, action: deny, reason: %q}\n", name, reason)
	}
	kubectl(tool("acme.kube-one", "one")+"---\n"+tool("acme.kube-two", "two"), "apply", "-f", "-")
	converge("both sources on every node", map[string]string{
		"acme.git-one": "git:policies", "acme.kube-one": "kubernetes", "acme.kube-two": "kubernetes"}, 0, 1, 2)

	out := cli(t, dir, "--server", all, "sources", "status")
	for _, want := range []string{"git:policies", "kubernetes"} {
		if !strings.Contains(out, want) {
			t.Errorf("sources status lacks %s:\n%s", want, out)
		}
	}
	if out, err := cliInput(t, dir, `{"name":"acme.kube-one","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"allow"}}`,
		"--server", all, "policy", "apply", "-f", "-"); err == nil || !strings.Contains(out, "managed by kubernetes (ToolPolicy acme.kube-one); change it there") {
		t.Errorf("policy apply of a managed policy: %v\n%s", err, out)
	}

	// Kill the leader; change both sources meanwhile.
	var st adminclient.ClusterStatus
	if err := json.Unmarshal([]byte(cliStdout(t, dir, "--server", all, "cluster", "status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	leader := int(st.LeaderID[1] - '1')
	daemons[leader].kill(t)
	kubectl("", "delete", "toolpolicy", "acme.kube-two")
	repo.Write("policies/g2.yaml", "name: acme.git-two\nkind: ToolPolicy\nscope: {org: acme}\nspec: {tool_name: Bash, action: audit}\n")
	repo.Commit("another")
	rest := []int{(leader + 1) % 3, (leader + 2) % 3}
	converge("the new leader's sync", map[string]string{
		"acme.git-one": "git:policies", "acme.git-two": "git:policies", "acme.kube-one": "kubernetes"}, rest...)
	start(leader)
	waitReady(t, servers[leader])
	converge("the restarted node", map[string]string{
		"acme.git-one": "git:policies", "acme.git-two": "git:policies", "acme.kube-one": "kubernetes"}, leader)
}
