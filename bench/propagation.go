package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"time"

	"github.com/policyd/policyd/adminclient"
)

// Issue targets for propagation (p99 from PUT ack to every sidecar holding
// the write).
const (
	targetGRPCP99  = 250 * time.Millisecond // 1k gRPC streams over 3 nodes
	targetWSP99    = 500 * time.Millisecond // 10k WebSocket connections on one node
	targetMixedP99 = 500 * time.Millisecond // 10k gRPC + 10k WebSocket on one node
	mixedTargetMin = 10000                  // sidecars of each kind for the mixed target
)

// propagationTarget is the target a run's figure for transport k is
// judged against. A run with at least 10,000 sidecars of each kind on one
// node is the mixed run, for both transports; otherwise each transport
// keeps its own target.
func propagationTarget(cfg propagationConfig, k sidecarKind) (time.Duration, string) {
	switch {
	case cfg.nodes == 1 && cfg.streams >= mixedTargetMin && cfg.ws >= mixedTargetMin:
		return targetMixedP99, "p99 ≤ 500 ms at 10k grpc + 10k ws on one node"
	case k == kindGRPC:
		return targetGRPCP99, "p99 ≤ 250 ms at 1k streams"
	default:
		return targetWSP99, "p99 ≤ 500 ms at 10k ws on one node"
	}
}

// propagationConfig holds the propagation scenario's flags.
type propagationConfig struct {
	sidecarFlags
	writes    int
	interval  time.Duration
	orgs      int
	timeout   time.Duration
	grpcScope string
	grpcHead  bool
	// sdk runs every sidecar through the client SDK (sdkFleet) instead of
	// the lighter simulated ones (fleet).
	sdk bool
	// policySize pads every policy's body to this many bytes (0: compact,
	// about 150 bytes).
	policySize int
	connOut    string
	// profileDir, when set, receives CPU profiles of every node and of
	// bench itself (the sidecars share the CPUs), taken over
	// the first profileFor of the writes.
	profileDir string
	profileFor time.Duration
}

// propagationScenario measures how long a committed write takes to reach
// every connected sidecar: -streams gRPC discovery streams and -ws
// WebSocket feed connections, spread round robin over the nodes, each
// timestamping every message on receipt. For each write (a PUT to the next
// node in turn) the latency of a sidecar is the time it received the
// message carrying the write's policy-set version minus the time the PUT's
// response arrived; a write's figure is the largest over the sidecars of a
// transport ("every sidecar holds it").
func propagationScenario() scenario {
	return scenario{
		name:    "propagation",
		summary: "latency from a PUT's ack to every gRPC stream / WebSocket holding the write",
		setup: func(fs *flag.FlagSet) runner {
			c := &propagationConfig{}
			c.register(fs, sidecarFlagDefaults{
				streams: 1000, streamsUsage: "gRPC discovery streams",
				ws: 1000, wsUsage: "WebSocket feed connections",
				nodes: 3, nodesUsage: "cluster size (1 for the one-node runs)",
				policies: 10, policiesUsage: "policies per org; each write updates one of them, so the set size stays constant",
				streamsPerConn: 100, streamsPerConnUsage: "gRPC streams multiplexed on one client connection (a real sidecar has its own;\n" +
					"1000s of TCP connections from one process are fine, but 100 keeps the client light)",
			})
			fs.IntVar(&c.writes, "writes", 50, "measured writes")
			fs.DurationVar(&c.interval, "interval", 200*time.Millisecond,
				"time from one write's PUT to the next; a write is only sent once every sidecar\nholds the previous one (or -timeout passed), so writes never overlap")
			fs.IntVar(&c.orgs, "orgs", 1, "orgs the sidecars are spread over (sidecar i in org i mod orgs); write i goes\nto org i mod orgs, so with 1 every sidecar sees every write")
			fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long a write may take to reach every sidecar; the rest count as missing")
			fs.StringVar(&c.grpcScope, "grpc-scope", "employee",
				"scope a gRPC stream asks for: employee (its own identity, like a real sidecar: one\nserver-side snapshot per stream), team or org (all streams of an org share one)")
			fs.BoolVar(&c.sdk, "sdk", true,
				"run every sidecar through the client SDK, as a real one: every message decoded in full and\n"+
					"compiled, gRPC sidecars sharing -streams-per-conn connections (client.Config.GRPCConn);\n"+
					"false: lighter simulated sidecars (gRPC ones decode every response, WebSocket ones read only\n"+
					"type and digest), which leave more of the shared CPUs to the nodes")
			fs.BoolVar(&c.grpcHead, "grpc-head", false,
				"with -sdk=false: gRPC sidecars read only version_info and nonce of a response, as WebSocket\n"+
					"sidecars read only type and digest, instead of decoding every policy (a lighter load generator)")
			fs.IntVar(&c.policySize, "policy-size", 0, "pad every policy's JSON body to this many bytes (0: compact, about 150 bytes; the\nwrites scenario uses 4096)")
			fs.StringVar(&c.connOut, "conn-out", "", "write every sidecar's latency for every write to this CSV file")
			fs.StringVar(&c.profileDir, "cpu-profile", "", "write CPU profiles of every policyd node (GET /debug/pprof/profile) and of bench\n"+
				"itself, taken from the first write for -cpu-profile-for, to this directory as\n<node>-<role>-propagation.pprof and bench-propagation.pprof")
			fs.DurationVar(&c.profileFor, "cpu-profile-for", 10*time.Second, "length of the -cpu-profile window")
			return c
		},
	}
}

