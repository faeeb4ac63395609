package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/loopback"
)

// stopGrace is how long a node gets to exit after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// logTailLines is how much of each node log is printed on failure.
const logTailLines = 200

// cluster is a set of policyd processes on loopback forming one Raft
// cluster, each with its own config file, data dir and log file under dir.
type cluster struct {
	dir    string
	nodes  []*node
	binary string   // what restart runs
	env    []string // POLICYD_*=value settings of every node
	// extra is YAML appended to every node's config file (top-level keys
	// the flags and env cannot set, such as lists).
	extra string
	// token is the admin token waitReady sends; "" when auth is off.
	token string
}

// node is one policyd process.
type node struct {
	id         string
	httpAddr   string
	grpcAddr   string
	raftAddr   string
	dir        string
	configPath string
	logPath    string
	// args are the process's arguments; nil means `serve --config
	// configPath` (a policyd node).
	args []string
	// termIsClean: dying of the SIGTERM that stop sends is a clean exit
	// (etcd re-raises it after shutting down; policyd exits 0).
	termIsClean bool
	// cpus, when set, is the CPU list the process is pinned to (taskset -c).
	cpus string

	cmd     *exec.Cmd
	logFile *os.File
	exited  chan struct{} // closed when the process has exited
	waitErr error         // the process's exit status; read after exited
}

// clusterSpec describes a cluster to start.
type clusterSpec struct {
	binary   string   // the policyd binary
	dir      string   // parent of the nodes' directories
	nodes    int      // cluster size
	logLevel string   // log.level of every node
	env      []string // POLICYD_*=value settings for every node, overriding its config file
	cpus     string   // CPU list every node is pinned to (taskset -c); "" not pinned
	extra    string   // YAML appended to every node's config file
	token    string   // admin token for waitReady, with extra naming a tokens file
}

