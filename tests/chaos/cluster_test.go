//go:build linux

package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/loopback"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// Raft timings of the chaos cluster: short, so that a run sees many
// elections, and the same order as the server package's tests, which pass
// under -race on two cores. A pause is longer than electionTimeout.
const (
	heartbeatTimeout = 400 * time.Millisecond
	electionTimeout  = 400 * time.Millisecond
	leaderLease      = 200 * time.Millisecond
	maxStaleness     = 1 * time.Second // at least 2 × the timeouts above
	// Snapshots every few hundred entries, keeping fewer trailing logs, so
	// that restarted and re-added nodes catch up by InstallSnapshot too.
	snapshotThreshold = 400
	trailingLogs      = 200
)

// node is one policyd process, restarted on the same config, data and ports.
type node struct {
	idx        int
	id         string
	dir        string
	configPath string
	logPath    string
	httpAddr   string
	grpcAddr   string
	raftAddr   string // the real listener; peers dial proxy.addr()
	proxy      *proxy
	// api addresses this node only: no failover, so that a history
	// records which node answered.
	api *adminclient.Client

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	paused  bool
}

// cluster is the three processes, their proxies and a client for their APIs.
type cluster struct {
	t     *testing.T
	bin   string
	dir   string
	nodes []*node
	net   *network
	hc    *http.Client
}

// startCluster writes the configs under dir, starts the proxies and the
// processes, and waits for a leader that every node agrees on. Everything
// is stopped in t.Cleanup.
func startCluster(t *testing.T, bin, dir string, size int) *cluster {
	t.Helper()
	ids := make([]string, size)
	for i := range ids {
		ids[i] = "node" + strconv.Itoa(i+1)
	}
	c := &cluster{t: t, bin: bin, dir: dir, net: newNetwork(ids),
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	t.Cleanup(c.stopAll)
	ports, err := loopback.FreePorts(3 * size)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		nd := &node{
			idx: i, id: id, dir: filepath.Join(dir, id),
			httpAddr: loopback.Addr(ports[3*i]), grpcAddr: loopback.Addr(ports[3*i+1]), raftAddr: loopback.Addr(ports[3*i+2]),
		}
		nd.configPath, nd.logPath = filepath.Join(nd.dir, "config.yaml"), filepath.Join(nd.dir, "node.log")
		if nd.api, err = adminclient.New(adminclient.Config{Servers: []string{"http://" + nd.httpAddr}, HTTPClient: c.hc}); err != nil {
			t.Fatal(err)
		}
		if nd.proxy, err = c.net.listen(i, nd.raftAddr); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
	}
	for _, nd := range c.nodes {
		if err := os.MkdirAll(filepath.Join(nd.dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(nd.configPath, []byte(c.config(nd)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := c.start(nd); err != nil {
			t.Fatal(err)
		}
	}
	c.waitHealthy(60 * time.Second)
	return c
}

// config renders nd's config file; unset keys keep their defaults.
func (c *cluster) config(nd *node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node_id: %s\ndata_dir: %s\n", nd.id, strconv.Quote(filepath.Join(nd.dir, "data")))
	fmt.Fprintf(&b, "log:\n  level: info\n  format: text\n")
	fmt.Fprintf(&b, "http:\n  addr: %s\n", nd.httpAddr)
	fmt.Fprintf(&b, "grpc:\n  addr: %s\n", nd.grpcAddr)
	fmt.Fprintf(&b, "raft:\n  addr: %s\n  advertise: %s\n  bootstrap: true\n", nd.raftAddr, nd.proxy.addr())
	fmt.Fprintf(&b, "  heartbeat_timeout: %v\n  election_timeout: %v\n  leader_lease_timeout: %v\n",
		heartbeatTimeout, electionTimeout, leaderLease)
	fmt.Fprintf(&b, "  snapshot_interval: 2s\n  snapshot_threshold: %d\n  trailing_logs: %d\n  apply_timeout: 5s\n",
		snapshotThreshold, trailingLogs)
	if *flagLogStore != "" {
		fmt.Fprintf(&b, "  log_store: %s\n", *flagLogStore)
	}
	fmt.Fprintf(&b, "  peers:\n")
	for _, p := range c.nodes {
		fmt.Fprintf(&b, "    - id: %s\n      address: %s\n", p.id, p.proxy.addr())
	}
	fmt.Fprintf(&b, "forward:\n  timeout: 5s\n")
	// Isolations and pauses longer than this make a node close its
	// sidecars' streams (setup.max_staleness): the sidecar checks then
	// cover the move to another node and back.
	fmt.Fprintf(&b, "setup:\n  max_staleness: %v\n", maxStaleness)
	return b.String()
}

// start runs nd's process in its own process group, its output appended to
// its log.
func (c *cluster) start(nd *node) error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	f, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: open log: %w", nd.id, err)
	}
	fmt.Fprintf(f, "==== chaos: starting %s at %s\n", nd.id, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, "serve", "--config", nd.configPath)
	cmd.Dir = nd.dir
	cmd.Env = servertest.CleanEnv()
	cmd.Stdout, cmd.Stderr = f, f
	// Pdeathsig: the node dies with the test binary even if cleanups never
	// run (go test -timeout panics without running them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", nd.id, err)
	}
	exited := make(chan struct{})
	nd.cmd, nd.exited, nd.paused = cmd, exited, false
	go func() {
		err := cmd.Wait()
		f.Close()
		nd.mu.Lock()
		nd.waitErr = err
		nd.mu.Unlock()
		close(exited)
	}()
	return nil
}

func (nd *node) running() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.exited:
		return false
	default:
		return true
	}
}

