//go:build linux

package upgrade

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/loopback"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// Raft timings: the chaos suite's order, which holds under `make test` on two
// cores, a little longer because other packages' tests run beside this one.
const (
	heartbeatTimeout = 500 * time.Millisecond
	electionTimeout  = 500 * time.Millisecond
	leaderLease      = 250 * time.Millisecond
	// stopGrace is how long a node gets to exit after SIGTERM.
	stopGrace = 20 * time.Second
	// processBudget bounds every process's life, should cleanups never run.
	processBudget = 10 * time.Minute
	// extraKind is accepted through policies.extra_kinds.
	extraKind = "RateLimitPolicy"
)

// node is one policyd process, restarted on the same config and data dir,
// possibly with another binary.
type node struct {
	id         string
	dir        string
	configPath string
	logPath    string
	httpAddr   string
	grpcAddr   string
	raftAddr   string
	// api addresses this node only. Its answers decode into the test's
	// own types or adminclient's, both lenient: a release node's answers
	// may lack or add fields.
	api *adminclient.Client

	bin     string // the binary it runs, or ran last
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error // set before exited is closed
}

// cluster is three policyd processes on loopback forming one Raft cluster.
type cluster struct {
	t     *testing.T
	ctx   context.Context // the processes' deadline
	nodes []*node
	hc    *http.Client
}

// startCluster starts size nodes of bin that bootstrap one cluster and waits
// until it is healthy. The processes are stopped in t.Cleanup, and their
// logs shown if the test failed.
// skipShort skips a test that builds releases and runs clusters of them
// under -short (make check).
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds releases and runs a cluster: not in -short (make check)")
	}
}

func startCluster(t *testing.T, bin string, size int) *cluster {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), processBudget)
	c := &cluster{t: t, ctx: ctx, hc: &http.Client{Timeout: 20 * time.Second}}
	t.Cleanup(c.dumpLogs)
	t.Cleanup(cancel)
	t.Cleanup(c.stopAll)

	secretPath := filepath.Join(dir, "cluster-secret")
	if err := os.WriteFile(secretPath, []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ports, err := loopback.FreePorts(3 * size)
	if err != nil {
		t.Fatal(err)
	}
	for i := range size {
		id := "node" + strconv.Itoa(i+1)
		nd := &node{
			id: id, dir: filepath.Join(dir, id),
			httpAddr: loopback.Addr(ports[3*i]), grpcAddr: loopback.Addr(ports[3*i+1]), raftAddr: loopback.Addr(ports[3*i+2]),
		}
		nd.configPath, nd.logPath = filepath.Join(nd.dir, "config.yaml"), filepath.Join(nd.dir, "node.log")
		if nd.api, err = adminclient.New(adminclient.Config{Servers: []string{"http://" + nd.httpAddr}, HTTPClient: c.hc}); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
	}
	for _, nd := range c.nodes {
		if err := os.MkdirAll(filepath.Join(nd.dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(nd.configPath, []byte(c.config(nd, secretPath)), 0o644); err != nil {
			t.Fatal(err)
		}
		c.start(nd, bin)
	}
	c.waitHealthy()
	return c
}

// config renders nd's config file, the same for both binaries: an upgrade
// keeps the operator's config. Unset keys keep their defaults.
func (c *cluster) config(nd *node, secretPath string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node_id: %s\ndata_dir: %s\n", nd.id, strconv.Quote(filepath.Join(nd.dir, "data")))
	fmt.Fprintf(&b, "log:\n  level: info\n  format: text\n")
	fmt.Fprintf(&b, "http:\n  addr: %s\ngrpc:\n  addr: %s\n", nd.httpAddr, nd.grpcAddr)
	fmt.Fprintf(&b, "raft:\n  addr: %s\n  bootstrap: true\n", nd.raftAddr)
	fmt.Fprintf(&b, "  heartbeat_timeout: %v\n  election_timeout: %v\n  leader_lease_timeout: %v\n  apply_timeout: 10s\n",
		heartbeatTimeout, electionTimeout, leaderLease)
	fmt.Fprintf(&b, "  peers:\n")
	for _, p := range c.nodes {
		fmt.Fprintf(&b, "    - id: %s\n      address: %s\n", p.id, p.raftAddr)
	}
	fmt.Fprintf(&b, "cluster:\n  secret_file: %s\n", strconv.Quote(secretPath))
	fmt.Fprintf(&b, "policies:\n  extra_kinds: [%s]\n", extraKind)
	fmt.Fprintf(&b, "forward:\n  timeout: 10s\n")
	return b.String()
}

// start runs bin on nd's config, in its own process group, its output
// appended to nd's log.
func (c *cluster) start(nd *node, bin string) {
	c.t.Helper()
	f, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatalf("%s: open log: %v", nd.id, err)
	}
	fmt.Fprintf(f, "==== upgrade test: starting %s at %s\n", bin, time.Now().Format(time.RFC3339Nano))
	cmd := exec.CommandContext(c.ctx, bin, "serve", "--config", nd.configPath)
	cmd.Dir = nd.dir
	cmd.Env = servertest.CleanEnv()
	cmd.Stdout, cmd.Stderr = f, f
	// Pdeathsig: the node dies with the test binary even if cleanups never
	// run (go test -timeout panics without running them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		f.Close()
		c.t.Fatalf("%s: start %s: %v", nd.id, bin, err)
	}
	exited := make(chan struct{})
	nd.bin, nd.cmd, nd.exited = bin, cmd, exited
	go func() {
		err := cmd.Wait()
		f.Close()
		nd.waitErr = err
		close(exited)
	}()
}

