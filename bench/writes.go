package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/policyd/policyd/adminclient"
)

// writesNodes is the cluster size of the writes scenario.
const writesNodes = 3

// writesConfig holds the writes scenario's flags.
type writesConfig struct {
	writers   int
	duration  time.Duration
	warmup    time.Duration
	keys      int
	valueSize int
	single    bool
	timeout   time.Duration
	// profileDir, when set, receives CPU profiles of every node taken
	// during each measured window.
	profileDir string
}

// writesScenario measures write throughput and commit latency: writers
// PUT policies round-robin to every node of a 3-node cluster (so followers
// forward two writes in three to the leader). The server answers a PUT after
// the write is committed and applied on the node that received it, so the
// client-side latency of a 2xx is the commit latency as a client sees it.
func writesScenario() scenario {
	return scenario{
		name:    "writes",
		summary: "write throughput and commit latency (PUT /v1/policies/{name}, 3 nodes)",
		setup: func(fs *flag.FlagSet) runner {
			c := &writesConfig{}
			c.register(fs)
			return c
		},
	}
}

// register registers the workload's flags on fs (the writes and etcd
// scenarios share them, so that both run the same workload).
func (c *writesConfig) register(fs *flag.FlagSet) {
	fs.IntVar(&c.writers, "writers", 100, "concurrent writers, each with one request in flight")
	fs.DurationVar(&c.duration, "duration", 20*time.Second, "measured time per run")
	fs.DurationVar(&c.warmup, "warmup", 2*time.Second, "unmeasured time before each run's measurement")
	fs.IntVar(&c.keys, "keys", 10, "keys per writer (bench-w<writer>-<i%keys>)")
	fs.IntVar(&c.valueSize, "value-size", 4096, "size in bytes of each write's value (a policy's JSON body)")
	fs.BoolVar(&c.single, "single", true, "after the -writers run, also run with 1 writer for the same duration")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "per-request timeout (a timeout counts as an error)")
	fs.StringVar(&c.profileDir, "cpu-profile", "", "write a CPU profile of every policyd node, taken over each measured window\n"+
		"(GET /debug/pprof/profile), to this directory as <node>-<role>-w<writers>.pprof, and each\n"+
		"node's GET /metrics after the run as <node>-<role>-w<writers>.metrics (Raft's own timings:\n"+
		"raft_commitTime, raft_rpc_appendEntries_storeLogs, raft_fsm_apply…)")
}

// writerCounts is the writer count of each run: -writers, then 1 with
// -single.
func (c *writesConfig) writerCounts() []int {
	runs := []int{c.writers}
	if c.single && c.writers != 1 {
		runs = append(runs, 1)
	}
	return runs
}

// validate checks the flags.
func (c *writesConfig) validate() error {
	var errs []error
	if c.writers < 1 {
		errs = append(errs, fmt.Errorf("-writers must be at least 1, got %d", c.writers))
	}
	if c.duration <= 0 {
		errs = append(errs, fmt.Errorf("-duration must be positive, got %v", c.duration))
	}
	if c.warmup < 0 {
		errs = append(errs, fmt.Errorf("-warmup must not be negative, got %v", c.warmup))
	}
	if c.keys < 1 {
		errs = append(errs, fmt.Errorf("-keys must be at least 1, got %d", c.keys))
	}
	if c.timeout <= 0 {
		errs = append(errs, fmt.Errorf("-timeout must be positive, got %v", c.timeout))
	}
	// The longest name has the most overhead.
	longest := policyName(max(c.writers-1, 0), max(c.keys-1, 0))
	if minSize := minBodySize(longest); c.valueSize < minSize {
		errs = append(errs, fmt.Errorf("-value-size must be at least %d with these -writers and -keys, got %d", minSize, c.valueSize))
	}
	if c.valueSize > maxBodySize {
		errs = append(errs, fmt.Errorf("-value-size must be at most %d (the server's body limit), got %d", maxBodySize, c.valueSize))
	}
	return errors.Join(errs...)
}