// startCluster writes the configs of the cluster under spec.dir and starts
// every node. All nodes bootstrap from the same peers list. On error the
// nodes already started are stopped.
func startCluster(spec clusterSpec) (_ *cluster, err error) {
	ports, err := loopback.FreePorts(3 * spec.nodes)
	if err != nil {
		return nil, err
	}
	dir := spec.dir
	c := &cluster{dir: dir, binary: spec.binary, env: spec.env, extra: spec.extra, token: spec.token}
	for i := range spec.nodes {
		id := "node" + strconv.Itoa(i+1)
		nd := &node{
			id:       id,
			httpAddr: loopback.Addr(ports[3*i]),
			grpcAddr: loopback.Addr(ports[3*i+1]),
			raftAddr: loopback.Addr(ports[3*i+2]),
			dir:      filepath.Join(dir, id),
			cpus:     spec.cpus,
		}
		nd.configPath = filepath.Join(nd.dir, "config.yaml")
		nd.logPath = filepath.Join(nd.dir, "node.log")
		c.nodes = append(c.nodes, nd)
	}
	for _, nd := range c.nodes {
		if err := os.MkdirAll(filepath.Join(nd.dir, "data"), 0o755); err != nil {
			return nil, fmt.Errorf("%s: create data dir: %w", nd.id, err)
		}
		if err := os.WriteFile(nd.configPath, []byte(c.config(nd, spec.logLevel)), 0o644); err != nil {
			return nil, fmt.Errorf("%s: write config: %w", nd.id, err)
		}
	}
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	for _, nd := range c.nodes {
		if err := nd.start(spec.binary, spec.env); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// startReady starts a cluster of nodes nodes from env (extraEnv comes before
// env.nodeEnv, so -node-env wins) and waits for it to be ready. It returns the
// cluster, its leader and stop, which the caller must defer as stop(&err)
// with its named result err: stop stops the cluster, adds a stop failure to
// err, and prints the node logs when err is set and ctx has not ended (an
// interrupted run is not a failure whose logs are worth reading), or when
// alsoDump (may be nil) reports true. When startReady fails, the cluster has
// been stopped already.
func startReady(ctx context.Context, env *runEnv, nodes int, alsoDump func() bool, extraEnv ...string) (
	cl *cluster, leader string, stop func(errp *error), err error,
) {
	env.logf("starting a %d-node cluster in %s", nodes, env.workDir)
	cl, err = startCluster(clusterSpec{binary: env.binary, dir: env.workDir, nodes: nodes,
		logLevel: env.nodeLogLevel, env: slices.Concat(extraEnv, env.nodeEnv), cpus: env.nodeCPUs})
	if err != nil {
		return nil, "", nil, fmt.Errorf("start cluster: %w", err)
	}
	stop = func(errp *error) {
		env.logf("stopping the cluster")
		if stopErr := cl.stop(); stopErr != nil {
			*errp = errors.Join(*errp, fmt.Errorf("stop cluster: %w", stopErr))
		}
		if *errp != nil && ctx.Err() == nil || alsoDump != nil && alsoDump() {
			cl.dumpLogs(env.stderr)
		}
	}

	readyStart := time.Now()
	if leader, err = cl.waitReady(ctx, env.readyTimeout); err != nil {
		err = fmt.Errorf("wait for the cluster: %w", err)
		stop(&err)
		return nil, "", nil, err
	}
	env.logf("cluster ready in %v, leader %s", time.Since(readyStart).Round(time.Millisecond), leader)
	return cl, leader, stop, nil
}

// config renders nd's YAML config file. Keys are config.Config's mapstructure
// tags; everything not set keeps its default.
func (c *cluster) config(nd *node, logLevel string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node_id: %s\n", nd.id)
	fmt.Fprintf(&b, "data_dir: %s\n", strconv.Quote(filepath.Join(nd.dir, "data")))
	fmt.Fprintf(&b, "log:\n  level: %s\n  format: text\n", logLevel)
	fmt.Fprintf(&b, "http:\n  addr: %s\n", nd.httpAddr)
	fmt.Fprintf(&b, "grpc:\n  addr: %s\n", nd.grpcAddr)
	fmt.Fprintf(&b, "raft:\n  addr: %s\n  bootstrap: true\n  peers:\n", nd.raftAddr)
	for _, p := range c.nodes {
		fmt.Fprintf(&b, "    - id: %s\n      address: %s\n", p.id, p.raftAddr)
	}
	b.WriteString(c.extra)
	return b.String()
}

// start runs binary with nd.args (by default `policyd serve --config`) in
// its own process group, with extraEnv added to its environment and its
// output appended to nd.logPath. With nd.cpus it runs under taskset, which
// sets the affinity before it execs binary in the same process, so every
// thread of the node is pinned and its PID is the node's.
func (nd *node) start(binary string, extraEnv []string) error {
	f, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: open log: %w", nd.id, err)
	}
	args := nd.args
	if args == nil {
		args = []string{"serve", "--config", nd.configPath}
	}
	name := binary
	if nd.cpus != "" {
		name, args = "taskset", slices.Concat([]string{"-c", nd.cpus, binary}, args)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = nd.dir
	cmd.Env = append(nodeEnv(), extraEnv...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start %s: %w", nd.id, binary, err)
	}
	nd.cmd, nd.logFile, nd.exited = cmd, f, make(chan struct{})
	go func() {
		nd.waitErr = cmd.Wait()
		f.Close()
		close(nd.exited)
	}()
	return nil
}

// kill sends SIGKILL to node i's process group and waits for it to exit: a
// crash, with no chance to close anything.
func (c *cluster) kill(i int) error {
	nd := c.nodes[i]
	if nd.cmd == nil || nd.hasExited() {
		return fmt.Errorf("%s is not running", nd.id)
	}
	if err := signalGroup(nd.cmd.Process, syscall.SIGKILL); err != nil && !nd.hasExited() {
		return fmt.Errorf("kill %s: %w", nd.id, err)
	}
	<-nd.exited
	return nil
}

// restart starts node i again, with its config and data dir, after it has
// exited.
func (c *cluster) restart(i int) error {
	nd := c.nodes[i]
	if nd.cmd != nil && !nd.hasExited() {
		return fmt.Errorf("%s is still running", nd.id)
	}
	return nd.start(c.binary, c.env)
}

// nodeEnv is bench's environment without POLICYD_* and ETCD_* variables,
// which would otherwise override the generated config files (policyd) or
// flags (etcd).
func nodeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "POLICYD_") && !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

// hasExited reports whether nd's process has ended.
func (nd *node) hasExited() bool {
	select {
	case <-nd.exited:
		return true
	default:
		return false
	}
}

// httpAddrs returns every node's admin API address, in node order.
func (c *cluster) httpAddrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		addrs[i] = nd.httpAddr
	}
	return addrs
}

