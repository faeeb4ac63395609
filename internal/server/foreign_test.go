package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// foreignDataDir makes a single-node cluster whose node has id, holding
// employee alice and the policy acme.foreign, stops it, and returns its
// data dir and cluster ID.
func foreignDataDir(t *testing.T, id string) (dir, clusterID string) {
	t.Helper()
	cfg := testConfig(t, id)
	cfg.Raft.Bootstrap = true
	n, err := New(cfg, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	poll.Eventually(t, "the foreign cluster to lead and be named", func() error {
		if !n.IsLeader() || n.ClusterID() == "" {
			return fmt.Errorf("leader %v, cluster ID %q", n.IsLeader(), n.ClusterID())
		}
		return nil
	}, poll.Within(10*time.Second))

	a := apiFor(t, n)
	if r := a.do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	a.putPolicy("acme.foreign", "acme", "another tenant's policy")
	clusterID = n.ClusterID()
	closeNode(t, n)
	return cfg.DataDir, clusterID
}

// startOnForeignData starts node i of c again on dir, with raft.peers
// naming the cluster's nodes as its usual config would, and a logger that
// also writes to logs.
func startOnForeignData(t *testing.T, c *cluster, i int, dir string, logs *servertest.LogBuffer) *Node {
	t.Helper()
	cfg := c.cfgs[i]
	cfg.DataDir, cfg.Raft.Bootstrap = dir, false
	cfg.Raft.Peers = nil
	for _, o := range c.cfgs {
		cfg.Raft.Peers = append(cfg.Raft.Peers, config.Peer{ID: o.NodeID, Address: o.Raft.Addr})
	}
	logger := slog.New(slog.NewMultiHandler(testLogger(t).Handler(),
		slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	n, err := New(cfg, logger, nil)
	if err != nil {
		t.Fatalf("start %s on the foreign data dir: %v", cfg.NodeID, err)
	}
	n.Start()
	t.Cleanup(func() { closeNode(t, n) })
	c.nodes[i] = n
	return n
}

// errorLines returns the log's ERROR records.
func errorLines(logs *servertest.LogBuffer) []string {
	var out []string
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return out
}

// waitForeign waits for n's /readyz to answer 503 naming both cluster IDs
// and the way out, failing if it answers 200 unless wasReady.
func waitForeign(t *testing.T, n *Node, own, theirs string, wasReady bool) {
	t.Helper()
	a := apiFor(t, n)
	poll.Eventually(t, "/readyz to refuse the foreign data dir", func() error {
		r := a.do(http.MethodGet, "/readyz", nil, nil)
		if r.status == http.StatusOK && !wasReady {
			t.Fatalf("/readyz answered 200 on a data dir of another cluster: %s", r.body)
		}
		body := string(r.body)
		for _, want := range []string{"belongs to cluster " + own, "are cluster " + theirs, "wipe it and join the node again"} {
			if r.status != http.StatusServiceUnavailable || !strings.Contains(body, want) {
				return fmt.Errorf("/readyz %d %s, want 503 with %q", r.status, body, want)
			}
		}
		return nil
	}, poll.Within(15*time.Second))

}

// neverGot fails if the SDK ever received policy name.
func (s *sdkRun) neverGot(t *testing.T, name string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.updates {
		for _, p := range u.Policies {
			if p.Name == name {
				t.Errorf("a sidecar was sent %s, a policy of another cluster", name)
				return
			}
		}
	}
}

// TestForeignDataDirRefused: a member restarted on the data dir of another
// (single-node) cluster, with its usual config, leads that cluster's
// configuration, but learns from its peers that they are another cluster
// before it serves anything: /readyz answers 503 naming both cluster IDs,
// new discovery streams and feed connections are refused with "try
// another node", sidecars that list it get the cluster's policies from the
// other nodes and never the foreign one, and it logs one ERROR however
// often its peers are refused.
func TestForeignDataDirRefused(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.leader()
	a := apiFor(t, leader)
	if r := a.do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	a.putPolicy("acme.main", "acme", "this cluster's policy")
	c.waitConverged()
	mainID := leader.ClusterID()

	victim := c.follower()
	i := indexOf(c, victim)
	dir, foreignID := foreignDataDir(t, victim.ID())
	c.stop(i)

	var logs servertest.LogBuffer
	start := time.Now()
	v := startOnForeignData(t, c, i, dir, &logs)
	grpcAddrs, httpAddrs := []string{v.GRPCAddr()}, []string{v.HTTPAddr()}
	for _, n := range c.running() {
		if n != v {
			grpcAddrs, httpAddrs = append(grpcAddrs, n.GRPCAddr()), append(httpAddrs, n.HTTPAddr())
		}
	}
	// Sidecars that list the node first, started while it finds out.
	sidecars := []*sdkRun{
		startSDK(t, client.Config{Servers: grpcAddrs, Scope: client.Scope{Org: "acme", Team: "red"}, ClientAddress: "foreign-grpc"}),
		startSDK(t, client.Config{Servers: httpAddrs, Transport: client.TransportWS, Employee: "alice"}),
	}
	waitForeign(t, v, foreignID, mainID, false)
	t.Logf("the node on the foreign data dir refuses to serve %v after its start", time.Since(start).Round(time.Millisecond))
	// What it would serve otherwise: it leads the foreign configuration.
	poll.Eventually(t, v.ID()+" to lead the foreign configuration", func() error {
		if !v.IsLeader() {
			return fmt.Errorf("not leader")
		}
		return nil
	}, poll.Within(10*time.Second))

	// New sidecars are refused with try-another-node, before any set.
	d := openStream(t, dialGRPC(t, v.GRPCAddr()), "new-grpc", policy.Scope{Org: "acme", Team: "red"})
	if r, ok := <-d.resps; ok {
		t.Fatalf("a new discovery stream was sent version %s", r.GetVersionInfo())
	}
	if st := d.end(); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "try another node") || !strings.Contains(st.Message(), foreignID) {
		t.Errorf("new discovery stream: %v, want Unavailable naming cluster %s and try another node", st, foreignID)
	}
	va := apiFor(t, v)
	r := va.do(http.MethodGet, feedv1.Path+"?employee=alice", nil, map[string]string{
		"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
	})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "try another node") {
		t.Errorf("new feed connection: %d %s, want 503 and try another node", r.status, r.body)
	}

	for _, s := range sidecars {
		s.hasPolicy(t, "acme.main")
	}
	// The cluster's leader keeps trying the node's Raft address, and each
	// try is refused there.
	poll.Eventually(t, "the node to refuse its peers' connections a few times", func() error {
		if got := strings.Count(logs.String(), "peer connection refused"); got < 5 {
			return fmt.Errorf("%d refusals", got)
		}
		return nil
	}, poll.Within(15*time.Second))

	for _, s := range sidecars {
		s.neverGot(t, "acme.foreign")
	}
	if g, w := len(v.discovery.Clients()), len(v.feed.Clients()); g+w > 0 {
		t.Errorf("the node serves %d gRPC and %d WebSocket sidecars", g, w)
	}
	if errs := errorLines(&logs); len(errs) != 1 || !strings.Contains(errs[0], "another cluster") {
		t.Errorf("want one ERROR about the data dir, got %d:\n%s", len(errs), strings.Join(errs, "\n"))
	}
}

// TestForeignDataDirFoundLate: a node on a data dir of another cluster that
// started while its peers were down serves that data, as it cannot know;
// once its peers are back and refuse it, it closes its sidecars' streams,
// which move to the cluster's nodes and get the cluster's set, and it
// stops being ready.
func TestForeignDataDirFoundLate(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.leader()
	a := apiFor(t, leader)
	if r := a.do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	a.putPolicy("acme.main", "acme", "this cluster's policy")
	c.waitConverged()
	mainID := leader.ClusterID()

	const i = 2
	dir, foreignID := foreignDataDir(t, c.nodes[i].ID())
	for j := range c.nodes {
		c.stop(j)
	}
	var logs servertest.LogBuffer
	v := startOnForeignData(t, c, i, dir, &logs)
	poll.Eventually(t, "the node to serve with its peers down", func() error { return v.Ready(t.Context()) }, poll.Within(10*time.Second))

	d := openStream(t, dialGRPC(t, v.GRPCAddr()), "early-grpc", policy.Scope{Org: "acme", Team: "red"})
	d.ack(d.next())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+v.HTTPAddr()+feedv1.Path+"?employee=alice", nil) //nolint:bodyclose // Dial owns the body
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ws.CloseNow() }()
	if _, _, err := ws.Read(ctx); err != nil { // init
		t.Fatal(err)
	}

	start := time.Now()
	for j := range i {
		c.restart(j)
	}
	waitForeign(t, v, foreignID, mainID, true)
	t.Logf("the node stops serving the foreign data dir %v after its peers' restart began", time.Since(start).Round(time.Millisecond))
	if st := d.end(); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "try another node") {
		t.Errorf("open discovery stream: %v, want Unavailable and try another node", st)
	}
	for {
		_, _, err := ws.Read(ctx)
		if err == nil {
			continue
		}
		if websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
			t.Errorf("open feed connection ended with %v, want close 1013", err)
		}
		break
	}
	if errs := errorLines(&logs); len(errs) != 1 || !strings.Contains(errs[0], "another cluster") {
		t.Errorf("want one ERROR about the data dir, got %d:\n%s", len(errs), strings.Join(errs, "\n"))
	}
}
