package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testConfig is a node on loopback with free ports and short Raft timeouts
// (servertest.Config), storing in the test's temporary directory.
func testConfig(t testing.TB, id string) config.Config {
	t.Helper()
	return servertest.Config(filepath.Join(t.TempDir(), id), id)
}

// testLogger sends logs to t.Log, so they show only for failing tests.
func testLogger(t testing.TB) *slog.Logger { return servertest.Logger(t) }

// startNode builds and starts a node and closes it when the test ends.
func startNode(t testing.TB, cfg config.Config, beforeStart ...func(*Node)) *Node {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a node: not in -short (make check)")
	}
	n, err := New(cfg, testLogger(t), nil)
	if err != nil {
		t.Fatalf("start node %s: %v", cfg.NodeID, err)
	}
	for _, f := range beforeStart {
		f(n)
	}
	n.Start()
	t.Cleanup(func() { closeNode(t, n) })
	return n
}

func closeNode(t testing.TB, n *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		t.Errorf("close node %s: %v", n.ID(), err)
	}
}

// inConfiguration reports whether id is in n's Raft configuration.
func (n *Node) inConfiguration(id string) bool { return n.InConfiguration(id) }

// cluster is a set of nodes on loopback. Node 0 bootstraps; the rest join.
type cluster struct {
	t           *testing.T
	nodes       []*Node
	cfgs        []config.Config
	beforeStart []func(*Node)
}

func newCluster(t *testing.T, size int, mutate func(*config.Config), beforeStart ...func(*Node)) *cluster {
	t.Helper()
	c := &cluster{t: t, beforeStart: beforeStart}
	for i := range size {
		cfg := testConfig(t, fmt.Sprintf("node%d", i+1))
		cfg.Raft.Bootstrap = i == 0
		if mutate != nil {
			mutate(&cfg)
		}
		n := startNode(t, cfg, beforeStart...)
		cfg.Raft.Addr = n.RaftAddr() // a restart must come back on the same Raft address
		c.nodes = append(c.nodes, n)
		c.cfgs = append(c.cfgs, cfg)
		if i == 0 {
			c.leader()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := c.nodes[0].Join(ctx, cfg.NodeID, n.RaftAddr()); err != nil {
			cancel()
			t.Fatalf("join %s: %v", cfg.NodeID, err)
		}
		cancel()
	}
	c.waitConverged()
	return c
}

// leader waits for a node of the running ones to lead, and for every running
// node to agree.
func (c *cluster) leader() *Node {
	c.t.Helper()
	var leader *Node
	poll.Eventually(c.t, "a leader all running nodes agree on", func() error {
		leader = nil
		for _, n := range c.running() {
			if n.IsLeader() {
				leader = n
			}
		}
		if leader == nil {
			return fmt.Errorf("no leader")
		}
		for _, n := range c.running() {
			if _, id := n.consensus.Raft().LeaderWithID(); string(id) != leader.ID() {
				return fmt.Errorf("%s sees leader %q, not %q", n.ID(), id, leader.ID())
			}
		}
		return nil
	}, poll.Within(15*time.Second))

	return leader
}

func (c *cluster) running() []*Node {
	var out []*Node
	for _, n := range c.nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

func (c *cluster) follower() *Node {
	c.t.Helper()
	l := c.leader()
	for _, n := range c.running() {
		if n != l {
			return n
		}
	}
	c.t.Fatal("no follower running")
	return nil
}

// waitConverged waits until every running node has applied the same index,
// has the same state digest and serves sidecars the policies as of that
// index, and every member has registered its addresses.
func (c *cluster) waitConverged() {
	c.t.Helper()
	poll.Eventually(c.t, "replicas to converge", func() error {
		nodes := c.running()
		ref, refIdx, err := nodes[0].store.Digest()
		if err != nil {
			return err
		}
		for _, n := range nodes {
			d, idx, err := n.store.Digest()
			if err != nil {
				return err
			}
			if idx != refIdx || d != ref {
				return fmt.Errorf("%s at %d (%.8s), %s at %d (%.8s)", nodes[0].ID(), refIdx, ref, n.ID(), idx, d)
			}

			if got := n.policies.Applied(); got < idx {
				return fmt.Errorf("%s's policy index at %d, its store at %d", n.ID(), got, idx)
			}
		}
		members, err := nodes[0].store.Members()
		if err != nil {
			return err
		}
		if len(members) < len(nodes) {
			return fmt.Errorf("%d of %d members registered", len(members), len(nodes))
		}
		return nil
	}, poll.Within(20*time.Second))

}

// stop closes node i (as a crash-free shutdown would).
func (c *cluster) stop(i int) {
	c.t.Helper()
	closeNode(c.t, c.nodes[i])
	c.nodes[i] = nil
}

// crash stops node i the way a kill -9 looks to its peers: raft stops at
// once, with no leadership transfer, then the rest is cleaned up.
func (c *cluster) crash(i int) {
	c.t.Helper()
	if err := c.nodes[i].consensus.Raft().Shutdown().Error(); err != nil {
		c.t.Fatalf("crash %s: %v", c.nodes[i].ID(), err)
	}
	c.stop(i)
}

// restart starts node i again on its data directory and Raft address.
func (c *cluster) restart(i int) *Node {
	c.t.Helper()
	cfg := c.cfgs[i]
	cfg.Raft.Bootstrap = false
	n := startNode(c.t, cfg, c.beforeStart...)
	c.nodes[i] = n
	return n
}

// api is a minimal REST client for one node.
// api is one node's admin API: do sends raw requests, for the tests that
// check statuses, headers and bodies byte for byte; client is adminclient
// over the same connections, with that node alone as its server (no
// failover: a test addresses a node).
type api struct {
	t      *testing.T
	base   string
	hc     *http.Client
	client *adminclient.Client
}

func apiFor(t *testing.T, n *Node) *api {
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return newAPI(t, "http://"+n.HTTPAddr(), hc)
}

// newAPI is the api of the node at base over hc.
func newAPI(t *testing.T, base string, hc *http.Client) *api {
	client, err := adminclient.New(adminclient.Config{Servers: []string{base}, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	return &api{t: t, base: base, hc: hc, client: client}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// errCode returns the error envelope's code, failing if there is none.
func (r response) errCode(t *testing.T) string {
	t.Helper()
	var env struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(r.body, &env); err != nil || env.Error.Code == "" || env.Error.Message == "" {
		t.Fatalf("status %d: body %q is not an error envelope", r.status, r.body)
	}
	return env.Error.Code
}

func (a *api) do(method, path string, body []byte, hdr map[string]string) response {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// putPolicy PUTs a valid ToolPolicy and returns the stored policy.
func (a *api) putPolicy(name, org, reason string) *policy.Policy {
	a.t.Helper()
	// Do, not PutPolicy: callers read the stored policy the answer holds.
	var p policy.Policy
	if err := a.client.Do(a.t.Context(), http.MethodPut, "/v1/policies/"+name, nil, toolPolicy(name, org, reason), &p); err != nil {
		a.t.Fatalf("PUT %s: %v", name, err)
	}
	return &p
}

func toolPolicy(name, org, reason string) []byte {
	b, _ := json.Marshal(map[string]any{
		"name": name, "kind": "ToolPolicy",
		"scope": map[string]string{"org": org},
		"spec":  map[string]any{"tool_name": "Bash", "action": "deny", "reason": reason, "conditions": map[string]any{"patterns": []string{"rm -rf"}}},
	})
	return b
}