// grpcAddrs returns every node's gRPC address, in node order.
func (c *cluster) grpcAddrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		addrs[i] = nd.grpcAddr
	}
	return addrs
}

// checkAlive returns an error naming every node whose process has exited.
func (c *cluster) checkAlive() error {
	var errs []error
	for _, nd := range c.nodes {
		if nd.hasExited() {
			if nd.waitErr == nil {
				errs = append(errs, fmt.Errorf("%s exited unexpectedly (exit status 0)", nd.id))
			} else {
				errs = append(errs, fmt.Errorf("%s exited unexpectedly: %w", nd.id, nd.waitErr))
			}
		}
	}
	return errors.Join(errs...)
}

// waitReady polls until every node answers /readyz with 200 and reports, in
// GET /v1/cluster, the same leader and all members with a registered
// http_addr (members register their addresses asynchronously). It returns
// the leader's ID.
func (c *cluster) waitReady(ctx context.Context, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second, Transport: withBearer(&http.Transport{Proxy: nil}, c.token)}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := c.checkAlive(); err != nil {
			return "", err
		}
		leader, notReady := c.readyOnce(ctx, client)
		if notReady == nil {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return "", fmt.Errorf("cluster not ready after %v: %w", timeout, notReady)
			}
			return "", ctx.Err()
		case <-tick.C:
		}
	}
}

// readyOnce checks readiness once; the error says what is missing.
func (c *cluster) readyOnce(ctx context.Context, client *http.Client) (string, error) {
	leader := ""
	for _, nd := range c.nodes {
		api, err := nodeAPI(client, nd.httpAddr)
		if err != nil {
			return "", err
		}
		if err := api.Do(ctx, http.MethodGet, "/readyz", nil, nil, nil); err != nil {
			return "", fmt.Errorf("%s /readyz: %w", nd.id, err)
		}
		st, err := c.status(ctx, client, nd)
		if err != nil {
			return "", err
		}
		switch {
		case st.LeaderID == "":
			return "", fmt.Errorf("%s knows no leader", nd.id)
		case leader == "":
			leader = st.LeaderID
		case st.LeaderID != leader:
			return "", fmt.Errorf("%s reports leader %s, another node %s", nd.id, st.LeaderID, leader)
		}
		if len(st.Members) != len(c.nodes) {
			return "", fmt.Errorf("%s reports %d members, want %d", nd.id, len(st.Members), len(c.nodes))
		}
		for _, m := range st.Members {
			if m.HTTPAddr == "" {
				return "", fmt.Errorf("%s: member %s has no http_addr yet", nd.id, m.ID)
			}
		}
	}
	return leader, nil
}

// status fetches GET /v1/cluster from nd.
func (c *cluster) status(ctx context.Context, client *http.Client, nd *node) (*adminclient.ClusterStatus, error) {
	api, err := nodeAPI(client, nd.httpAddr)
	if err != nil {
		return nil, err
	}
	st, err := api.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s /v1/cluster: %w", nd.id, err)
	}
	return st, nil
}