func (nd *node) running() bool {
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

// stop is a graceful stop (SIGTERM): a leader hands leadership over before
// it exits. It fails the test unless nd exits cleanly within stopGrace.
func (c *cluster) stop(nd *node) {
	c.t.Helper()
	if err := c.terminate(nd); err != nil {
		c.t.Fatal(err)
	}
	nd.cmd = nil // stopped on purpose, not crashed
}

// terminate sends SIGTERM and waits; a node that hangs is killed after
// SIGQUIT has written its goroutines to its log.
func (c *cluster) terminate(nd *node) error {
	defer c.hc.CloseIdleConnections()
	if !nd.running() {
		return nil
	}
	_ = syscall.Kill(-nd.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-nd.exited:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-nd.cmd.Process.Pid, syscall.SIGQUIT)
		select {
		case <-nd.exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-nd.cmd.Process.Pid, syscall.SIGKILL)
			<-nd.exited
		}
		return fmt.Errorf("%s did not exit within %v of SIGTERM (goroutine dump in its log)", nd.id, stopGrace)
	}
	if nd.waitErr != nil {
		return fmt.Errorf("%s (%s) exited after SIGTERM: %w", nd.id, nd.bin, nd.waitErr)
	}
	return nil
}

// stopAll stops every node, reporting unclean exits.
func (c *cluster) stopAll() {
	for _, nd := range c.nodes {
		if err := c.terminate(nd); err != nil {
			c.t.Errorf("stop: %v", err)
		}
	}
}

// dumpLogs shows the end of every node's log when the test failed: from its
// last panic if it has one, so that the panic's message is not cut off.
func (c *cluster) dumpLogs() {
	if !c.t.Failed() {
		return
	}
	for _, nd := range c.nodes {
		c.t.Logf("---- %s log ----\n%s", nd.id, logExcerpt(nd.logPath, 60))
	}
}

// logExcerpt returns up to n lines of the file at path: from its last line
// that starts with "panic: ", or else its last n lines.
func logExcerpt(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	from := max(len(lines)-n, 0)
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "panic: ") {
			from = i
			break
		}
	}
	return strings.Join(lines[from:min(from+n, len(lines))], "\n")
}