func (c *propagationConfig) validate() error {
	errs := c.sidecarFlags.validate(1)
	if c.writes < 1 {
		errs = append(errs, fmt.Errorf("-writes must be at least 1, got %d", c.writes))
	}
	if c.interval < 0 {
		errs = append(errs, fmt.Errorf("-interval must not be negative, got %v", c.interval))
	}
	if c.orgs < 1 {
		errs = append(errs, fmt.Errorf("-orgs must be at least 1, got %d", c.orgs))
	}
	if c.timeout <= 0 {
		errs = append(errs, fmt.Errorf("-timeout must be positive, got %v", c.timeout))
	}
	if c.policySize < 0 || c.policySize > maxBodySize {
		errs = append(errs, fmt.Errorf("-policy-size must be between 0 and %d (the server's body limit), got %d", maxBodySize, c.policySize))
	}
	if c.profileDir != "" && c.profileFor < time.Second {
		errs = append(errs, fmt.Errorf("-cpu-profile-for must be at least 1s, got %v", c.profileFor))
	}
	if c.sdk && c.grpcHead {
		errs = append(errs, errors.New("-grpc-head needs -sdk=false: the SDK decodes every message"))
	}
	if !slices.Contains([]string{"employee", "team", "org"}, c.grpcScope) {
		errs = append(errs, fmt.Errorf("-grpc-scope must be employee, team or org, got %q", c.grpcScope))
	}
	return errors.Join(errs...)
}

// writeResult is what one write measured.
type writeResult struct {
	seq     int // 1-based
	node    int // the node that took the PUT
	org     int
	version string
	sent    time.Duration      // when the PUT was sent, on the fleet clock
	ack     time.Duration      // when the PUT's response arrived, on the fleet clock
	wait    *holdWait          // per sidecar: when it held version
	missing [2]int             // per kind: expected sidecars that never held it
	lat     [2][]time.Duration // per kind: latency of each sidecar that held it
}

