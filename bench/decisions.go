package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/authz/benchset"
)

// The decision log's targets, as ratios of logging on to logging off:
// p99 of one check at a time at most 5 % higher, decisions per CPU-second
// of the sidecar at most 10 % lower.
const (
	targetDecisionsP99Ratio    = 1.05
	targetDecisionsPerCPURatio = 0.90
)

// The node's metrics the scenario reads.
const (
	metricDecisionsReceived = "policyd_decisions_received_total"
	metricDecisionStore     = "policyd_decision_store_bytes"
)

// decisionsVariant is one way of running `policyd authz`: its name in the
// figures, the flags added to startAuthz's, and the allowed decisions'
// share recorded ("" for logging off).
type decisionsVariant struct {
	name      string
	args      []string
	allowRate string
}

// decisionsVariants are the sidecars the scenario compares: logging off,
// every decision logged (the worst case), and the default sample of allows.
func decisionsVariants(sampled bool) []decisionsVariant {
	vs := []decisionsVariant{
		{name: "off"},
		{name: "all", args: []string{"--decision-log", "--decision-log-allow-rate", "1"}, allowRate: "1"},
	}
	if sampled {
		vs = append(vs, decisionsVariant{name: "sampled", args: []string{"--decision-log"}, allowRate: "0.1"})
	}
	return vs
}

// decisionsConfig holds the decisions scenario's flags.
type decisionsConfig struct {
	requests    int
	warmup      int
	concurrency int
	conns       int
	duration    time.Duration
	rounds      int
	idle        time.Duration
	settle      time.Duration
	sampled     bool
	authzCPUs   string
}

// decisionsScenario measures what decision logging costs `policyd authz`
// and the node that keeps the records. One node holds the authz
// scenario's 40 policies; one sidecar per variant (logging off, every
// decision logged, and the default 10 % of allows) follows it, all pinned
// to the same CPUs and idle while another is measured. Each round measures
// every variant in turn, in an order that rotates from round to round, so
// that the machine's noise falls on all of them: allowed checks one at a
// time through ext_authz gRPC, then many in flight. The node's CPU and its
// received-records counter are read around each variant's turn, which
// ends once the last records have had time to ship; less an idle baseline
// taken before the rounds, that is the node's CPU per record.
func decisionsScenario() scenario {
	return scenario{
		name:    "decisions",
		summary: "policyd authz with decision logging off, on for every decision and at the default rate: latency, decisions per CPU-s, node CPU and bytes per record",
		setup: func(fs *flag.FlagSet) runner {
			c := &decisionsConfig{}
			fs.IntVar(&c.requests, "requests", 8000, "sequential allowed ext_authz checks timed per variant and round")
			fs.IntVar(&c.warmup, "warmup", 1000, "checks sent before each timed run, not timed")
			fs.IntVar(&c.concurrency, "concurrency", 32, "checks in flight in the throughput runs")
			fs.IntVar(&c.conns, "conns", 4, "gRPC connections the throughput run's checks share")
			fs.DurationVar(&c.duration, "duration", 4*time.Second, "length of each throughput run")
			fs.IntVar(&c.rounds, "rounds", 5, "rounds, each measuring every variant once")
			fs.DurationVar(&c.idle, "idle", 5*time.Second, "the node's idle baseline window, before the rounds")
			fs.DurationVar(&c.settle, "settle", 2*time.Second, "wait after a variant's runs before the node is read, for its last records\n(the SDK ships every second)")
			fs.BoolVar(&c.sampled, "sampled", true, "also measure --decision-log at its default allow rate (0.1)")
			fs.StringVar(&c.authzCPUs, "authz-cpus", "1", "CPU list every authz process is pinned to (taskset -c), \"\" for none; unless\n"+
				"-node-cpus and -load-cpus are given, the node and bench run on the other CPUs")
			return c
		},
	}
}