func (nd *node) isPaused() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.paused
}

// signal sends sig to nd's process group.
func (nd *node) signal(sig syscall.Signal) error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return fmt.Errorf("%s: not started", nd.id)
	}
	switch sig {
	case syscall.SIGSTOP:
		nd.paused = true
	case syscall.SIGCONT:
		nd.paused = false
	}
	if err := syscall.Kill(-nd.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("%s: kill -%v: %w", nd.id, sig, err)
	}
	return nil
}

// waitExit waits up to timeout for nd's process to end.
func (nd *node) waitExit(timeout time.Duration) bool {
	nd.mu.Lock()
	exited := nd.exited
	nd.mu.Unlock()
	if exited == nil {
		return true
	}
	select {
	case <-exited:
		return true
	case <-time.After(timeout):
		return false
	}
}

// kill is kill -9.
func (c *cluster) kill(nd *node) {
	c.t.Helper()
	if !nd.running() {
		return
	}
	_ = nd.signal(syscall.SIGKILL)
	if !nd.waitExit(30 * time.Second) {
		c.t.Fatalf("%s survived SIGKILL", nd.id)
	}
}

// terminate is a graceful stop (SIGTERM); it reports whether the node exited
// in time and cleanly, and kills it if not.
func (c *cluster) terminate(nd *node) error {
	if !nd.running() {
		return nil
	}
	_ = nd.signal(syscall.SIGCONT)
	_ = nd.signal(syscall.SIGTERM)
	if !nd.waitExit(20 * time.Second) {
		// SIGQUIT makes the Go runtime write every goroutine's stack to
		// the node's log before it exits: the evidence of what hung.
		_ = nd.signal(syscall.SIGQUIT)
		nd.waitExit(5 * time.Second)
		c.kill(nd)
		return fmt.Errorf("%s did not exit within 20s of SIGTERM (goroutine dump in its node.log)", nd.id)
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.waitErr != nil {
		return fmt.Errorf("%s exited after SIGTERM: %w", nd.id, nd.waitErr)
	}
	return nil
}

// restart starts nd again if it is not running.
func (c *cluster) restart(nd *node) {
	c.t.Helper()
	if nd.running() {
		return
	}
	if err := c.start(nd); err != nil {
		c.t.Fatal(err)
	}
}

// stopAll ends every process and proxy. Graceful first, so that a run's
// end also checks clean shutdown; the logs say if a node had to be killed.
func (c *cluster) stopAll() {
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.terminate(nd); err != nil {
				c.t.Errorf("stop: %v", err)
			}
		}()
	}
	wg.Wait()
	if err := c.net.close(); err != nil {
		c.t.Errorf("close proxies: %v", err)
	}
	c.hc.CloseIdleConnections()
}

// status reads GET /v1/cluster from nd.
func (c *cluster) status(nd *node) (*adminclient.ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := nd.api.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: GET /v1/cluster: %w", nd.id, err)
	}
	return st, nil
}

// leader returns the node that every running, unpaused node names leader,
// or nil.
func (c *cluster) leader() *node {
	var leader string
	for _, nd := range c.nodes {
		if !nd.running() || nd.isPaused() {
			continue
		}
		st, err := c.status(nd)
		if err != nil || st.LeaderID == "" || leader != "" && st.LeaderID != leader {
			return nil
		}
		leader = st.LeaderID
	}
	for _, nd := range c.nodes {
		if nd.id == leader {
			return nd
		}
	}
	return nil
}

// waitHealthy waits until every node runs, agrees on one leader, has every
// node as a voter with registered addresses, and all have applied the same
// index with the same digest. It fails the test on timeout.
func (c *cluster) waitHealthy(timeout time.Duration) {
	c.t.Helper()
	if err := poll.Until(context.Background(), timeout, c.healthy); err != nil {
		c.t.Fatalf("cluster not healthy after %v: %v", timeout, err)
	}
}

func (c *cluster) healthy() error {
	var ref *adminclient.ClusterStatus
	for _, nd := range c.nodes {
		if !nd.running() {
			return fmt.Errorf("%s is not running", nd.id)
		}
		st, err := c.status(nd)
		if err != nil {
			return err
		}
		if st.LeaderID == "" {
			return fmt.Errorf("%s knows no leader", nd.id)
		}
		voters := 0
		for _, m := range st.Members {
			if m.Suffrage == "Voter" && m.HTTPAddr != "" {
				voters++
			}
		}
		if voters != len(c.nodes) {
			return fmt.Errorf("%s sees %d registered voters of %d", nd.id, voters, len(c.nodes))
		}
		if ref == nil {
			ref = st
			continue
		}
		if st.LeaderID != ref.LeaderID || st.AppliedIndex != ref.AppliedIndex || st.Digest != ref.Digest {
			return fmt.Errorf("%s: leader %s applied %d digest %.12s; %s: leader %s applied %d digest %.12s",
				ref.NodeID, ref.LeaderID, ref.AppliedIndex, ref.Digest, st.NodeID, st.LeaderID, st.AppliedIndex, st.Digest)
		}
	}
	return nil
}