func (c *propagationConfig) run(ctx context.Context, env *runEnv) (err error) {
	cfg := *c
	if err := cfg.checkFileLimit(env.fileLimit); err != nil {
		return err
	}
	cl, leader, stop, err := startReady(ctx, env, cfg.nodes, nil, inactivityEnv)
	if err != nil {
		return err
	}
	var fl *fleet
	defer func() {
		if fl != nil {
			env.logf("closing the sidecars")
			fl.close()
		}
		stop(&err)
	}()

	client := newLoadClient(32, cfg.nodes, 30*time.Second)
	defer client.CloseIdleConnections()
	addrs := cl.httpAddrs()
	if err := seedPolicies(ctx, client, addrs, cfg.orgs, cfg.policies, cfg.policySize); err != nil {
		return fmt.Errorf("seed policies: %w", err)
	}
	if cfg.ws > 0 {
		start := time.Now()
		if err := seedEmployees(ctx, client, addrs, cfg.ws, cfg.orgs); err != nil {
			return fmt.Errorf("seed employees: %w", err)
		}
		env.logf("created %d employees in %v", cfg.ws, time.Since(start).Round(time.Millisecond))
	}
	initial := map[int]string{}
	for k := range cfg.orgs {
		if initial[k], err = orgVersion(ctx, client, addrs[0], orgName(k), true); err != nil {
			return err
		}
	}

	env.logf("opening %d gRPC streams (%d per connection, scope %s) and %d WebSocket connections over %d node(s), %s sidecars",
		cfg.streams, cfg.streamsPerConn, cfg.grpcScope, cfg.ws, cfg.nodes, cfg.sidecarKind())
	openStart := time.Now()
	if fl, err = openPropagationFleet(ctx, cl, cfg); err != nil {
		return fmt.Errorf("open sidecars: %w", err)
	}
	w := fl.watch(initial)
	complete, err := fl.wait(ctx, w, cfg.connectTimeout)
	if err != nil {
		return err
	}
	if !complete {
		return fmt.Errorf("after %v, %d of %d sidecars do not hold the initial version (%d gRPC and %d WebSocket connections ended); first errors: %q",
			cfg.connectTimeout, countMissing(w), len(w.expected), fl.deaths[kindGRPC].Load(), fl.deaths[kindWS].Load(), fl.errors())
	}
	connectTime := time.Since(openStart)
	env.logf("every sidecar holds the initial version %v after opening started", connectTime.Round(time.Millisecond))
	if err := cl.checkAlive(); err != nil {
		return err
	}
	msgsBefore := [2]int64{fl.msgs[0].Load(), fl.msgs[1].Load()}
	serverBefore := serverLatencies(ctx, client, cl)
	cpuBefore := cpuNow(cl)
	if cfg.profileDir != "" {
		profiles, err := profileWrites(ctx, cl, leader, cfg.profileDir, cfg.profileFor)
		if err != nil {
			return err
		}
		defer func() {
			if perr := profiles(); perr != nil {
				env.logf("warning: CPU profiles: %v", perr)
			} else {
				env.logf("CPU profiles of the first %v of the writes written to %s", cfg.profileFor, cfg.profileDir)
			}
		}()
	}

	var results []*writeResult
	next := time.Now()
	for i := range cfg.writes {
		if err := sleepUntil(ctx, next); err != nil {
			return err
		}
		next = time.Now().Add(cfg.interval)
		r, err := propagateOne(ctx, client, cl, fl, cfg, i)
		if err != nil {
			return fmt.Errorf("write %d: %w", i+1, err)
		}
		results = append(results, r)
		if m := r.missing[kindGRPC] + r.missing[kindWS]; m > 0 {
			env.logf("write %d: %d sidecar(s) did not hold version %.12s within %v", r.seq, m, r.version, cfg.timeout)
		}
		if err := cl.checkAlive(); err != nil {
			return err
		}
	}

	cpuAfter := cpuNow(cl)
	serverAfter := serverLatencies(ctx, client, cl)
	if cfg.connOut != "" {
		if err := writeConnLatencies(cfg.connOut, fl, results); err != nil {
			return err
		}
		env.logf("per-sidecar latencies written to %s", cfg.connOut)
	}
	for _, k := range []sidecarKind{kindGRPC, kindWS} {
		n := fl.count(k)
		if n == 0 {
			continue
		}
		f := propagationFigureFor(cfg, k, n, results)
		f.ConnectS = round2(connectTime.Seconds())
		f.Messages = fl.msgs[k].Load() - msgsBefore[k]
		f.ConnErrors = fl.deaths[k].Load()
		f.serverQuantiles(serverBefore[k], serverAfter[k], serverHistograms[k].scale)
		f.cpuShare(cpuBefore, cpuAfter)
		f.NodeCPUs, f.LoadCPUs = env.nodeCPUs, env.loadCPUs
		if err := env.emit(f); err != nil {
			return err
		}
	}
	if errs := fl.errors(); len(errs) > 0 {
		env.logf("sidecar connections that ended (first %d): %q", len(errs), errs)
	}
	if env.loadCPUs != "" {
		env.logf("note: the %d node(s) ran on CPU(s) %s and this load generator on CPU(s) %s", cfg.nodes, env.nodeCPUs, env.loadCPUs)
		return nil
	}
	env.logf("note: the %d node(s) and this load generator share the machine's %d CPU(s); "+
		"the latencies include the generator's own scheduling delay", cfg.nodes, runtime.NumCPU())
	return nil
}