func (c *decisionsConfig) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"-requests", c.requests}, {"-concurrency", c.concurrency}, {"-conns", c.conns}, {"-rounds", c.rounds}} {
		if f.v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", f.name, f.v))
		}
	}
	if c.warmup < 0 {
		errs = append(errs, fmt.Errorf("-warmup must not be negative, got %d", c.warmup))
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"-duration", c.duration}, {"-idle", c.idle}, {"-settle", c.settle}} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", f.name, f.v))
		}
	}
	if c.authzCPUs != "" {
		if _, err := parseCPUList(c.authzCPUs); err != nil {
			errs = append(errs, fmt.Errorf("-authz-cpus: %w", err))
		}
	}
	return errors.Join(errs...)
}

// decisionsSidecar is one running variant.
type decisionsSidecar struct {
	v       decisionsVariant
	sc      *cluster
	pid     string
	command string
	seq     checkOnce
	spread  func(worker int) checkOnce
	fig     *decisionsVariantFigure
	closers []*grpc.ClientConn
}

func (s *decisionsSidecar) close() {
	for _, cc := range s.closers {
		_ = cc.Close()
	}
}

// nodeMark is the node's CPU time and records received at a moment.
type nodeMark struct {
	at      time.Time
	cpu     time.Duration
	records float64
	bytes   float64
}

