package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/adminclient"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/client"
)

// shadowNodeInterval is the node's least time between two reports of one
// sidecar (internal/server/shadow.DefaultMinInterval, not configurable); the
// sidecars report every shadowReportInterval, a second above it, so that
// RPC jitter on a loaded machine does not make a report come too soon.
const (
	shadowNodeInterval   = 5 * time.Second
	shadowReportInterval = 6 * time.Second
)

// shadowSettle is how long after reports are turned on or off the
// window starts: reports already in flight land before it.
const shadowSettle = time.Second

// metricShadowRejected is the node's counter of ignored shadow reports and
// entries, by reason.
const metricShadowRejected = "policyd_shadow_reports_rejected_total"

// The shadow scenario's policies: one enforced ToolPolicy and, beside it,
// shadowTools shadow ToolPolicies and shadowValidating shadow
// ValidatingPolicies, all of the fleet's one org.
const (
	shadowEnforcedName = "bench.enforced"
	shadowTools        = 5
	shadowValidating   = 5
)

// shadowCommands are the Bash commands the sidecars evaluate, in turn:
// each shadow policy denies some of them, and the enforced one denies one.
var shadowCommands = []string{"ls -la", "curl http://x", "sudo ls", "rm -rf /", "git push", "cat /etc/passwd", "echo hi", "wget y"}

// shadowConfig holds the shadow scenario's flags.
type shadowConfig struct {
	sidecars         int
	nodes            int
	rounds           int
	window           time.Duration
	evalRate         float64
	connectTimeout   time.Duration
	flushTimeout     time.Duration
	startConcurrency int
}

// shadowScenario measures what the shadow reports cost a node:
// -sidecars SDK sidecars on the discovery stream, each declaring the
// shadow capability, evaluating requests against one enforced and ten
// shadow policies, and reporting their counts every 6 s. Each round
// measures the nodes' CPU over a window with the reports held back in the
// sidecars (bench's interceptor refuses the RPC before it is sent, so the
// SDK keeps the counts; everything else is the same) and over a window with
// them flowing; the difference over the reports the node accepted is the
// cost per report.
func shadowScenario() scenario {
	return scenario{
		name:    "shadow",
		summary: "SDK sidecars evaluating shadow policies: node CPU per 1,000 shadow reports, and the cluster's counts against the sidecars'",
		setup: func(fs *flag.FlagSet) runner {
			c := &shadowConfig{}
			fs.IntVar(&c.sidecars, "sidecars", 1000, "SDK sidecars on the discovery stream (gRPC), each with its own connection")
			fs.IntVar(&c.nodes, "nodes", 1, "cluster size; the sidecars are spread over every node")
			fs.IntVar(&c.rounds, "rounds", 5, "rounds, each a window with reports off and one with them on")
			fs.DurationVar(&c.window, "window", 12*time.Second, "each measured window (at least two report intervals of 6s)")
			fs.Float64Var(&c.evalRate, "eval-rate", 2, "Evaluate calls per second per sidecar")
			fs.DurationVar(&c.connectTimeout, "connect-timeout", 3*time.Minute, "how long every sidecar may take to connect and hold the set")
			fs.DurationVar(&c.flushTimeout, "flush-timeout", 30*time.Second, "how long the last reports may take to reach the cluster's view")
			fs.IntVar(&c.startConcurrency, "dial-concurrency", defaultStartConcurrency, "sidecars starting at once")
			return c
		},
	}
}