// sidecarKind names the sidecars of a run in its figures.
func (c *propagationConfig) sidecarKind() string {
	if c.sdk {
		return "sdk"
	}
	return "simulated"
}

// openPropagationFleet opens the run's sidecars: SDK clients (-sdk) or
// simulated ones.
func openPropagationFleet(ctx context.Context, cl *cluster, cfg propagationConfig) (*fleet, error) {
	if cfg.sdk {
		sf, err := openSDKFleet(ctx, cl, sdkFleetSpec{grpc: cfg.streams, ws: cfg.ws, orgs: cfg.orgs, grpcScope: cfg.grpcScope,
			streamsPerConn: cfg.streamsPerConn, startConcurrency: cfg.dialConcurrency})
		if err != nil {
			return nil, err
		}
		return sf.fleet, nil
	}
	return openFleet(ctx, fleetSpec{grpc: cfg.streams, ws: cfg.ws, grpcAddrs: cl.grpcAddrs(), httpAddrs: cl.httpAddrs(),
		nodes: cfg.nodes, orgs: cfg.orgs, grpcScope: cfg.grpcScope, grpcHead: cfg.grpcHead, streamsPerConn: cfg.streamsPerConn,
		dialConcurrency: cfg.dialConcurrency})
}

// propagateOne sends write i and waits for every sidecar of its org to
// hold it.
func propagateOne(ctx context.Context, client *http.Client, cl *cluster, fl *fleet, cfg propagationConfig, i int) (*writeResult, error) {
	r := &writeResult{seq: i + 1, node: i % cfg.nodes, org: i % cfg.orgs}
	name := propPolicyName(r.org, (i/cfg.orgs)%cfg.policies)
	addr := cl.nodes[r.node].httpAddr
	api, err := nodeAPI(client, addr)
	if err != nil {
		return nil, err
	}
	r.sent = fl.since()
	_, err = api.PutPolicy(ctx, name, propPolicyBody(name, orgName(r.org), r.seq, cfg.policySize), adminclient.AnyRevision)
	r.ack = fl.since()
	if err != nil {
		return nil, fmt.Errorf("PUT %s to %s: %w", name, cl.nodes[r.node].id, err)
	}
	// The node answered after applying the write, and bench is the only
	// writer: its version now is the write's.
	if r.version, err = orgVersion(ctx, client, addr, orgName(r.org), false); err != nil {
		return nil, err
	}
	r.wait = fl.watch(map[int]string{r.org: r.version})
	if _, err := fl.wait(ctx, r.wait, cfg.timeout); err != nil {
		return nil, err
	}
	for _, idx := range r.wait.expected {
		k := fl.cars[idx].kind
		if at, ok := r.wait.heldAt(idx); ok {
			r.lat[k] = append(r.lat[k], at-r.ack)
		} else {
			r.missing[k]++
		}
	}
	return r, nil
}

// profileWrites starts CPU profiles of every node of cl and of this
// process, each of length d, and returns a function that waits for them to
// be written to dir.
func profileWrites(ctx context.Context, cl *cluster, leader, dir string, d time.Duration) (func() error, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create profile dir: %w", err)
	}
	path := filepath.Join(dir, "bench-propagation.pprof")
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("start bench CPU profile: %w", err)
	}
	nodes := profileNodes(ctx, cl, leader, dir, "propagation", 0, d)
	// Stopped on time, not when the caller waits, so that bench's window
	// is the nodes'.
	stopped := make(chan error, 1)
	go func() {
		_ = sleepUntil(ctx, time.Now().Add(d))
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			stopped <- fmt.Errorf("write %s: %w", path, err)
			return
		}
		stopped <- nil
	}()
	return func() error {
		return errors.Join(nodes(), <-stopped)
	}, nil
}

// cpuReading is the CPU time used so far by bench and by the nodes, and
// when it was read; ok is false when /proc could not be read.
//
// nodeWrites is the nodes' write system calls so far (writesOK false when
// unreadable): per sidecar message, it shows how well the node batches
// messages to one connection (gRPC streams multiplexed on it) into one
// write.
type cpuReading struct {
	at         time.Time
	gen, nodes time.Duration
	ok         bool
	nodeWrites uint64
	writesOK   bool
}