func (c *decisionsConfig) run(ctx context.Context, env *runEnv) (err error) {
	var authzCPUs cpuList
	var rest []int
	if c.authzCPUs != "" {
		authzCPUs, _ = parseCPUList(c.authzCPUs) // validated
		if err := (&pinFlags{node: authzCPUs}).check(env.allowedCPUs, env.allowedErr); err != nil {
			return fmt.Errorf("-authz-cpus: %w", err)
		}
		for _, cpu := range env.allowedCPUs {
			if !slices.Contains(authzCPUs.cpus, cpu) {
				rest = append(rest, cpu)
			}
		}
	}
	// The node takes the records beside bench, not on the sidecars' core:
	// in production it is another machine.
	nodeEnv := *env
	if nodeEnv.nodeCPUs == "" && len(rest) > 0 {
		nodeEnv.nodeCPUs = formatCPUs(rest)
	}
	cl, _, stop, err := startReady(ctx, &nodeEnv, 1, nil)
	if err != nil {
		return err
	}
	defer stop(&err)
	client := newLoadClient(c.concurrency, 1, 30*time.Second)
	defer client.CloseIdleConnections()
	nodeHTTP := cl.nodes[0].httpAddr
	api, err := nodeAPI(client, nodeHTTP)
	if err != nil {
		return err
	}
	set := benchset.Policies()
	for name, doc := range set {
		if _, err := api.PutPolicy(ctx, name, doc, adminclient.AnyRevision); err != nil {
			return fmt.Errorf("PUT /v1/policies/%s: %w", name, err)
		}
	}

	var sidecars []*decisionsSidecar
	defer func() {
		for _, s := range sidecars {
			if stopErr := s.sc.stop(); stopErr != nil {
				err = errors.Join(err, fmt.Errorf("stop authz %s: %w", s.v.name, stopErr))
			}
			if err != nil && ctx.Err() == nil {
				s.sc.dumpLogs(env.stderr)
			}
		}
	}()
	for _, v := range decisionsVariants(c.sampled) {
		s, err := startDecisionsSidecar(ctx, env, client, v, cl.nodes[0].grpcAddr, authzCPUs.String(), len(set), c.conns)
		if s != nil {
			sidecars = append(sidecars, s)
			defer s.close()
		}
		if err != nil {
			return fmt.Errorf("authz %s: %w", v.name, err)
		}
		s.fig = &decisionsVariantFigure{Scenario: "decisions", Logging: v.name, AllowRate: v.allowRate, Command: s.command,
			Rounds: c.rounds, AuthzCPUs: authzCPUs.String()}
		env.logf("authz %s ready (pid %s, CPUs %s): %s", v.name, s.pid, cmp.Or(authzCPUs.String(), "not pinned"), s.command)
	}

	if len(rest) > 0 && env.loadCPUs == "" {
		unpin, err := pinProcess(rest)
		if err != nil {
			return fmt.Errorf("pin bench to CPU(s) %s: %w", formatCPUs(rest), err)
		}
		defer func() {
			if uerr := unpin(); uerr != nil {
				err = errors.Join(err, fmt.Errorf("unpin bench: %w", uerr))
			}
		}()
		env.logf("pinned: bench and the node to CPU(s) %s, the sidecars to %s", formatCPUs(rest), &authzCPUs)
	}

	nodePid := strconv.Itoa(cl.nodes[0].cmd.Process.Pid)
	mark := func() (nodeMark, error) {
		m := nodeMark{at: time.Now()}
		var err error
		if m.cpu, err = procCPU(nodePid); err != nil {
			return m, fmt.Errorf("node CPU time: %w", err)
		}
		b, err := fetchMetrics(ctx, client, nodeHTTP)
		if err != nil {
			return m, err
		}
		m.records, m.bytes = sumCounter(b, metricDecisionsReceived), sumCounter(b, metricDecisionStore)
		return m, nil
	}

	// The idle baseline: every sidecar connected, none deciding.
	if err := sleepUntil(ctx, time.Now().Add(c.settle)); err != nil {
		return err
	}
	a, err := mark()
	if err != nil {
		return err
	}
	if err := sleepUntil(ctx, a.at.Add(c.idle)); err != nil {
		return err
	}
	b, err := mark()
	if err != nil {
		return err
	}
	node := &decisionsNodeFigure{Scenario: "decisions", Measure: "node", IdleS: round2(b.at.Sub(a.at).Seconds()),
		IdleNodeCPU: round3((b.cpu - a.cpu).Seconds() / b.at.Sub(a.at).Seconds()), NodeCPUs: nodeEnv.nodeCPUs}
	env.logf("node idle: %.3f CPU-s per s over %v", node.IdleNodeCPU, c.idle)

	for r := 1; r <= c.rounds; r++ {
		for _, i := range rotation(len(sidecars), r-1) {
			s := sidecars[i]
			before, err := mark()
			if err != nil {
				return err
			}
			base := authzFigure{Scenario: "decisions", API: "grpc", Case: "allow", Policies: len(set), AuthzCPUs: authzCPUs.String()}
			seq := &decisionsRunFigure{Logging: s.v.name, Round: r, authzFigure: base}
			seq.Mode, seq.Concurrency = "sequential", 1
			if err := measureAuthz(ctx, &seq.authzFigure, s.pid, s.seq, c.warmup, c.requests); err != nil {
				return fmt.Errorf("authz %s: %w", s.v.name, err)
			}
			seq.Target, seq.TargetMet = "", false // the variants' ratios carry the targets
			conc := &decisionsRunFigure{Logging: s.v.name, Round: r, authzFigure: base}
			conc.Mode, conc.Concurrency, conc.Conns = "concurrent", c.concurrency, c.conns
			if err := measureAuthzConcurrent(ctx, &conc.authzFigure, s.pid, s.spread, c.warmup, c.duration, c.concurrency); err != nil {
				return fmt.Errorf("authz %s: %w", s.v.name, err)
			}
			if err := sleepUntil(ctx, time.Now().Add(c.settle)); err != nil {
				return err
			}
			after, err := mark()
			if err != nil {
				return err
			}
			s.fig.add(seq, conc, before, after)
			env.logf("round %d, %s: p50 %g ms, p99 %g ms; %.0f decisions/s, %.0f per CPU-s; node: %.0f records, %.3f CPU-s per s",
				r, s.v.name, seq.P50Ms, seq.P99Ms, conc.DecisionsPerS, conc.DecisionsPerCPUS, after.records-before.records,
				(after.cpu-before.cpu).Seconds()/after.at.Sub(before.at).Seconds())
			for _, f := range []figure{seq, conc} {
				if err := env.emit(f); err != nil {
					return err
				}
			}
			if err := s.sc.checkAlive(); err != nil {
				return err
			}
		}
	}

	end, err := mark()
	if err != nil {
		return err
	}
	off := sidecars[0].fig
	off.finish(node.IdleNodeCPU, nil)
	var errs []error
	for _, s := range sidecars {
		f := s.fig
		if f.Logging != "off" {
			f.finish(node.IdleNodeCPU, off)
			node.add(f)
			if f.Records == 0 {
				errs = append(errs, fmt.Errorf("authz %s: the node received no records", f.Logging))
			}
		} else if f.Records != 0 {
			errs = append(errs, fmt.Errorf("authz off: the node received %g records", f.Records))
		}
		if err := env.emit(f); err != nil {
			return err
		}
	}
	node.finish(end.records, end.bytes)
	if err := env.emit(node); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// startDecisionsSidecar starts `policyd authz` with v's flags: startAuthz
// fixes its flags, so the process it starts is stopped at once and
// started again with v's added, keeping its ports, directory and log.
func startDecisionsSidecar(ctx context.Context, env *runEnv, client *http.Client, v decisionsVariant, grpcAddr, cpus string, policies, conns int) (*decisionsSidecar, error) {
	sub := *env
	sub.workDir = filepath.Join(env.workDir, v.name)
	sc, err := startAuthz(&sub, grpcAddr, cpus)
	if err != nil {
		return nil, err
	}
	s := &decisionsSidecar{v: v, sc: sc}
	nd := sc.nodes[0]
	if len(v.args) > 0 {
		// Killed: it may not handle SIGTERM yet, and has nothing to lose.
		if err := sc.kill(0); err != nil {
			return s, err
		}
		nd.args = slices.Concat(nd.args, v.args)
		if err := sc.restart(0); err != nil {
			return s, err
		}
	}
	s.pid = strconv.Itoa(nd.cmd.Process.Pid)
	s.command = "policyd " + strings.Join(nd.args, " ")
	if err := waitAuthzReady(ctx, client, sc, policies, env.readyTimeout); err != nil {
		return s, err
	}
	one, err := grpc.NewClient(nd.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return s, fmt.Errorf("grpc client for %s: %w", nd.grpcAddr, err)
	}
	s.closers = append(s.closers, one)
	s.seq = grpcChecker(authv3.NewAuthorizationClient(one))(false)
	many := make([]authv3.AuthorizationClient, conns)
	for i := range many {
		cc, err := grpc.NewClient(nd.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return s, fmt.Errorf("grpc client for %s: %w", nd.grpcAddr, err)
		}
		s.closers = append(s.closers, cc)
		many[i] = authv3.NewAuthorizationClient(cc)
	}
	s.spread = func(w int) checkOnce { return grpcChecker(many[w%len(many)])(false) }
	return s, nil
}

// rotation is the order of n variants in round r (from 0): each round
// starts one later, so that no variant always follows the same one.
func rotation(n, r int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = (i + r) % n
	}
	return out
}