func (c *shadowConfig) validate() error {
	var errs []error
	if c.sidecars < 1 || c.nodes < 1 || c.rounds < 1 {
		errs = append(errs, fmt.Errorf("-sidecars, -nodes and -rounds must be at least 1, got %d, %d, %d", c.sidecars, c.nodes, c.rounds))
	}
	if c.window < 2*shadowReportInterval {
		errs = append(errs, fmt.Errorf("-window must be at least %v (two report intervals), got %v", 2*shadowReportInterval, c.window))
	}
	if c.evalRate <= 0 || c.evalRate > 100 {
		errs = append(errs, fmt.Errorf("-eval-rate must be in (0, 100], got %g", c.evalRate))
	}
	if c.connectTimeout <= 0 || c.flushTimeout <= 0 {
		errs = append(errs, fmt.Errorf("-connect-timeout and -flush-timeout must be positive, got %v, %v", c.connectTimeout, c.flushTimeout))
	}
	if c.startConcurrency < 1 {
		errs = append(errs, fmt.Errorf("-dial-concurrency must be at least 1, got %d", c.startConcurrency))
	}
	return errors.Join(errs...)
}

// shadowPolicyNames are the ten shadow policies' names.
func shadowPolicyNames() []string {
	var out []string
	for i := range shadowTools {
		out = append(out, "bench.shadow-tool-"+strconv.Itoa(i))
	}
	for i := range shadowValidating {
		out = append(out, "bench.shadow-val-"+strconv.Itoa(i))
	}
	return out
}

// shadowPolicies are the scenario's policy writes in org: the enforced
// ToolPolicy, then the shadow ones (a pattern or a CEL check per word).
func shadowPolicies(org string) []restPut {
	body := func(name, kind, enforcement string, spec map[string]any) []byte {
		m := map[string]any{"name": name, "kind": kind, "scope": map[string]string{"org": org},
			"labels": map[string]string{"bench": "shadow"}, "spec": spec}
		if enforcement != "" {
			m["enforcement"] = enforcement
		}
		b, _ := json.Marshal(m)
		return b
	}
	puts := []restPut{{"/v1/policies/" + shadowEnforcedName, body(shadowEnforcedName, "ToolPolicy", "",
		map[string]any{"tool_name": "Bash", "action": "deny", "reason": "enforced",
			"conditions": map[string]any{"patterns": []string{`rm -rf`}}})}}
	words := []string{"curl", "sudo", "passwd", "wget", "push"}
	names := shadowPolicyNames()
	for i := range shadowTools {
		puts = append(puts, restPut{"/v1/policies/" + names[i], body(names[i], "ToolPolicy", "shadow",
			map[string]any{"tool_name": "Bash", "action": "deny", "reason": "shadow " + words[i],
				"conditions": map[string]any{"patterns": []string{words[i] + "|rm"}}})})
	}
	for i := range shadowValidating {
		n := names[shadowTools+i]
		puts = append(puts, restPut{"/v1/policies/" + n, body(n, "ValidatingPolicy", "shadow", map[string]any{
			"matchConditions": []map[string]string{{"name": "bash", "expression": "tool == 'Bash'"}},
			"validations": []map[string]string{{"expression": "!input.command.contains('" + words[(i+1)%len(words)] + "')",
				"message": "shadow " + words[(i+1)%len(words)]}},
		})})
	}
	return puts
}

// reportGate is every sidecar's unary interceptor: it counts the shadow
// reports by outcome and, while off, refuses them before they are sent
// (the SDK keeps their counts for the next report).
type reportGate struct {
	on          atomic.Bool
	accepted    atomic.Int64 // answered OK by a node
	rateLimited atomic.Int64 // ResourceExhausted: too soon
	failed      atomic.Int64 // any other error from a node
	held        atomic.Int64 // refused by the gate
}