func cpuNow(cl *cluster) cpuReading {
	r := cpuReading{at: time.Now(), ok: true, writesOK: true}
	var err error
	if r.gen, err = procCPU("self"); err != nil {
		r.ok = false
	}
	for _, nd := range cl.nodes {
		pid := strconv.Itoa(nd.cmd.Process.Pid)
		d, err := procCPU(pid)
		if err != nil {
			r.ok = false
		}
		r.nodes += d
		w, err := procWriteSyscalls(pid)
		if err != nil {
			r.writesOK = false
		}
		r.nodeWrites += w
	}
	return r
}

// cpuShare sets the CPU figures of the writes phase.
func (f *propagationFigure) cpuShare(before, after cpuReading) {
	f.WallS = round2(after.at.Sub(before.at).Seconds())
	if before.ok && after.ok {
		f.GenCPUS = round2((after.gen - before.gen).Seconds())
		f.NodesCPUS = round2((after.nodes - before.nodes).Seconds())
	}
	if before.writesOK && after.writesOK && f.Writes > 0 {
		f.NodesWriteSyscallsPerWrite = (after.nodeWrites - before.nodeWrites) / uint64(f.Writes) //nolint:gosec // Writes > 0
	}
}

// serverHistograms are the nodes' own per-message delivery latency
// histograms (from the local commit of a change to the message being
// written to a socket), per kind, and the factor from their unit to ms.
var serverHistograms = [2]struct {
	name  string
	scale float64
}{
	kindGRPC: {"policyd_discovery_push_latency_seconds", 1000},
	kindWS:   {"policy_broadcast_latency_ms", 1},
}

// serverLatencies returns the buckets of serverHistograms summed over every
// node; a node whose /metrics fails is left out.
func serverLatencies(ctx context.Context, client *http.Client, cl *cluster) [2]map[float64]float64 {
	var out [2]map[float64]float64
	for k := range out {
		out[k] = map[float64]float64{}
	}
	for _, nd := range cl.nodes {
		body, err := fetchMetrics(ctx, client, nd.httpAddr)
		if err != nil {
			continue
		}
		for k, h := range serverHistograms {
			for b, v := range parsePromHistogram(body, h.name) {
				out[k][b] += v
			}
		}
	}
	return out
}

// serverQuantiles sets the server-side figures from the delta between two
// readings of a serverHistograms histogram.
func (f *propagationFigure) serverQuantiles(before, after map[float64]float64, scale float64) {
	bound := func(b float64) string {
		if math.IsInf(b, 1) {
			return "+Inf"
		}
		return strconv.FormatFloat(b*scale, 'f', -1, 64)
	}
	p50, n := histogramQuantile(before, after, 0.50)
	p99, _ := histogramQuantile(before, after, 0.99)
	f.ServerSamples = n
	if n > 0 {
		f.ServerP50Ms, f.ServerP99Ms = bound(p50), bound(p99)
	}
}