// median is the middle of xs (the mean of the two middle ones for an even
// count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ratio3 is a ÷ b to three decimals, 0 when b is 0: a 5 % target needs
// more than ratio's two.
func ratio3(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round3(a / b)
}

// cpuMsPer1000 is the CPU over elapsedS seconds above an idle rate of
// idlePerS CPU-seconds per second, in ms per 1,000 of records; 0 for no
// records.
func cpuMsPer1000(cpu time.Duration, elapsedS, idlePerS, records float64) float64 {
	if records <= 0 {
		return 0
	}
	return round2((cpu.Seconds() - idlePerS*elapsedS) / records * 1e6)
}

// decisionsRunFigure is one timed run of one variant in one round.
type decisionsRunFigure struct {
	Logging string `json:"logging"`
	Round   int    `json:"round"`
	authzFigure
}

func (f *decisionsRunFigure) columns() []string {
	return []string{"scenario", "logging", "round", "mode", "in flight", "checks", "decisions/s", "per cpu-s", "p50 ms", "p99 ms", "p99.9 ms", "authz cpu", "bench cpu"}
}

func (f *decisionsRunFigure) row() []string {
	fl := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{f.Scenario, f.Logging, strconv.Itoa(f.Round), f.Mode, strconv.Itoa(f.Concurrency), strconv.Itoa(f.Checks),
		strconv.FormatFloat(f.DecisionsPerS, 'f', 0, 64), strconv.FormatFloat(f.DecisionsPerCPUS, 'f', 0, 64), fl(f.P50Ms), fl(f.P99Ms), fl(f.P999Ms),
		strconv.FormatFloat(f.AuthzCPU, 'f', 2, 64), strconv.FormatFloat(f.BenchCPU, 'f', 2, 64)}
}