// run starts a cluster, runs the -writers load and then (with -single) the
// 1-writer load, and emits one figure per run.
func (c *writesConfig) run(ctx context.Context, env *runEnv) error {
	_, err := c.runPolicyd(ctx, env)
	return err
}

// runPolicyd is run, returning the figures it emitted. The cluster is
// stopped on every path; its logs are printed when anything but an
// interruption failed, including a write that did not get a 2xx.
func (c *writesConfig) runPolicyd(ctx context.Context, env *runEnv) (figs []*writesFigure, err error) {
	cfg := *c
	writeErrors := false
	cl, leader, stop, err := startReady(ctx, env, writesNodes, func() bool { return writeErrors })
	if err != nil {
		return nil, err
	}
	defer stop(&err)

	client := newLoadClient(cfg.writers, writesNodes, cfg.timeout)
	defer client.CloseIdleConnections()
	apis, err := nodeAPIs(client, cl.httpAddrs())
	if err != nil {
		return nil, err
	}
	if err := preflight(ctx, apis[0], cfg.valueSize); err != nil {
		return nil, err
	}

	for _, writers := range cfg.writerCounts() {
		if leader, err = cl.waitReady(ctx, env.readyTimeout); err != nil {
			return figs, fmt.Errorf("wait for the cluster before the %d-writer run: %w", writers, err)
		}
		leaderIdx := slices.IndexFunc(cl.nodes, func(nd *node) bool { return nd.id == leader })
		env.logf("writes: %d writer(s), %d keys each, %d-byte bodies, warmup %v, measuring %v",
			writers, cfg.keys, cfg.valueSize, cfg.warmup, cfg.duration)
		var profiles func() error
		if cfg.profileDir != "" {
			profiles = profileNodes(ctx, cl, leader, cfg.profileDir, fmt.Sprintf("w%d", writers), cfg.warmup, cfg.duration)
		}
		res, err := writeLoad(ctx, cl, restWrite(apis), writesNodes, leaderIdx, cfg, writers)
		if profiles != nil {
			if perr := profiles(); perr != nil {
				env.logf("warning: CPU profiles: %v", perr)
			} else {
				env.logf("CPU profiles of the %d-writer run written to %s", writers, cfg.profileDir)
			}
			if merr := saveNodeMetrics(ctx, cl, leader, cfg.profileDir, fmt.Sprintf("w%d", writers)); merr != nil {
				env.logf("warning: node metrics: %v", merr)
			}
		}
		if err != nil {
			return figs, fmt.Errorf("%d-writer run: %w", writers, err)
		}
		if err := cl.checkAlive(); err != nil {
			return figs, fmt.Errorf("after the %d-writer run: %w", writers, err)
		}
		f := res.figure(cfg, writers)
		if err := env.emit(f); err != nil {
			return figs, err
		}
		figs = append(figs, f)
		writeErrors = res.logErrors(env) || writeErrors
		if after, err := cl.waitReady(ctx, env.readyTimeout); err != nil {
			return figs, fmt.Errorf("after the %d-writer run: %w", writers, err)
		} else if after != leader {
			env.logf("warning: the leader changed during the %d-writer run: %s, then %s", writers, leader, after)
		}
	}
	return figs, nil
}

// logErrors logs the failures of a run and reports whether there were any,
// measured or not.
func (r *loadResult) logErrors(env *runEnv) bool {
	if r.unmeasuredErrs > 0 {
		env.logf("warning: %d write(s) failed during warmup or after the measured window", r.unmeasuredErrs)
	}
	for _, kind := range slices.Sorted(maps.Keys(r.errExamples)) {
		env.logf("write error %s (first of %d): %s", kind, r.errs[kind], r.errExamples[kind])
	}
	return len(r.errExamples) > 0
}

// newLoadClient returns the one client all writers share, with enough idle
// connections that no writer has to dial again after its first request.
func newLoadClient(writers, nodes int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil, // loopback only
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        writers * nodes,
			MaxIdleConnsPerHost: writers,
			IdleConnTimeout:     90 * time.Second,
		},
	}
}