// countMissing counts the sidecars w expected that do not hold its version.
func countMissing(w *holdWait) int {
	n := 0
	for _, idx := range w.expected {
		if _, ok := w.heldAt(idx); !ok {
			n++
		}
	}
	return n
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// propagationFigure is one transport's result, printed as one JSON line.
type propagationFigure struct {
	Scenario  string `json:"scenario"`
	Transport string `json:"transport"`
	// Sidecars is sdk (client SDK) or simulated (-sdk=false).
	Sidecars       string `json:"sidecars"`
	Nodes          int    `json:"nodes"`
	Conns          int    `json:"conns"`
	Orgs           int    `json:"orgs"`
	PoliciesPerOrg int    `json:"policies_per_org"`
	PolicySize     int    `json:"policy_size,omitempty"`
	GRPCScope      string `json:"grpc_scope,omitempty"`
	// GRPCDecode is how much of a response a gRPC sidecar decodes: full
	// (every policy) or head (version_info and nonce, -grpc-head).
	GRPCDecode     string  `json:"grpc_decode,omitempty"`
	StreamsPerConn int     `json:"streams_per_conn,omitempty"`
	IntervalMs     float64 `json:"interval_ms"`
	ConnectS       float64 `json:"connect_s"` // opening every sidecar until all hold the initial version
	Writes         int     `json:"writes"`
	// A write is complete for the transport when every one of its
	// sidecars that should see it held it within the timeout; the
	// "every sidecar holds it" latencies are over complete writes.
	Complete int     `json:"complete_writes"`
	P50Ms    float64 `json:"p50_ms"`
	P90Ms    float64 `json:"p90_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	MeanMs   float64 `json:"mean_ms"`
	// Per sidecar and write (pooled): how long each one took. A sidecar
	// on the node that took the PUT can be negative: the node pushes as
	// soon as it applies, before the HTTP response is written.
	ConnSamples int     `json:"conn_samples"`
	ConnP50Ms   float64 `json:"conn_p50_ms"`
	ConnP99Ms   float64 `json:"conn_p99_ms"`
	// Missing counts (sidecar, write) pairs where the sidecar did not
	// hold the write within the timeout; ConnErrors sidecars whose
	// connection ended during the run.
	Missing    int   `json:"missing"`
	ConnErrors int64 `json:"conn_errors"`
	// Messages is the number of set-carrying messages the transport's
	// sidecars received during the writes (ideally writes × conns / orgs).
	Messages int64 `json:"messages"`
	// PUT round trip (sent to ack), and the "every sidecar holds it"
	// latency counted from the PUT being sent instead of acknowledged.
	PutP50Ms      float64 `json:"put_p50_ms"`
	PutP99Ms      float64 `json:"put_p99_ms"`
	FromSendP50Ms float64 `json:"from_send_p50_ms"`
	FromSendP99Ms float64 `json:"from_send_p99_ms"`
	// The nodes' own measure (their delivery histograms, summed over the
	// nodes): from the local commit to the message written to the socket,
	// per message, as the upper bound of the bucket holding the quantile.
	// Compared with conn_p50/p99_ms, it shows how much of the latency is
	// the server and how much the load generator or the commit-to-ack gap.
	ServerSamples int64   `json:"server_samples"`
	ServerP50Ms   string  `json:"server_p50_ms_le,omitempty"`
	ServerP99Ms   string  `json:"server_p99_ms_le,omitempty"`
	TargetP99Ms   float64 `json:"target_p99_ms"`
	Target        string  `json:"target"`
	TargetMet     bool    `json:"target_met"`
	CPUs          int     `json:"cpus"` // shared by the nodes and the load generator, unless pinned
	// NodeCPUs and LoadCPUs are the CPU lists the nodes and bench (the load
	// generator) were pinned to (-node-cpus, -load-cpus); empty: not pinned.
	NodeCPUs string `json:"node_cpus,omitempty"`
	LoadCPUs string `json:"load_cpus,omitempty"`
	// The writes phase: its wall time, and the CPU time bench (the load
	// generator: every simulated sidecar) and the nodes used in it, from
	// /proc (0 where unavailable). wall_s × cpus is the CPU there was.
	WallS     float64 `json:"wall_s"`
	GenCPUS   float64 `json:"gen_cpu_s"`
	NodesCPUS float64 `json:"nodes_cpu_s"`
	// NodesWriteSyscallsPerWrite is the nodes' write system calls in the
	// writes phase per measured write, for both transports together
	// (/proc/<pid>/io; 0 where unavailable). Each WebSocket needs one per
	// message; gRPC streams that share a connection can share one.
	NodesWriteSyscallsPerWrite uint64 `json:"nodes_write_syscalls_per_write"`
}

// propagationFigureFor summarizes the results of transport k (n sidecars).
func propagationFigureFor(cfg propagationConfig, k sidecarKind, n int, results []*writeResult) *propagationFigure {
	var all, pooled, puts, fromSend []time.Duration
	missing := 0
	for _, r := range results {
		missing += r.missing[k]
		pooled = append(pooled, r.lat[k]...)
		puts = append(puts, r.ack-r.sent)
		if r.missing[k] == 0 && len(r.lat[k]) > 0 {
			last := slices.Max(r.lat[k])
			all = append(all, last)
			fromSend = append(fromSend, last+r.ack-r.sent)
		}
	}
	s, conn, put, send := summarize(all), summarize(pooled), summarize(puts), summarize(fromSend)
	f := &propagationFigure{
		Scenario: "propagation", Transport: k.String(), Sidecars: cfg.sidecarKind(), Nodes: cfg.nodes, Conns: n, Orgs: cfg.orgs,
		PoliciesPerOrg: cfg.policies, PolicySize: cfg.policySize, IntervalMs: ms(cfg.interval), Writes: len(results), Complete: s.count,
		P50Ms: ms(s.p50), P90Ms: ms(s.p90), P99Ms: ms(s.p99), MaxMs: ms(s.max), MeanMs: ms(s.mean),
		ConnSamples: conn.count, ConnP50Ms: ms(conn.p50), ConnP99Ms: ms(conn.p99),
		Missing: missing, CPUs: runtime.NumCPU(),
		PutP50Ms: ms(put.p50), PutP99Ms: ms(put.p99), FromSendP50Ms: ms(send.p50), FromSendP99Ms: ms(send.p99),
	}
	if k == kindGRPC {
		f.GRPCScope, f.StreamsPerConn = cfg.grpcScope, cfg.streamsPerConn
		f.GRPCDecode = "full"
		if cfg.grpcHead {
			f.GRPCDecode = "head"
		}
	}
	target, label := propagationTarget(cfg, k)
	f.TargetP99Ms, f.Target = ms(target), label
	f.TargetMet = s.count == len(results) && s.count > 0 && f.P99Ms <= f.TargetP99Ms
	return f
}

func (f *propagationFigure) columns() []string {
	return []string{"scenario", "transport", "sidecars", "nodes", "conns", "orgs", "writes", "complete",
		"p50 ms", "p99 ms", "max ms", "conn p50", "conn p99", "server p50/p99", "missing", "conn errs", "target", "met", "cpus", "cpu-s gen/nodes/avail"}
}

func (f *propagationFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	met := "no"
	if f.TargetMet {
		met = "yes"
	}
	server := "n/a"
	if f.ServerSamples > 0 {
		server = "≤" + f.ServerP50Ms + "/≤" + f.ServerP99Ms
	}
	scenario, cpus := f.Scenario, strconv.Itoa(f.CPUs)+" shared"
	if f.pinned() {
		scenario, cpus = f.Scenario+" pinned", "node "+orAll(f.NodeCPUs)+", load "+orAll(f.LoadCPUs)
	}
	return []string{scenario, f.Transport, f.Sidecars, strconv.Itoa(f.Nodes), strconv.Itoa(f.Conns), strconv.Itoa(f.Orgs),
		strconv.Itoa(f.Writes), strconv.Itoa(f.Complete), num(f.P50Ms), num(f.P99Ms), num(f.MaxMs),
		num(f.ConnP50Ms), num(f.ConnP99Ms), server, strconv.Itoa(f.Missing), strconv.FormatInt(f.ConnErrors, 10),
		f.Target, met, cpus,
		num(f.GenCPUS) + "/" + num(f.NodesCPUS) + "/" + num(round2(f.WallS*float64(f.CPUs)))}
}

// pinned reports whether the nodes or bench ran pinned to CPUs.
func (f *propagationFigure) pinned() bool { return f.NodeCPUs != "" || f.LoadCPUs != "" }

// pinning describes the run's pinning for a target's text ("" unpinned).
func (f *propagationFigure) pinning() string {
	if !f.pinned() {
		return ""
	}
	return fmt.Sprintf(", pinned: node CPU(s) %s, load CPU(s) %s", orAll(f.NodeCPUs), orAll(f.LoadCPUs))
}

// orAll is a CPU list, or "all" for one that was not pinned.
func orAll(cpus string) string {
	if cpus == "" {
		return "all"
	}
	return cpus
}

// writeConnLatencies writes one CSV row per (write, expected sidecar).
func writeConnLatencies(path string, fl *fleet, results []*writeResult) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("-conn-out: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("-conn-out: %w", cerr)
		}
	}()
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "write,put_node,transport,sidecar,node,org,latency_ms")
	for _, r := range results {
		for _, idx := range r.wait.expected {
			c := fl.cars[idx]
			lat := ""
			if at, ok := r.wait.heldAt(idx); ok {
				lat = strconv.FormatFloat(ms(at-r.ack), 'f', -1, 64)
			}
			fmt.Fprintf(w, "%d,node%d,%s,%s,node%d,%s,%s\n", r.seq, r.node+1, c.kind, c.id, c.node+1, orgName(c.org), lat)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("-conn-out: %w", err)
	}
	return nil
}