// get reads path from nd into v; anything but 200 is an error.
func (c *cluster) get(nd *node, path string, v any) error {
	if err := nd.api.Do(c.ctx, http.MethodGet, path, nil, nil, v); err != nil {
		return fmt.Errorf("%s: GET %s: %w", nd.id, path, err)
	}
	return nil
}

// status reads GET /v1/cluster from nd. CommandVersion is 0 on a release
// node, which does not report it.
func (c *cluster) status(nd *node) (*adminclient.ClusterStatus, error) {
	st, err := nd.api.Cluster(c.ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: GET /v1/cluster: %w", nd.id, err)
	}
	return st, nil
}

// waitCommandVersion waits until nd reports that writes use command
// encoding want, and fails the test on timeout.
func (c *cluster) waitCommandVersion(nd *node, want uint32) {
	c.t.Helper()
	var got uint32
	var last error
	if poll.Until(context.Background(), 30*time.Second, poll.Holds(func() bool {
		var st *adminclient.ClusterStatus
		if st, last = c.status(nd); last != nil {
			return false
		}
		got = st.CommandVersion
		return got == want
	})) !=
		nil {
		c.t.Fatalf("%s: command_version %d (%v), want %d", nd.id, got, last, want)
	}
}

// errExited is a node that exited while the test expects it to run: a
// crash, such as an entry its binary cannot apply.
var errExited = errors.New("node exited")

// exited reports a node that has exited although the test did not stop it.
func (c *cluster) exited() error {
	for _, nd := range c.nodes {
		if nd.cmd != nil && !nd.running() {
			status := nd.waitErr
			if status == nil {
				status = errors.New("exit status 0")
			}
			return fmt.Errorf("%s (%s): %w: %w", nd.id, nd.bin, errExited, status)
		}
	}
	return nil
}

// waitHealthy waits until every node runs, is ready, names the same leader,
// sees every node as a voter with its addresses registered, and all have
// applied the same index. It returns the leader and fails the test on
// timeout.
func (c *cluster) waitHealthy() *node {
	c.t.Helper()
	var leader *node
	var last error
	if poll.Until(context.Background(), 90*time.Second, poll.Holds(func() bool {
		leader, last = c.healthy()
		return last == nil || errors.Is(last, errExited)
	})) !=
		nil ||
		last != nil {
		c.t.Fatalf("cluster not healthy: %v", last)
	}
	return leader
}

func (c *cluster) healthy() (*node, error) {
	if err := c.exited(); err != nil {
		return nil, err
	}
	var ref *adminclient.ClusterStatus
	for _, nd := range c.nodes {
		if err := nd.api.Do(c.ctx, http.MethodGet, "/readyz", nil, nil, nil); err != nil {
			return nil, fmt.Errorf("%s not ready: %w", nd.id, err)
		}
		st, err := c.status(nd)
		if err != nil {
			return nil, err
		}
		voters := 0
		for _, m := range st.Members {
			if m.Suffrage == "Voter" && m.HTTPAddr != "" {
				voters++
			}
		}
		switch {
		case st.LeaderID == "":
			return nil, fmt.Errorf("%s knows no leader", nd.id)
		case voters != len(c.nodes):
			return nil, fmt.Errorf("%s sees %d voters with addresses, want %d", nd.id, voters, len(c.nodes))
		case ref != nil && st.LeaderID != ref.LeaderID:
			return nil, fmt.Errorf("%s names leader %s, another node %s", nd.id, st.LeaderID, ref.LeaderID)
		case ref != nil && st.AppliedIndex != ref.AppliedIndex:
			return nil, fmt.Errorf("%s applied %d, another node %d", nd.id, st.AppliedIndex, ref.AppliedIndex)
		}
		ref = st
	}
	for _, nd := range c.nodes {
		if nd.id == ref.LeaderID {
			return nd, nil
		}
	}
	return nil, fmt.Errorf("leader %q is none of the nodes", ref.LeaderID)
}