// preflight PUTs one policy and fails with the server's answer unless it is
// a 2xx, so a body the server rejects is reported once instead of as every
// write of the run failing.
func preflight(ctx context.Context, api *adminclient.Client, valueSize int) error {
	name := "bench-preflight"
	if _, err := api.PutPolicy(ctx, name, policyBody(nil, name, 0, valueSize), adminclient.AnyRevision); err != nil {
		return fmt.Errorf("preflight PUT /v1/policies/%s: %w", name, err)
	}
	return nil
}

// loadResult is what one run measured.
type loadResult struct {
	leader   []time.Duration // 2xx latencies of writes sent to the leader
	follower []time.Duration // 2xx latencies of writes sent to a follower
	// errs counts measured failures by kind: an HTTP status code,
	// "timeout" or "transport".
	errs           map[string]int
	errExamples    map[string]string // the first error of each kind, measured or not
	unmeasuredErrs int               // failures during warmup or after the window
	// done counts every acknowledged write, warmup included, and the CPU
	// readings bracket all of them.
	done                int
	cpuBefore, cpuAfter cpuReading
}

// writeFunc performs one write of body under key name on node target and
// returns nil once the system acknowledged it as committed. A failure
// that is an *adminclient.Error or *statusError counts by its code; any
// other by its class (timeout or transport).
type writeFunc func(ctx context.Context, target int, name string, body []byte) error

// statusError is a write etcd answered with a failure code.
type statusError struct {
	code string // e.g. "503", or a gRPC code name
	msg  string
}

func (e *statusError) Error() string { return "status " + e.code + ": " + e.msg }

// restWrite writes a policy with PUT /v1/policies/{name} through
// apis[target]; a failure answer is an *adminclient.Error.
func restWrite(apis []*adminclient.Client) writeFunc {
	return func(ctx context.Context, target int, name string, body []byte) error {
		// Do discarding the answer, not PutPolicy: decoding the 4 KB answer
		// cost bench ~0.04 ms of CPU per write, on CPUs the nodes share.
		return apis[target].Do(ctx, http.MethodPut, "/v1/policies/"+url.PathEscape(name), nil, body, nil)
	}
}