func (g *reportGate) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption,
) error {
	if method != discoveryv1.PolicyDiscoveryService_ReportShadow_FullMethodName {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if !g.on.Load() {
		g.held.Add(1)
		return status.Error(codes.Unavailable, "bench: shadow reports are off in this window")
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	switch status.Code(err) {
	case codes.OK:
		g.accepted.Add(1)
	case codes.ResourceExhausted:
		g.rateLimited.Add(1)
	default:
		g.failed.Add(1)
	}
	return err
}

// shadowMark is the state at a window's start or end.
type shadowMark struct {
	at       time.Time
	nodeCPU  time.Duration // summed over the nodes
	benchCPU time.Duration
	accepted int64
	limited  int64
	failed   int64
	rejected float64 // the nodes' metricShadowRejected, every reason
}

// shadowWindow is one measured window.
type shadowWindow struct {
	Round      int     `json:"round"`
	Reports    string  `json:"reports"` // on or off
	DurationS  float64 `json:"duration_s"`
	NodeCPU    float64 `json:"node_cpu"`  // CPU-seconds per second, every node
	BenchCPU   float64 `json:"bench_cpu"` // likewise, bench and its sidecars
	Accepted   int64   `json:"accepted_reports"`
	PerSecond  float64 `json:"accepted_per_s"`
	Limited    int64   `json:"rate_limited"`
	Failed     int64   `json:"failed"`
	Rejected   float64 `json:"node_rejected"`
	nodeCPUDur time.Duration
}

func (c *shadowConfig) run(ctx context.Context, env *runEnv) (err error) {
	cfg := *c
	if need := uint64(cfg.sidecars + fileMargin); env.fileLimit != 0 && env.fileLimit < need {
		return fmt.Errorf("the open-files limit is %d, and %d sidecars need about %d", env.fileLimit, cfg.sidecars, need)
	}
	cl, _, stop, err := startReady(ctx, env, cfg.nodes, nil, inactivityEnv)
	if err != nil {
		return err
	}
	var sf *sdkFleet
	defer func() {
		if sf != nil {
			env.logf("closing the sidecars")
			sf.close()
		}
		stop(&err)
	}()
	httpc := newLoadClient(8, cfg.nodes, 30*time.Second)
	defer httpc.CloseIdleConnections()
	addrs := cl.httpAddrs()
	org := orgName(0)
	if err := putAll(ctx, httpc, addrs, shadowPolicies(org), 1); err != nil {
		return fmt.Errorf("seed policies: %w", err)
	}
	want := 1 + shadowTools + shadowValidating

	gate := &reportGate{}
	env.logf("starting %d SDK sidecars (gRPC, shadow capability) over %d node(s), reporting every %v", cfg.sidecars, cfg.nodes, shadowReportInterval)
	openStart := time.Now()
	sf, err = openSDKFleet(ctx, cl, sdkFleetSpec{grpc: cfg.sidecars, orgs: 1, grpcScope: "employee", streamsPerConn: 1,
		startConcurrency: cfg.startConcurrency, shadowInterval: shadowReportInterval, interceptor: gate.intercept})
	if err != nil {
		return fmt.Errorf("open sidecars: %w", err)
	}
	if err := waitShadowSet(ctx, sf, want, cfg.connectTimeout); err != nil {
		return err
	}
	env.logf("every sidecar holds the %d policies, %v after opening started", want, time.Since(openStart).Round(time.Millisecond))

	evalCtx, stopEval := context.WithCancel(ctx)
	var evalWG sync.WaitGroup
	for _, sdk := range sf.clients {
		evalWG.Go(func() { evaluateLoop(evalCtx, sdk, cfg.evalRate) })
	}
	stopEvaluating := func() {
		stopEval()
		evalWG.Wait()
	}
	defer stopEvaluating()

	pids := make([]string, len(cl.nodes))
	for i, nd := range cl.nodes {
		pids[i] = strconv.Itoa(nd.cmd.Process.Pid)
	}
	mark := func() (shadowMark, error) {
		m := shadowMark{at: time.Now(), accepted: gate.accepted.Load(), limited: gate.rateLimited.Load(), failed: gate.failed.Load()}
		for _, pid := range pids {
			d, err := procCPU(pid)
			if err != nil {
				return m, fmt.Errorf("node CPU time: %w", err)
			}
			m.nodeCPU += d
		}
		var err error
		if m.benchCPU, err = procCPU("self"); err != nil {
			return m, fmt.Errorf("bench CPU time: %w", err)
		}
		for _, a := range addrs {
			b, err := fetchMetrics(ctx, httpc, a)
			if err != nil {
				return m, err
			}
			m.rejected += sumCounter(b, metricShadowRejected)
		}
		return m, nil
	}
	window := func(round int, on bool) (*shadowWindow, error) {
		gate.on.Store(on)
		if err := sleepUntil(ctx, time.Now().Add(shadowSettle)); err != nil {
			return nil, err
		}
		a, err := mark()
		if err != nil {
			return nil, err
		}
		if err := sleepUntil(ctx, a.at.Add(cfg.window)); err != nil {
			return nil, err
		}
		b, err := mark()
		if err != nil {
			return nil, err
		}
		el := b.at.Sub(a.at)
		w := &shadowWindow{Round: round, Reports: map[bool]string{true: "on", false: "off"}[on], DurationS: round2(el.Seconds()),
			NodeCPU: round3((b.nodeCPU - a.nodeCPU).Seconds() / el.Seconds()), BenchCPU: round3((b.benchCPU - a.benchCPU).Seconds() / el.Seconds()),
			Accepted: b.accepted - a.accepted, Limited: b.limited - a.limited, Failed: b.failed - a.failed,
			Rejected: b.rejected - a.rejected, nodeCPUDur: b.nodeCPU - a.nodeCPU}
		w.PerSecond = round2(float64(w.Accepted) / el.Seconds())
		env.logf("round %d, reports %s: node CPU %.3f, bench CPU %.3f, %d reports accepted (%.1f/s), %d rate limited, %d failed, node rejected %g",
			round, w.Reports, w.NodeCPU, w.BenchCPU, w.Accepted, w.PerSecond, w.Limited, w.Failed, w.Rejected)
		return w, nil
	}

	fig := &shadowFigure{Scenario: "shadow", Nodes: cfg.nodes, Sidecars: cfg.sidecars, Rounds: cfg.rounds,
		WindowS: cfg.window.Seconds(), EvalRate: cfg.evalRate, ReportIntervalS: shadowReportInterval.Seconds(),
		ShadowPolicies: shadowTools + shadowValidating, CPUs: runtime.NumCPU()}
	for r := 1; r <= cfg.rounds; r++ {
		off, err := window(r, false)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		on, err := window(r, true)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		fig.add(off, on)
		if err := cl.checkAlive(); err != nil {
			return err
		}
	}
	fig.finish()

	// Every count the sidecars made must reach the cluster's view: stop
	// evaluating, let the last reports go, and compare.
	gate.on.Store(true)
	stopEvaluating()
	api, err := nodeAPI(httpc, addrs[0])
	if err != nil {
		return err
	}
	fig.Match, fig.Mismatch, err = waitShadowTotals(ctx, api, sf, cfg.flushTimeout)
	if err != nil {
		return err
	}
	fig.Evaluations, fig.WouldBlock, fig.WouldAllow = sidecarShadowTotals(sf)
	if err := env.emit(fig); err != nil {
		return err
	}
	if errs := sf.errors(); len(errs) > 0 {
		env.logf("sidecar connections that ended (first %d): %q", len(errs), errs)
	}
	env.logf("note: the %d node(s) and bench (every sidecar) share the machine's %d CPU(s)", cfg.nodes, runtime.NumCPU())
	return nil
}

// waitShadowSet waits until every sidecar holds want policies.
func waitShadowSet(ctx context.Context, sf *sdkFleet, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		missing := 0
		for _, sdk := range sf.clients {
			if len(sdk.Policies()) != want {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v, %d of %d sidecars do not hold the %d policies; first errors: %q", timeout, missing, len(sf.clients), want, sf.errors())
		}
		if err := sleepUntil(ctx, time.Now().Add(100*time.Millisecond)); err != nil {
			return err
		}
	}
}

// evaluateLoop calls sdk.Evaluate rate times a second, from a random
// phase, with the shadowCommands in turn, until ctx ends.
func evaluateLoop(ctx context.Context, sdk *client.Client, rate float64) {
	period := time.Duration(float64(time.Second) / rate)
	t := time.NewTimer(rand.N(period))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sdk.Evaluate(ctx, client.Request{Tool: "Bash", Input: map[string]any{"command": shadowCommands[i%len(shadowCommands)]}})
		t.Reset(period)
	}
}

// sidecarShadowTotals are the sidecars' counts summed over every shadow
// policy: evaluated, would_block, would_allow.
func sidecarShadowTotals(sf *sdkFleet) (evaluated, wouldBlock, wouldAllow uint64) {
	for _, sdk := range sf.clients {
		st := sdk.Stats()
		evaluated += st.ShadowEvaluated
		wouldBlock += st.ShadowWouldBlock
		wouldAllow += st.ShadowWouldAllow
	}
	return evaluated, wouldBlock, wouldAllow
}

// waitShadowTotals polls GET /v1/policies/{name}/shadow of every shadow
// policy until its totals equal the sum of the sidecars' counts, or
// timeout; it returns the policies that matched and a description of
// those that did not.
func waitShadowTotals(ctx context.Context, api *adminclient.Client, sf *sdkFleet, timeout time.Duration) (int, []string, error) {
	want := map[string][3]uint64{}
	for _, sdk := range sf.clients {
		for _, sc := range sdk.Stats().Shadow {
			w := want[sc.Policy]
			want[sc.Policy] = [3]uint64{w[0] + sc.WouldBlock, w[1] + sc.WouldAllow, w[2] + sc.Evaluated}
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		var mismatch []string
		for _, name := range shadowPolicyNames() {
			v, err := api.PolicyShadow(ctx, name)
			if err != nil {
				return 0, nil, fmt.Errorf("GET /v1/policies/%s/shadow: %w", name, err)
			}
			got := [3]uint64{v.Totals.WouldBlock, v.Totals.WouldAllow, v.Totals.Evaluated}
			if got != want[name] {
				mismatch = append(mismatch, fmt.Sprintf("%s: cluster %d/%d/%d, sidecars %d/%d/%d (would_block/would_allow/evaluated)",
					name, got[0], got[1], got[2], want[name][0], want[name][1], want[name][2]))
			}
		}
		if len(mismatch) == 0 || time.Now().After(deadline) {
			return len(shadowPolicyNames()) - len(mismatch), mismatch, nil
		}
		if err := sleepUntil(ctx, time.Now().Add(time.Second)); err != nil {
			return 0, nil, err
		}
	}
}

// sumCounter sums every sample of counter name in a Prometheus text
// exposition.
func sumCounter(text []byte, name string) float64 {
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		f := strings.Fields(line[strings.LastIndexByte(line, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// shadowFigure is the scenario's result.
type shadowFigure struct {
	Scenario        string  `json:"scenario"`
	Nodes           int     `json:"nodes"`
	Sidecars        int     `json:"sidecars"`
	ShadowPolicies  int     `json:"shadow_policies"`
	Rounds          int     `json:"rounds"`
	WindowS         float64 `json:"window_s"`
	EvalRate        float64 `json:"evaluations_per_s_per_sidecar"`
	ReportIntervalS float64 `json:"report_interval_s"`
	// Per window, and per round the CPU per 1,000 accepted reports: the
	// node CPU-seconds of the on window minus those of the off window
	// (scaled to the on window's length), in ms per 1,000 reports.
	Windows      []*shadowWindow `json:"windows"`
	PerRoundMs   []float64       `json:"cpu_ms_per_1000_reports_by_round"`
	MedianMs     float64         `json:"cpu_ms_per_1000_reports_median"`
	PooledMs     float64         `json:"cpu_ms_per_1000_reports_pooled"`
	NodeCPUOff   float64         `json:"node_cpu_off"` // mean CPU-seconds per second
	NodeCPUOn    float64         `json:"node_cpu_on"`
	ReportsPerS  float64         `json:"accepted_reports_per_s"`
	Accepted     int64           `json:"accepted_reports"`
	RateLimited  int64           `json:"rate_limited"`
	Failed       int64           `json:"failed"`
	NodeRejected float64         `json:"node_rejected_in_windows"`
	Evaluations  uint64          `json:"shadow_evaluations"`
	WouldBlock   uint64          `json:"shadow_would_block"`
	WouldAllow   uint64          `json:"shadow_would_allow"`
	Match        int             `json:"policies_matching"`
	Mismatch     []string        `json:"mismatch,omitempty"`
	CPUs         int             `json:"cpus"`

	onCPU, offCPU time.Duration
	onS, offS     float64
}

func (f *shadowFigure) add(off, on *shadowWindow) {
	f.Windows = append(f.Windows, off, on)
	extra := on.nodeCPUDur.Seconds() - off.nodeCPUDur.Seconds()*on.DurationS/off.DurationS
	if on.Accepted > 0 {
		f.PerRoundMs = append(f.PerRoundMs, round2(extra*1000/float64(on.Accepted)*1000))
	}
	f.onCPU += on.nodeCPUDur
	f.offCPU += off.nodeCPUDur
	f.onS += on.DurationS
	f.offS += off.DurationS
	f.Accepted += on.Accepted
	f.RateLimited += on.Limited + off.Limited
	f.Failed += on.Failed + off.Failed
	f.NodeRejected += on.Rejected + off.Rejected
}

func (f *shadowFigure) finish() {
	if len(f.PerRoundMs) > 0 {
		s := slices.Clone(f.PerRoundMs)
		slices.Sort(s)
		f.MedianMs = s[len(s)/2]
		if len(s)%2 == 0 {
			f.MedianMs = round2((s[len(s)/2-1] + s[len(s)/2]) / 2)
		}
	}
	f.NodeCPUOff, f.NodeCPUOn = round3(f.offCPU.Seconds()/f.offS), round3(f.onCPU.Seconds()/f.onS)
	if f.Accepted > 0 {
		extra := f.onCPU.Seconds() - f.offCPU.Seconds()*f.onS/f.offS
		f.PooledMs = round2(extra * 1000 / float64(f.Accepted) * 1000)
	}
	f.ReportsPerS = round2(float64(f.Accepted) / f.onS)
}

func (f *shadowFigure) columns() []string {
	return []string{"scenario", "nodes", "sidecars", "rounds", "node CPU off/on", "reports/s",
		"CPU ms/1k reports median (per round)", "pooled", "rate limited", "node rejected", "cluster = sidecars"}
}

func (f *shadowFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	var per []string
	for _, x := range f.PerRoundMs {
		per = append(per, num(x))
	}
	return []string{f.Scenario, strconv.Itoa(f.Nodes), strconv.Itoa(f.Sidecars), strconv.Itoa(f.Rounds),
		num(f.NodeCPUOff) + "/" + num(f.NodeCPUOn), num(f.ReportsPerS), num(f.MedianMs) + " (" + strings.Join(per, ", ") + ")",
		num(f.PooledMs), strconv.FormatInt(f.RateLimited, 10), num(f.NodeRejected),
		strconv.Itoa(f.Match) + "/" + strconv.Itoa(f.ShadowPolicies)}
}

func (f *shadowFigure) targets() []targetResult {
	met := f.Accepted > 0 && f.RateLimited == 0 && f.Failed == 0 && f.NodeRejected == 0 && f.Match == f.ShadowPolicies
	return []targetResult{{
		Target: fmt.Sprintf("shadow reports (%d SDK sidecars, %d node(s)): none rejected, and the cluster's counts equal the sidecars'", f.Sidecars, f.Nodes),
		Measured: fmt.Sprintf("%g ms node CPU per 1,000 reports (median of %d rounds; pooled %g), %d accepted, %d rate limited, %d failed, %g rejected by the node, %d of %d policies matching",
			f.MedianMs, len(f.PerRoundMs), f.PooledMs, f.Accepted, f.RateLimited, f.Failed, f.NodeRejected, f.Match, f.ShadowPolicies),
		Met: met,
	}}
}