// withBearer sends token as every request's bearer token; "" leaves rt as is.
func withBearer(rt http.RoundTripper, token string) http.RoundTripper {
	if token == "" {
		return rt
	}
	return bearer{rt, "Bearer " + token}
}

// bearer is an http.RoundTripper that adds an Authorization header.
type bearer struct {
	rt   http.RoundTripper
	auth string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.auth)
	return b.rt.RoundTrip(r)
}

// CloseIdleConnections passes on to the wrapped transport.
func (b bearer) CloseIdleConnections() {
	if c, ok := b.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// nodeAPI is an admin API client of the node at addr alone, over client:
// bench chooses the node of every request, so there is no failover.
func nodeAPI(client *http.Client, addr string) (*adminclient.Client, error) {
	api, err := adminclient.New(adminclient.Config{Servers: []string{"http://" + addr}, HTTPClient: client})
	if err != nil {
		return nil, fmt.Errorf("admin client of %s: %w", addr, err)
	}
	return api, nil
}

// nodeAPIs is nodeAPI of each of addrs, in order.
func nodeAPIs(client *http.Client, addrs []string) ([]*adminclient.Client, error) {
	apis := make([]*adminclient.Client, len(addrs))
	for i, addr := range addrs {
		var err error
		if apis[i], err = nodeAPI(client, addr); err != nil {
			return nil, err
		}
	}
	return apis, nil
}

// get performs a GET and returns the status code and body.
func get(ctx context.Context, client *http.Client, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("read body: %w", err)
	}
	return resp.StatusCode, body, nil
}

// stop sends SIGTERM to every node's process group, waits up to stopGrace
// for them to exit and SIGKILLs the rest. The error lists nodes that had to
// be killed or exited with a failure status; nodes that had already exited
// before stop are reported by checkAlive, not here.
func (c *cluster) stop() error {
	var running []*node
	for _, nd := range c.nodes {
		if nd.cmd == nil || nd.hasExited() {
			continue
		}
		if err := signalGroup(nd.cmd.Process, syscall.SIGTERM); err != nil && !nd.hasExited() {
			_ = signalGroup(nd.cmd.Process, syscall.SIGKILL)
		}
		running = append(running, nd)
	}
	deadline := time.NewTimer(stopGrace)
	defer deadline.Stop()
	var errs []error
	for _, nd := range running {
		select {
		case <-nd.exited:
		case <-deadline.C:
			// Every later node gets the SIGKILL path too: the timer has fired.
			deadline.Reset(0)
		}
		if !nd.hasExited() {
			_ = signalGroup(nd.cmd.Process, syscall.SIGKILL)
			<-nd.exited
			errs = append(errs, fmt.Errorf("%s did not exit within %v of SIGTERM and was killed", nd.id, stopGrace))
			continue
		}
		var ee *exec.ExitError
		if nd.termIsClean && errors.As(nd.waitErr, &ee) && ee.String() == "signal: terminated" {
			continue
		}
		if nd.waitErr != nil {
			errs = append(errs, fmt.Errorf("%s exited after SIGTERM: %w", nd.id, nd.waitErr))
		}
	}
	return errors.Join(errs...)
}

// dumpLogs writes the tail of every node's log to w.
func (c *cluster) dumpLogs(w io.Writer) {
	for _, nd := range c.nodes {
		lines, total, err := tailFile(nd.logPath, logTailLines)
		if err != nil {
			fmt.Fprintf(w, "==== %s log: %v\n", nd.id, err)
			continue
		}
		fmt.Fprintf(w, "==== %s log (%s, last %d of %d lines) ====\n", nd.id, nd.logPath, len(lines), total)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
}

// tailFile returns the last n lines of path and its total line count.
func tailFile(path string, n int) ([]string, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var ring []string
	total := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		total++
		ring = append(ring, sc.Text())
		if len(ring) > n {
			ring = ring[1:]
		}
	}
	if err := sc.Err(); err != nil {
		return ring, total, fmt.Errorf("read %s: %w", path, err)
	}
	return ring, total, nil
}