// writeLoad runs writers goroutines, each writing with write to nodes nodes
// in turn, for cfg.warmup + cfg.duration and measures the requests that
// complete within the measured window; requests still in flight at its end
// finish but are not counted.
//
// The CPU time that bench and cl's processes use over the whole run is read
// from /proc, so that a figure can say what a write costs each side on a
// machine where they share the CPUs.
func writeLoad(ctx context.Context, cl *cluster, write writeFunc, nodes, leaderIdx int, cfg writesConfig, writers int) (*loadResult, error) {
	cpuBefore := cpuNow(cl)
	measureFrom := time.Now().Add(cfg.warmup)
	stopAt := measureFrom.Add(cfg.duration)
	results := make([]*loadResult, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			results[w] = runWriter(ctx, write, nodes, leaderIdx, cfg, w, measureFrom, stopAt)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	total := newLoadResult()
	for _, r := range results {
		total.merge(r)
	}
	total.cpuBefore, total.cpuAfter = cpuBefore, cpuNow(cl)
	return total, nil
}

func newLoadResult() *loadResult {
	return &loadResult{errs: map[string]int{}, errExamples: map[string]string{}}
}

func (r *loadResult) merge(o *loadResult) {
	r.leader = append(r.leader, o.leader...)
	r.follower = append(r.follower, o.follower...)
	for k, n := range o.errs {
		r.errs[k] += n
	}
	for k, ex := range o.errExamples {
		if _, ok := r.errExamples[k]; !ok {
			r.errExamples[k] = ex
		}
	}
	r.unmeasuredErrs += o.unmeasuredErrs
	r.done += o.done
}

// runWriter is one writer: one request at a time, to node (writer+i) mod
// nodes, on key i mod cfg.keys, until stopAt.
func runWriter(ctx context.Context, write writeFunc, nodes, leaderIdx int, cfg writesConfig, writer int, measureFrom, stopAt time.Time) *loadResult {
	res := newLoadResult()
	names := make([]string, cfg.keys)
	for k := range names {
		names[k] = policyName(writer, k)
	}
	var buf []byte
	for i := 0; ctx.Err() == nil; i++ {
		start := time.Now()
		if !start.Before(stopAt) {
			break
		}
		target := (writer + i) % nodes
		name := names[i%cfg.keys]
		buf = policyBody(buf[:0], name, uint64(i), cfg.valueSize)
		err := write(ctx, target, name, buf)
		end := time.Now()
		if err != nil && ctx.Err() != nil {
			break // interrupted: not a server failure
		}
		measured := !end.Before(measureFrom) && end.Before(stopAt)
		if err == nil {
			res.done++
			if !measured {
				continue
			}
			if target == leaderIdx {
				res.leader = append(res.leader, end.Sub(start))
			} else {
				res.follower = append(res.follower, end.Sub(start))
			}
			continue
		}
		kind := errorKind(err)
		if _, seen := res.errExamples[kind]; !seen {
			res.errExamples[kind] = fmt.Sprintf("write %s to node %d: %v", name, target+1, err)
		}
		if measured {
			res.errs[kind]++
		} else {
			res.unmeasuredErrs++
		}
	}
	return res
}

// errorKind classifies a failed write: its status code, "timeout" or
// "transport".
func errorKind(err error) string {
	var se *statusError
	var ae *adminclient.Error
	switch {
	case errors.As(err, &ae):
		return strconv.Itoa(ae.Status)
	case errors.As(err, &se):
		return se.code
	case isTimeout(err):
		return "timeout"
	default:
		return "transport"
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// maxBodySize is the admin API's request body limit (adminapi.MaxBodyBytes).
const maxBodySize = 1 << 20

// seqDigits is the width of the sequence number in each body, fixed so that
// every body of a run has the same size.
const seqDigits = 12

// policyName is the name writer uses for its key k.
func policyName(writer, k int) string {
	return "bench-w" + strconv.Itoa(writer) + "-" + strconv.Itoa(k)
}

// Every body is policyPrefix + name + policyMiddle + reason + policySuffix,
// a valid ToolPolicy whose reason pads it to the requested size.
const (
	policyPrefix = `{"name":"`
	policyMiddle = `","kind":"ToolPolicy","scope":{"org":"bench"},"labels":{"bench":"writes"},` +
		`"spec":{"tool_name":"Bash","action":"deny","reason":"`
	policySuffix = `"}}`
	reasonHead   = "bench write " // then the sequence number, a space and padding
)

// minBodySize is the smallest body policyBody can make for name.
func minBodySize(name string) int {
	return len(policyPrefix) + len(name) + len(policyMiddle) + len(reasonHead) + seqDigits + 1 + len(policySuffix)
}

// policyBody appends to dst the JSON of policy name, exactly size bytes long
// (at least minBodySize(name)), with seq in its reason so that every write
// changes the policy. name must need no JSON escaping, which policy names
// never do.
func policyBody(dst []byte, name string, seq uint64, size int) []byte {
	dst = append(dst, policyPrefix...)
	dst = append(dst, name...)
	dst = append(dst, policyMiddle...)
	dst = append(dst, reasonHead...)
	s := strconv.FormatUint(seq, 10)
	for range seqDigits - len(s) {
		dst = append(dst, '0')
	}
	dst = append(dst, s...)
	dst = append(dst, ' ')
	for range size - len(dst) - len(policySuffix) {
		dst = append(dst, 'x')
	}
	return append(dst, policySuffix...)
}

// writesFigure is one run's result, printed as one JSON line.
type writesFigure struct {
	Scenario   string  `json:"scenario"`
	Nodes      int     `json:"nodes"`
	Writers    int     `json:"writers"`
	ValueSize  int     `json:"value_size"`
	Keys       int     `json:"keys_per_writer"`
	DurationS  float64 `json:"duration_s"`
	Writes     int     `json:"writes"`
	WritesPerS float64 `json:"writes_per_s"`
	MeanMs     float64 `json:"mean_ms"`
	P50Ms      float64 `json:"p50_ms"`
	P90Ms      float64 `json:"p90_ms"`
	P99Ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
	// Writes sent to the leader, and to a follower (forwarded to the
	// leader), counted and summarized separately.
	ViaLeader        int     `json:"via_leader"`
	ViaLeaderP50Ms   float64 `json:"via_leader_p50_ms"`
	ViaLeaderP99Ms   float64 `json:"via_leader_p99_ms"`
	ViaFollower      int     `json:"via_follower"`
	ViaFollowerP50Ms float64 `json:"via_follower_p50_ms"`
	ViaFollowerP99Ms float64 `json:"via_follower_p99_ms"`
	// CPU time per acknowledged write, over the whole run (warmup
	// included): the system's processes together, and bench (the load
	// generator). Absent when /proc could not be read.
	NodesCPUMsPerWrite float64        `json:"nodes_cpu_ms_per_write,omitempty"`
	GenCPUMsPerWrite   float64        `json:"gen_cpu_ms_per_write,omitempty"`
	Errors             int            `json:"errors"`
	ErrorsByKind       map[string]int `json:"errors_by_kind,omitempty"`
}

// figure summarizes r. It sorts r's latency slices.
func (r *loadResult) figure(cfg writesConfig, writers int) *writesFigure {
	all := summarize(slices.Concat(r.leader, r.follower))
	viaLeader, viaFollower := summarize(r.leader), summarize(r.follower)
	f := &writesFigure{
		Scenario:         "writes",
		Nodes:            writesNodes,
		Writers:          writers,
		ValueSize:        cfg.valueSize,
		Keys:             cfg.keys,
		DurationS:        cfg.duration.Seconds(),
		Writes:           all.count,
		WritesPerS:       round2(float64(all.count) / cfg.duration.Seconds()),
		MeanMs:           ms(all.mean),
		P50Ms:            ms(all.p50),
		P90Ms:            ms(all.p90),
		P99Ms:            ms(all.p99),
		MaxMs:            ms(all.max),
		ViaLeader:        viaLeader.count,
		ViaLeaderP50Ms:   ms(viaLeader.p50),
		ViaLeaderP99Ms:   ms(viaLeader.p99),
		ViaFollower:      viaFollower.count,
		ViaFollowerP50Ms: ms(viaFollower.p50),
		ViaFollowerP99Ms: ms(viaFollower.p99),
	}
	for kind, n := range r.errs {
		if f.ErrorsByKind == nil {
			f.ErrorsByKind = map[string]int{}
		}
		f.ErrorsByKind[kind] = n
		f.Errors += n
	}
	if b, a := r.cpuBefore, r.cpuAfter; b.ok && a.ok && r.done > 0 {
		perWrite := func(d time.Duration) float64 { return math.Round(float64(d)/float64(r.done)/1e3) / 1e3 }
		f.NodesCPUMsPerWrite, f.GenCPUMsPerWrite = perWrite(a.nodes-b.nodes), perWrite(a.gen-b.gen)
	}
	return f
}

func (f *writesFigure) columns() []string {
	return []string{"scenario", "writers", "value_size", "duration", "writes", "writes/s",
		"p50 ms", "p90 ms", "p99 ms", "max ms", "leader p50", "follower p50", "cpu ms/write sys/gen", "errors"}
}

func (f *writesFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	errs := strconv.Itoa(f.Errors)
	if len(f.ErrorsByKind) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(f.ErrorsByKind)) {
			parts = append(parts, fmt.Sprintf("%s:%d", k, f.ErrorsByKind[k]))
		}
		errs += " (" + strings.Join(parts, " ") + ")"
	}
	return []string{f.Scenario, strconv.Itoa(f.Writers), strconv.Itoa(f.ValueSize),
		num(f.DurationS) + "s", strconv.Itoa(f.Writes), num(f.WritesPerS),
		num(f.P50Ms), num(f.P90Ms), num(f.P99Ms), num(f.MaxMs),
		num(f.ViaLeaderP50Ms), num(f.ViaFollowerP50Ms), num(f.NodesCPUMsPerWrite) + "/" + num(f.GenCPUMsPerWrite), errs}
}