// targets: a round's run carries none; its variant's figure does.
func (f *decisionsRunFigure) targets() []targetResult { return nil }

// decisionsVariantFigure is one variant over every round, against logging
// off for the logged ones.
type decisionsVariantFigure struct {
	Scenario  string `json:"scenario"`
	Logging   string `json:"logging"`
	AllowRate string `json:"allow_rate,omitempty"`
	Command   string `json:"command"`
	Rounds    int    `json:"rounds"`
	AuthzCPUs string `json:"authz_cpus,omitempty"`
	// One allowed check at a time: the medians of the rounds' figures.
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	// Many in flight: the median decisions per second, and decisions per
	// CPU-second of the sidecar over every round's run together.
	DecisionsPerS    float64 `json:"decisions_per_s"`
	DecisionsPerCPUS float64 `json:"decisions_per_cpu_s"`
	// Ratios to logging off (logged variants only).
	P50Ratio    float64 `json:"p50_ratio,omitempty"`
	P99Ratio    float64 `json:"p99_ratio,omitempty"`
	PerCPURatio float64 `json:"decisions_per_cpu_s_ratio,omitempty"`
	// The node over this variant's turns: records received, their rate
	// over the turns, its CPU-seconds per second, and its CPU above the
	// idle baseline per 1,000 records.
	Records          float64 `json:"records_received"`
	RecordsPerS      float64 `json:"records_per_s"`
	Decisions        int     `json:"decisions"`
	NodeCPU          float64 `json:"node_cpu"`
	NodeCPUMsPer1000 float64 `json:"node_cpu_ms_per_1000_records,omitempty"`

	p50, p99, p999, perS []float64
	checks               int
	authzCPUS, nodeS     float64
	nodeCPU              time.Duration
}

// add takes in a round's two runs and the node's marks around them.
func (f *decisionsVariantFigure) add(seq, conc *decisionsRunFigure, before, after nodeMark) {
	f.p50, f.p99, f.p999 = append(f.p50, seq.P50Ms), append(f.p99, seq.P99Ms), append(f.p999, seq.P999Ms)
	f.perS = append(f.perS, conc.DecisionsPerS)
	f.checks += conc.Checks
	f.authzCPUS += conc.AuthzCPU * conc.DurationS
	f.Decisions += seq.Checks + conc.Checks
	f.Records += after.records - before.records
	f.nodeCPU += after.cpu - before.cpu
	f.nodeS += after.at.Sub(before.at).Seconds()
}

// finish sums the rounds up; off is logging off's figure, nil for its own.
func (f *decisionsVariantFigure) finish(idlePerS float64, off *decisionsVariantFigure) {
	f.P50Ms, f.P99Ms, f.P999Ms = round3(median(f.p50)), round3(median(f.p99)), round3(median(f.p999))
	f.DecisionsPerS = round2(median(f.perS))
	if f.authzCPUS > 0 {
		f.DecisionsPerCPUS = float64(int64(float64(f.checks)/f.authzCPUS + 0.5))
	}
	if f.nodeS > 0 {
		f.RecordsPerS = round2(f.Records / f.nodeS)
		f.NodeCPU = round3(f.nodeCPU.Seconds() / f.nodeS)
	}
	f.NodeCPUMsPer1000 = cpuMsPer1000(f.nodeCPU, f.nodeS, idlePerS, f.Records)
	if off != nil {
		f.P50Ratio, f.P99Ratio = ratio3(f.P50Ms, off.P50Ms), ratio3(f.P99Ms, off.P99Ms)
		f.PerCPURatio = ratio3(f.DecisionsPerCPUS, off.DecisionsPerCPUS)
	}
}

