package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/loopback"
	"github.com/policyd/policyd/internal/poll"
)

// procCluster is a cluster of real `policyd serve` processes on loopback,
// configured by files in dir as an operator would configure them.
type procCluster struct {
	t       *testing.T
	dir     string
	ids     []string
	http    []string // base URLs
	raft    []string // Raft addresses
	daemons []*daemon
}

// newProcCluster writes node<i>.yaml for size nodes that bootstrap together
// from one peers list, starts them and waits until every node is ready.
func newProcCluster(t *testing.T, size int) *procCluster {
	t.Helper()
	return newProcClusterWith(t, size, "")
}

// newProcClusterWith is newProcCluster with more raft settings, YAML lines
// indented under raft:.
func newProcClusterWith(t *testing.T, size int, raftExtra string) *procCluster {
	t.Helper()
	c := &procCluster{t: t, dir: t.TempDir()}
	ports := freePorts(t, 3*size)
	var peers strings.Builder
	for i := range size {
		c.ids = append(c.ids, fmt.Sprintf("node%d", i+1))
		c.http = append(c.http, fmt.Sprintf("http://127.0.0.1:%d", ports[3*i]))
		c.raft = append(c.raft, fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]))
		fmt.Fprintf(&peers, "    - {id: %s, address: %q}\n", c.ids[i], c.raft[i])
	}
	for i := range size {
		cfg := fmt.Sprintf(`node_id: %s
data_dir: ./data/%s
http: {addr: "127.0.0.1:%d"}
grpc: {addr: "127.0.0.1:%d"}
raft:
  addr: %q
  bootstrap: true
  heartbeat_timeout: 500ms
  election_timeout: 500ms
  leader_lease_timeout: 250ms
%s  peers:
%s`, c.ids[i], c.ids[i], ports[3*i], ports[3*i+1], c.raft[i], raftExtra, peers.String())
		if err := os.WriteFile(c.configPath(i), []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c.daemons = make([]*daemon, size)
	for i := range size {
		c.start(i)
	}
	for i := range size {
		waitReady(t, c.http[i])
	}
	return c
}

func (c *procCluster) configPath(i int) string {
	return filepath.Join(c.dir, c.ids[i]+".yaml")
}

func (c *procCluster) dataDir(i int) string {
	return filepath.Join(c.dir, "data", c.ids[i])
}

func (c *procCluster) start(i int) {
	c.t.Helper()
	c.daemons[i] = startDaemon(c.t, c.dir, "--config", c.configPath(i))
}

// cli runs the CLI against node i.
func (c *procCluster) cli(i int, args ...string) string {
	c.t.Helper()
	return cli(c.t, c.dir, append([]string{"--server", c.http[i]}, args...)...)
}

// clusterView is the part of GET /v1/cluster the tests read.
type clusterView struct {
	NodeID       string `json:"node_id"`
	LeaderID     string `json:"leader_id"`
	AppliedIndex uint64 `json:"applied_index"`
	Digest       string `json:"digest"`
	Members      []struct {
		ID       string `json:"id"`
		HTTPAddr string `json:"http_addr"`
	} `json:"members"`
}

func (c *procCluster) status(i int) (clusterView, error) {
	var v clusterView
	err := getJSON(c.http[i]+"/v1/cluster", &v)
	return v, err
}

// leader waits until every node in nodes names the same leader, and returns
// its index.
func (c *procCluster) leader(nodes ...int) int {
	c.t.Helper()
	leader := -1
	poll.Eventually(c.t, "a leader every running node agrees on", func() error {
		var id string
		for _, i := range nodes {
			st, err := c.status(i)
			if err != nil {
				return err
			}
			if st.LeaderID == "" || (id != "" && st.LeaderID != id) {
				return fmt.Errorf("%s sees leader %q, others %q", c.ids[i], st.LeaderID, id)
			}
			id = st.LeaderID
		}
		for i, nid := range c.ids {
			if nid == id {
				leader = i
			}
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	return leader
}

// converged waits until the nodes have equal digests and every member has
// registered its addresses (a node registers after it starts, which is a
// write of its own), and returns the digest.
func (c *procCluster) converged(nodes ...int) string {
	c.t.Helper()
	var digest string
	poll.Eventually(c.t, "nodes to converge", func() error {
		digest = ""
		for _, i := range nodes {
			st, err := c.status(i)
			if err != nil {
				return err
			}
			for _, m := range st.Members {
				if m.HTTPAddr == "" {
					return fmt.Errorf("%s has not registered its addresses", m.ID)
				}
			}
			if digest != "" && st.Digest != digest {
				return fmt.Errorf("%s has digest %.12s, another %.12s", c.ids[i], st.Digest, digest)
			}
			digest = st.Digest
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	return digest
}

// getJSON GETs rawURL, a node's base URL with a path, through adminclient
// and decodes the answer into v; anything but a 2xx is an error.
func getJSON(rawURL string, v any) error {
	api, path, err := nodeAPI(rawURL)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := api.Do(ctx, http.MethodGet, path, nil, nil, v); err != nil {
		return fmt.Errorf("GET %s: %w", rawURL, err)
	}
	return nil
}

// nodeAPI splits rawURL into an admin client of its node alone (no
// failover: the tests ask one node what it holds) and the path with query.
func nodeAPI(rawURL string) (*adminclient.Client, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("parse %q: %w", rawURL, err)
	}
	api, err := adminclient.New(adminclient.Config{Servers: []string{u.Scheme + "://" + u.Host}})
	if err != nil {
		return nil, "", err
	}
	return api, u.RequestURI(), nil
}

// policyNames lists the policies node i holds locally.
func (c *procCluster) policyNames(i int) ([]string, error) {
	list, err := c.policies(i)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range list {
		names = append(names, fmt.Sprint(p["name"]))
	}
	return names, nil
}

// policies returns node i's policies as its REST API lists them.
func (c *procCluster) policies(i int) ([]map[string]any, error) {
	var list struct {
		Policies []map[string]any `json:"policies"`
	}
	if err := getJSON(c.http[i]+"/v1/policies", &list); err != nil {
		return nil, err
	}
	return list.Policies, nil
}

func policyDoc(name string) string {
	return fmt.Sprintf(`{"name": %q, "kind": "ToolPolicy", "scope": {"org": "acme"},
 "spec": {"tool_name": "Bash", "action": "deny", "reason": "r", "conditions": {"patterns": ["rm -rf"]}}}`, name)
}

// apply writes a policy through node i and returns the CLI's output.
func (c *procCluster) apply(i int, name string) string {
	c.t.Helper()
	out, err := cliInput(c.t, c.dir, policyDoc(name), "--server", c.http[i], "policy", "apply", "-f", "-")
	if err != nil {
		c.t.Fatalf("apply %s through %s: %v\n%s", name, c.ids[i], err, out)
	}
	return out
}

func writePeersFile(t *testing.T, path string, peers ...[2]string) {
	t.Helper()
	var entries []map[string]string
	for _, p := range peers {
		entries = append(entries, map[string]string{"id": p[0], "address": p[1]})
	}
	b, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRecoverFromQuorumLoss: a 3-node cluster loses two nodes for good. The
// survivor cannot elect a leader; `policyd recover` with a one-server peers
// file makes it a cluster of one that leads, holds every earlier write and
// takes new ones.
func TestRecoverFromQuorumLoss(t *testing.T) {
	c := newProcCluster(t, 3)
	leader := c.leader(0, 1, 2)
	for i, name := range []string{"acme.one", "acme.two", "acme.three"} {
		c.apply(i, name)
	}
	c.converged(0, 1, 2)

	// The survivor is a follower: the dead leader's last entries reach it
	// only through replication, which is what recovery has to rely on.
	survivor := (leader + 1) % 3
	for i := range 3 {
		if i != survivor {
			c.daemons[i].kill(t)
		}
	}
	poll.Eventually(t, "the survivor to lose its leader", func() error {
		resp, err := http.Get(c.http[survivor] + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return fmt.Errorf("still ready")
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	before, err := c.status(survivor)
	if err != nil {
		t.Fatal(err)
	}
	policiesBefore, err := c.policies(survivor)
	if err != nil {
		t.Fatal(err)
	}
	c.daemons[survivor].interrupt(t)

	peers := filepath.Join(c.dir, "peers.json")
	writePeersFile(t, peers, [2]string{c.ids[survivor], c.raft[survivor]})
	out := cli(t, c.dir, "recover", "--config", c.configPath(survivor), "--peers-file", peers)
	if !strings.Contains(out, "recovered node "+c.ids[survivor]) || !strings.Contains(out, "digest "+before.Digest) {
		t.Fatalf("recover output %q lacks the node or the pre-recovery digest %s", out, before.Digest)
	}

	c.start(survivor)
	waitReady(t, c.http[survivor])
	st, err := c.status(survivor)
	if err != nil {
		t.Fatal(err)
	}
	if st.LeaderID != c.ids[survivor] || len(st.Members) != 1 {
		t.Fatalf("after recovery: leader %q, %d members; want %s alone", st.LeaderID, len(st.Members), c.ids[survivor])
	}
	// recover's output above shows the recovered state's digest unchanged.
	// Once it leads, the node forgets the member records of the two nodes
	// that left the configuration, so the digest moves on; the policies,
	// revisions and times included, must not.
	poll.Eventually(t, "the lost nodes' member records to be forgotten", func() error {
		st, err := c.status(survivor)
		if err != nil {
			return err
		}
		if st.Digest == before.Digest {
			return fmt.Errorf("digest %s unchanged", st.Digest)
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	policiesAfter, err := c.policies(survivor)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(policiesBefore, policiesAfter); diff != "" {
		t.Fatalf("recovery changed the policies (-before +after):\n%s", diff)
	}
	c.apply(survivor, "acme.after-recovery")
	names, err := c.policyNames(survivor)
	if err != nil {
		t.Fatal(err)
	}
	want := "acme.after-recovery,acme.one,acme.three,acme.two"
	if got := strings.Join(names, ","); got != want {
		t.Fatalf("policies after recovery = %s, want %s", got, want)
	}
	c.daemons[survivor].interrupt(t)
}

// TestRecoverRefuses: bad peers files and unsafe targets are refused with a
// message naming the problem, and leave the data directory as it was.
func TestRecoverRefuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	self := `[{"id": "n1", "address": "127.0.0.1:17001"}]`
	tests := []struct {
		name    string
		args    []string
		mention string
	}{
		{"no peers file", []string{"recover", "--node-id", "n1"}, "--peers-file"},
		{"missing peers file", []string{"recover", "--node-id", "n1", "--peers-file", filepath.Join(dir, "nope.json")}, "nope.json"},
		{"not JSON", []string{"recover", "--node-id", "n1", "--peers-file", write("bad.json", "node1 127.0.0.1:7000")}, "JSON array"},
		{"unknown field", []string{"recover", "--node-id", "n1", "--peers-file", write("unknown.json", `[{"id": "n1", "addr": "127.0.0.1:7000"}]`)}, `unknown field "addr"`},
		{"empty list", []string{"recover", "--node-id", "n1", "--peers-file", write("empty.json", "[]")}, "no servers"},
		{"self missing", []string{"recover", "--node-id", "n2", "--peers-file", write("self.json", self)}, "must include this node"},
		{"duplicate id", []string{"recover", "--node-id", "n1", "--peers-file", write("dup.json", `[{"id": "n1", "address": "127.0.0.1:17001"}, {"id": "n1", "address": "127.0.0.1:17002"}]`)}, "duplicates"},
		{"bad address", []string{"recover", "--node-id", "n1", "--peers-file", write("addr.json", `[{"id": "n1", "address": "0.0.0.0:7000"}]`)}, "unspecified"},
		{"no node id", []string{"recover", "--peers-file", write("ok.json", self)}, "node_id"},
		{"no state", []string{"recover", "--node-id", "n1", "--data-dir", filepath.Join(dir, "empty"), "--peers-file", write("ok.json", self)}, "nothing to recover"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := cliErr(t, dir, tc.args...)
			if err == nil || !strings.Contains(out, tc.mention) || strings.Contains(out, "panic") {
				t.Fatalf("err=%v, output %q should mention %q", err, out, tc.mention)
			}
		})
	}
}

// freePorts returns n distinct free loopback ports, failing the test if it
// cannot.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := loopback.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}