func (f *decisionsVariantFigure) columns() []string {
	return []string{"scenario", "logging", "allow rate", "p50 ms", "p99 ms", "p99 ratio", "decisions/s", "per cpu-s", "per cpu-s ratio",
		"records", "records/s", "node cpu", "node cpu ms/1k records"}
}

func (f *decisionsVariantFigure) row() []string {
	fl := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{f.Scenario, f.Logging, cmp.Or(f.AllowRate, "-"), fl(f.P50Ms), fl(f.P99Ms), fl(f.P99Ratio),
		strconv.FormatFloat(f.DecisionsPerS, 'f', 0, 64), fl(f.DecisionsPerCPUS), fl(f.PerCPURatio),
		fl(f.Records), fl(f.RecordsPerS), fl(f.NodeCPU), fl(f.NodeCPUMsPer1000)}
}

func (f *decisionsVariantFigure) targets() []targetResult {
	if f.P99Ratio == 0 {
		return nil
	}
	what := fmt.Sprintf("policyd authz --decision-log, allow rate %s, against logging off", f.AllowRate)
	return []targetResult{{
		Target:   what + ": p99 of one ext_authz check at a time ≤ × " + strconv.FormatFloat(targetDecisionsP99Ratio, 'f', -1, 64),
		Measured: fmt.Sprintf("× %g (p99 %g ms; p50 %g ms, × %g; medians of %d rounds)", f.P99Ratio, f.P99Ms, f.P50Ms, f.P50Ratio, f.Rounds),
		Met:      f.P99Ratio <= targetDecisionsP99Ratio,
	}, {
		Target:   what + ": decisions per CPU-second ≥ × " + strconv.FormatFloat(targetDecisionsPerCPURatio, 'f', -1, 64),
		Measured: fmt.Sprintf("× %g (%g per CPU-s; %g records/s reached the node)", f.PerCPURatio, f.DecisionsPerCPUS, f.RecordsPerS),
		Met:      f.PerCPURatio >= targetDecisionsPerCPURatio,
	}}
}

// decisionsNodeFigure is what the records cost the node.
type decisionsNodeFigure struct {
	Scenario    string  `json:"scenario"`
	Measure     string  `json:"measure"`
	NodeCPUs    string  `json:"node_cpus,omitempty"`
	IdleS       float64 `json:"idle_s"`
	IdleNodeCPU float64 `json:"idle_node_cpu"` // CPU-seconds per second
	// Over every logged variant's turns: the node's CPU above the idle
	// baseline per 1,000 records received.
	NodeCPUMsPer1000 float64 `json:"node_cpu_ms_per_1000_records"`
	// At the end: every record received, the store's size, and its bytes
	// per record (framing, and the entries of the sidecars' drop counts,
	// included).
	Records        float64 `json:"records_received"`
	StoreBytes     float64 `json:"store_bytes"`
	BytesPerRecord float64 `json:"store_bytes_per_record"`

	cpu             time.Duration
	seconds, logged float64
}

func (f *decisionsNodeFigure) add(v *decisionsVariantFigure) {
	f.cpu += v.nodeCPU
	f.seconds += v.nodeS
	f.logged += v.Records
}

func (f *decisionsNodeFigure) finish(records, storeBytes float64) {
	f.NodeCPUMsPer1000 = cpuMsPer1000(f.cpu, f.seconds, f.IdleNodeCPU, f.logged)
	f.Records, f.StoreBytes = records, storeBytes
	if records > 0 {
		f.BytesPerRecord = round2(storeBytes / records)
	}
}

func (f *decisionsNodeFigure) columns() []string {
	return []string{"scenario", "measure", "idle node cpu", "node cpu ms/1k records", "records", "store bytes", "bytes/record"}
}

func (f *decisionsNodeFigure) row() []string {
	fl := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{f.Scenario, f.Measure, fl(f.IdleNodeCPU), fl(f.NodeCPUMsPer1000), fl(f.Records), fl(f.StoreBytes), fl(f.BytesPerRecord)}
}
