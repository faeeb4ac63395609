package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Issue targets for idle memory, per connection.
const (
	targetBytesPerStream = 48 << 10 // gRPC discovery stream
	targetBytesPerWS     = 16 << 10 // WebSocket feed connection
)

// Go runtime metrics the idle-memory scenario reads from a node's /metrics
// (the node registers the Prometheus Go collector).
const (
	metricHeapInuse  = "go_memstats_heap_inuse_bytes"
	metricHeapAlloc  = "go_memstats_heap_alloc_bytes"
	metricStackInuse = "go_memstats_stack_inuse_bytes"
	metricGoroutines = "go_goroutines"
	metricGCCount    = "go_gc_duration_seconds_count"
)

// settleTolerance is how close two readings a second apart must be for the
// memory to count as settled.
const settleTolerance = 0.02

// idleMemoryConfig holds the idle-memory scenario's flags.
type idleMemoryConfig struct {
	sidecarFlags
	settleTimeout time.Duration
	gcWait        time.Duration
	// profileDir, when set, receives the measured node's heap profile
	// and goroutine dump at each reading.
	profileDir string
}

// idleMemoryScenario measures what idle sidecars cost one node: its RSS
// (/proc/<pid>/status VmRSS) and Go memory (heap and goroutine stacks, from
// its /metrics) before any sidecar connects, after -streams idle gRPC
// streams, and after -ws more idle WebSocket connections, all to the
// first node. Idle: connected, initial snapshot received (and ACKed on
// gRPC), nothing else but the feed's ping/pong.
func idleMemoryScenario() scenario {
	return scenario{
		name:    "idle-memory",
		summary: "a node's RSS and Go memory per idle gRPC stream and per idle WebSocket connection",
		setup: func(fs *flag.FlagSet) runner {
			c := &idleMemoryConfig{}
			c.register(fs, sidecarFlagDefaults{
				streams: 1000, streamsUsage: "idle gRPC discovery streams",
				ws: 1000, wsUsage: "idle WebSocket feed connections, opened after the streams",
				nodes: 1, nodesUsage: "cluster size; every sidecar connects to node1, which is measured",
				policies: 10, policiesUsage: "policies in the sidecars' org (each sidecar's initial set)",
				streamsPerConn: 100, streamsPerConnUsage: "gRPC streams multiplexed on one client connection; the node's per-connection\n" +
					"cost (HTTP/2 transport buffers) is then shared by that many streams",
			})
			fs.DurationVar(&c.settleTimeout, "settle-timeout", time.Minute,
				"how long to wait for two readings 1s apart within 2% (heap in use and RSS)")
			fs.StringVar(&c.profileDir, "profile", "", "write the measured node's heap profile (GET /debug/pprof/heap) and goroutine\n"+
				"stacks (debug=1) at each reading to this directory as node1-<phase>.heap and .goroutines")
			fs.DurationVar(&c.gcWait, "gc-wait", 150*time.Second,
				"before settling, wait up to this long for the node to finish a GC cycle after the\nphase's connections were set up, so that setup garbage is not counted (Go forces a\nGC every 2 minutes); 0 to skip")
			return c
		},
	}
}

func (c *idleMemoryConfig) validate() error {
	errs := c.sidecarFlags.validate(0)
	if c.settleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("-settle-timeout must be positive, got %v", c.settleTimeout))
	}
	if c.gcWait < 0 {
		errs = append(errs, fmt.Errorf("-gc-wait must not be negative, got %v", c.gcWait))
	}
	return errors.Join(errs...)
}

// memSample is one reading of a node's memory.
type memSample struct {
	RSS        int64 // VmRSS
	HeapInuse  int64
	HeapAlloc  int64
	StackInuse int64
	Goroutines int64
	GCs        int64 // completed GC cycles
	HasGo      bool  // the Go metrics were found
}

// memPhase is a settled reading and how it was obtained.
type memPhase struct {
	memSample
	postGC  bool // a GC cycle completed after the phase's setup, before the reading
	settled bool // two readings a second apart were within settleTolerance
}

// memProbe reads one node's memory.
type memProbe struct {
	nd     *node
	client *http.Client
	logf   func(format string, a ...any) // may be nil
}

func (p *memProbe) sample(ctx context.Context) (memSample, error) {
	var s memSample
	status, err := os.ReadFile("/proc/" + strconv.Itoa(p.nd.cmd.Process.Pid) + "/status")
	if err != nil {
		return s, fmt.Errorf("%s RSS: %w", p.nd.id, err)
	}
	if s.RSS, err = parseVmRSS(status); err != nil {
		return s, fmt.Errorf("%s RSS: %w", p.nd.id, err)
	}
	body, err := fetchMetrics(ctx, p.client, p.nd.httpAddr)
	if err != nil {
		return s, err
	}
	m := parsePromText(body)
	heap, ok := m[metricHeapInuse]
	s.HasGo = ok
	s.HeapInuse = int64(heap)
	s.HeapAlloc = int64(m[metricHeapAlloc])
	s.StackInuse = int64(m[metricStackInuse])
	s.Goroutines = int64(m[metricGoroutines])
	s.GCs = int64(m[metricGCCount])
	return s, nil
}

// forceGC asks the node to run a GC now; a failure only means waiting for
// one.
func (p *memProbe) forceGC(ctx context.Context) {
	code, _, err := get(ctx, p.client, "http://"+p.nd.httpAddr+"/debug/pprof/heap?gc=1")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("status %d", code)
	}
	if err != nil && p.logf != nil {
		p.logf("note: %s: forcing a GC failed (%v); waiting for one instead", p.nd.id, err)
	}
}

// fetchMetrics returns the Prometheus text of a node's GET /metrics.
func fetchMetrics(ctx context.Context, client *http.Client, addr string) ([]byte, error) {
	u := "http://" + addr + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	return body, nil
}

// settle waits (up to gcWait) for a GC cycle after the one numbered
// gcBase, then for two readings a second apart within settleTolerance (up
// to settleTimeout), and returns the last reading. It first asks the node
// for a GC (GET /debug/pprof/heap?gc=1, admin role): then there is no
// waiting for Go's 2-minute forced GC, unless the node does not serve it.
func (p *memProbe) settle(ctx context.Context, gcBase int64, gcWait, settleTimeout time.Duration) (memPhase, error) {
	p.forceGC(ctx)
	s, err := p.sample(ctx)
	if err != nil {
		return memPhase{}, err
	}
	gcDeadline := time.Now().Add(gcWait)
	for s.HasGo && s.GCs <= gcBase && time.Now().Before(gcDeadline) {
		if err := sleepUntil(ctx, time.Now().Add(time.Second)); err != nil {
			return memPhase{}, err
		}
		if s, err = p.sample(ctx); err != nil {
			return memPhase{}, err
		}
	}
	ph := memPhase{memSample: s, postGC: s.HasGo && s.GCs > gcBase}
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		if err := sleepUntil(ctx, time.Now().Add(time.Second)); err != nil {
			return memPhase{}, err
		}
		cur, err := p.sample(ctx)
		if err != nil {
			return memPhase{}, err
		}
		stable := stableMem(ph.memSample, cur, settleTolerance)
		ph.memSample = cur
		if stable {
			ph.settled = true
			break
		}
	}
	return ph, nil
}

// stableMem reports whether cur is within tol (a fraction) of prev in RSS
// and, when both have them, heap in use.
func stableMem(prev, cur memSample, tol float64) bool {
	within := func(a, b int64) bool {
		return math.Abs(float64(b-a)) <= tol*math.Abs(float64(a))
	}
	if !within(prev.RSS, cur.RSS) {
		return false
	}
	return !prev.HasGo || !cur.HasGo || within(prev.HeapInuse, cur.HeapInuse)
}

func (c *idleMemoryConfig) run(ctx context.Context, env *runEnv) (err error) {
	cfg := *c
	if err := cfg.checkFileLimit(env.fileLimit); err != nil {
		return err
	}
	cl, _, stop, err := startReady(ctx, env, cfg.nodes, nil, inactivityEnv)
	if err != nil {
		return err
	}
	var fleets []*fleet
	defer func() {
		if len(fleets) > 0 {
			env.logf("closing the sidecars")
		}
		for _, fl := range fleets {
			fl.close()
		}
		stop(&err)
	}()

	client := newLoadClient(32, cfg.nodes, 30*time.Second)
	defer client.CloseIdleConnections()
	addrs := cl.httpAddrs()
	if err := seedPolicies(ctx, client, addrs, 1, cfg.policies, 0); err != nil {
		return fmt.Errorf("seed policies: %w", err)
	}
	if cfg.ws > 0 {
		if err := seedEmployees(ctx, client, addrs, cfg.ws, 1); err != nil {
			return fmt.Errorf("seed employees: %w", err)
		}
	}
	nd := cl.nodes[0]
	initial, err := orgVersion(ctx, client, nd.httpAddr, orgName(0), true)
	if err != nil {
		return err
	}
	probe := &memProbe{nd: nd, client: client, logf: env.logf}

	measure := func(what, tag string) (memPhase, error) {
		s, err := probe.sample(ctx)
		if err != nil {
			return memPhase{}, err
		}
		if !s.HasGo {
			env.logf("warning: %s /metrics has no %s: reporting RSS only", nd.id, metricHeapInuse)
		}
		env.logf("%s: waiting for a GC (up to %v) and for memory to settle (up to %v)", what, cfg.gcWait, cfg.settleTimeout)
		ph, err := probe.settle(ctx, s.GCs, cfg.gcWait, cfg.settleTimeout)
		if err != nil {
			return memPhase{}, err
		}
		if !ph.settled {
			env.logf("warning: %s: memory did not settle within %v; using the last reading", what, cfg.settleTimeout)
		}
		env.logf("%s: RSS %s, heap in use %s, stacks %s, %d goroutines (post-GC %v)", what,
			kib(ph.RSS), kib(ph.HeapInuse), kib(ph.StackInuse), ph.Goroutines, ph.postGC)
		if cfg.profileDir != "" {
			base := filepath.Join(cfg.profileDir, nd.id+"-"+tag)
			if err := errors.Join(
				fetchProfile(ctx, client, "http://"+nd.httpAddr+"/debug/pprof/heap", base+".heap"),
				fetchProfile(ctx, client, "http://"+nd.httpAddr+"/debug/pprof/goroutine?debug=1", base+".goroutines"),
			); err != nil {
				return memPhase{}, err
			}
		}
		return ph, cl.checkAlive()
	}
	open := func(spec fleetSpec, what string) error {
		spec.grpcAddrs, spec.httpAddrs = []string{nd.grpcAddr}, []string{nd.httpAddr}
		spec.nodes, spec.orgs, spec.grpcScope = 1, 1, "employee"
		spec.streamsPerConn, spec.dialConcurrency = cfg.streamsPerConn, cfg.dialConcurrency
		start := time.Now()
		fl, err := openFleet(ctx, spec)
		if err != nil {
			return fmt.Errorf("open %s: %w", what, err)
		}
		fleets = append(fleets, fl)
		w := fl.watch(map[int]string{0: initial})
		complete, err := fl.wait(ctx, w, cfg.connectTimeout)
		if err != nil {
			return err
		}
		if !complete {
			return fmt.Errorf("after %v, %d of %d %s do not hold the initial version; first errors: %q",
				cfg.connectTimeout, countMissing(w), len(w.expected), what, fl.errors())
		}
		env.logf("%d %s open and holding the initial version in %v", len(w.expected), what, time.Since(start).Round(time.Millisecond))
		return nil
	}

	base, err := measure("before any sidecar", "base")
	if err != nil {
		return err
	}
	prev := base
	if cfg.streams > 0 {
		if err := open(fleetSpec{grpc: cfg.streams}, "gRPC streams"); err != nil {
			return err
		}
		after, err := measure(fmt.Sprintf("after %d gRPC streams", cfg.streams), "grpc")
		if err != nil {
			return err
		}
		if err := env.emit(idleMemFigureFor(cfg, nd, kindGRPC, cfg.streams, prev, after)); err != nil {
			return err
		}
		prev = after
	}
	if cfg.ws > 0 {
		if err := open(fleetSpec{ws: cfg.ws}, "WebSocket connections"); err != nil {
			return err
		}
		after, err := measure(fmt.Sprintf("after %d more WebSocket connections", cfg.ws), "ws")
		if err != nil {
			return err
		}
		if err := env.emit(idleMemFigureFor(cfg, nd, kindWS, cfg.ws, prev, after)); err != nil {
			return err
		}
	}
	for _, fl := range fleets {
		if d := fl.deaths[kindGRPC].Load() + fl.deaths[kindWS].Load(); d > 0 {
			return fmt.Errorf("%d sidecar connection(s) ended while idle; first errors: %q", d, fl.errors())
		}
	}
	return nil
}

// kib formats a byte count in KiB.
func kib(b int64) string { return strconv.FormatFloat(float64(b)/1024, 'f', 1, 64) + " KiB" }

// idleMemFigure is one transport's memory cost, printed as one JSON line.
type idleMemFigure struct {
	Scenario       string `json:"scenario"`
	Transport      string `json:"transport"`
	Nodes          int    `json:"nodes"`
	Node           string `json:"node"` // the measured node
	Conns          int    `json:"conns"`
	StreamsPerConn int    `json:"streams_per_conn,omitempty"`
	Policies       int    `json:"policies"`
	// Readings before and after opening this transport's connections.
	BeforeRSS        int64 `json:"before_rss_bytes"`
	AfterRSS         int64 `json:"after_rss_bytes"`
	BeforeHeapInuse  int64 `json:"before_heap_inuse_bytes"`
	AfterHeapInuse   int64 `json:"after_heap_inuse_bytes"`
	BeforeHeapAlloc  int64 `json:"before_heap_alloc_bytes"`
	AfterHeapAlloc   int64 `json:"after_heap_alloc_bytes"`
	BeforeStackInuse int64 `json:"before_stack_inuse_bytes"`
	AfterStackInuse  int64 `json:"after_stack_inuse_bytes"`
	BeforeGoroutines int64 `json:"before_goroutines"`
	AfterGoroutines  int64 `json:"after_goroutines"`
	// Per connection: (after − before) / conns.
	RSSPerConn        int64   `json:"rss_bytes_per_conn"`
	HeapInusePerConn  int64   `json:"heap_inuse_bytes_per_conn"`
	HeapAllocPerConn  int64   `json:"heap_alloc_bytes_per_conn"`
	StackPerConn      int64   `json:"stack_bytes_per_conn"`
	GoroutinesPerConn float64 `json:"goroutines_per_conn"`
	// GoMetrics is false when the node exposes no Go runtime metrics
	// (then only RSS is reported).
	GoMetrics bool `json:"go_metrics"`
	// PostGC: both readings followed a GC cycle that ran after their
	// setup; Settled: both were stable within 2% over a second.
	PostGC      bool  `json:"post_gc"`
	Settled     bool  `json:"settled"`
	TargetBytes int64 `json:"target_bytes_per_conn"`
	// Met by RSS, and by Go memory (heap in use + stacks).
	TargetMetRSS bool `json:"target_met_rss"`
	TargetMetGo  bool `json:"target_met_go"`
}

func idleMemFigureFor(cfg idleMemoryConfig, nd *node, k sidecarKind, conns int, before, after memPhase) *idleMemFigure {
	per := func(b, a int64) int64 { return (a - b) / int64(conns) }
	f := &idleMemFigure{
		Scenario: "idle-memory", Transport: k.String(), Nodes: cfg.nodes, Node: nd.id, Conns: conns,
		Policies:  cfg.policies,
		BeforeRSS: before.RSS, AfterRSS: after.RSS,
		BeforeHeapInuse: before.HeapInuse, AfterHeapInuse: after.HeapInuse,
		BeforeHeapAlloc: before.HeapAlloc, AfterHeapAlloc: after.HeapAlloc,
		BeforeStackInuse: before.StackInuse, AfterStackInuse: after.StackInuse,
		BeforeGoroutines: before.Goroutines, AfterGoroutines: after.Goroutines,
		RSSPerConn:        per(before.RSS, after.RSS),
		HeapInusePerConn:  per(before.HeapInuse, after.HeapInuse),
		HeapAllocPerConn:  per(before.HeapAlloc, after.HeapAlloc),
		StackPerConn:      per(before.StackInuse, after.StackInuse),
		GoroutinesPerConn: round2(float64(after.Goroutines-before.Goroutines) / float64(conns)),
		GoMetrics:         before.HasGo && after.HasGo,
		PostGC:            before.postGC && after.postGC,
		Settled:           before.settled && after.settled,
		TargetBytes:       targetBytesPerWS,
	}
	if k == kindGRPC {
		f.StreamsPerConn = cfg.streamsPerConn
		f.TargetBytes = targetBytesPerStream
	}
	f.TargetMetRSS = f.RSSPerConn <= f.TargetBytes
	f.TargetMetGo = f.GoMetrics && f.HeapInusePerConn+f.StackPerConn <= f.TargetBytes
	return f
}

func (f *idleMemFigure) columns() []string {
	return []string{"scenario", "transport", "conns", "conns/tcp", "rss/conn KiB", "heap/conn KiB",
		"stack/conn KiB", "goroutines/conn", "post-gc", "settled", "target KiB", "met (rss)", "met (heap+stack)"}
}

func (f *idleMemFigure) row() []string {
	k := func(b int64) string { return strconv.FormatFloat(float64(b)/1024, 'f', 1, 64) }
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	spc := "1"
	if f.StreamsPerConn > 0 {
		spc = strconv.Itoa(f.StreamsPerConn)
	}
	heap, stack := k(f.HeapInusePerConn), k(f.StackPerConn)
	if !f.GoMetrics {
		heap, stack = "n/a", "n/a"
	}
	return []string{f.Scenario, f.Transport, strconv.Itoa(f.Conns), spc, k(f.RSSPerConn), heap, stack,
		strconv.FormatFloat(f.GoroutinesPerConn, 'f', -1, 64), yes(f.PostGC), yes(f.Settled),
		k(f.TargetBytes), yes(f.TargetMetRSS), yes(f.TargetMetGo)}
}

// parseVmRSS returns the VmRSS of a /proc/<pid>/status file, in bytes.
func parseVmRSS(status []byte) (int64, error) { return parseStatusKB(status, "VmRSS") }

// parseStatusKB returns field (VmRSS, RssAnon, RssFile…) of a
// /proc/<pid>/status file, in bytes.
func parseStatusKB(status []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected %s line %q", field, sc.Text())
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("unexpected %s line %q", field, sc.Text())
		}
		return n * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s line (a kernel thread, or not Linux)", field)
}

// parsePromText returns the samples without labels of a Prometheus text
// exposition: name → value. Labelled samples, comments and lines it cannot
// parse are skipped.
func parsePromText(text []byte) map[string]float64 {
	m := map[string]float64{}
	for line := range bytes.SplitSeq(text, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		f := strings.Fields(string(line))
		if len(f) < 2 || strings.ContainsRune(f[0], '{') {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		m[f[0]] = v
	}
	return m
}

// parsePromHistogram returns the cumulative bucket counts of histogram name
// in a Prometheus text exposition, le → count, summed over every other
// label (e.g. the node's).
func parsePromHistogram(text []byte, name string) map[float64]float64 {
	m := map[float64]float64{}
	prefix := name + "_bucket{"
	for line := range bytes.SplitSeq(text, []byte("\n")) {
		rest, ok := strings.CutPrefix(string(bytes.TrimSpace(line)), prefix)
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "}")
		if !ok {
			continue
		}
		_, le, ok := strings.Cut(labels, `le="`)
		if !ok {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		bound, err := strconv.ParseFloat(le, 64) // accepts +Inf
		if err != nil {
			continue
		}
		f := strings.Fields(value)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		m[bound] += v
	}
	return m
}

// histogramQuantile returns the upper bound of the bucket holding the q-th
// quantile (0 < q ≤ 1) of the observations counted in after but not in
// before (cumulative buckets, see parsePromHistogram), and how many there
// were. The bound is +Inf when the quantile is past the last finite bucket,
// and 0 with no observations.
func histogramQuantile(before, after map[float64]float64, q float64) (float64, int64) {
	bounds := make([]float64, 0, len(after))
	for b := range after {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 {
		return 0, 0
	}
	total := after[bounds[len(bounds)-1]] - before[bounds[len(bounds)-1]]
	if total <= 0 {
		return 0, 0
	}
	rank := math.Ceil(q * total)
	for _, b := range bounds {
		if after[b]-before[b] >= rank {
			return b, int64(total)
		}
	}
	return math.Inf(1), int64(total)
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the user+system CPU time of process pid ("self" for
// bench itself) so far, from /proc/<pid>/stat.
func procCPU(pid string) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	return parseProcStatCPU(b)
}

// procWriteSyscalls returns how many write system calls process pid has
// made so far (syscw in /proc/<pid>/io).
func procWriteSyscalls(pid string) (uint64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/io")
	if err != nil {
		return 0, err
	}
	return parseProcIOSyscw(b)
}

// parseProcIOSyscw returns the syscw field of a /proc/<pid>/io file.
func parseProcIOSyscw(io []byte) (uint64, error) {
	for line := range strings.Lines(string(io)) {
		if v, ok := strings.CutPrefix(line, "syscw:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("io: bad syscw %q", strings.TrimSpace(v))
			}
			return n, nil
		}
	}
	return 0, errors.New("io: no syscw line")
}

// parseProcStatCPU returns utime+stime of a /proc/<pid>/stat line. The
// command name (field 2) is in parentheses and may itself hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseProcStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no ')' after the command name")
	}
	// After ')': field 3 (state) onwards; utime and stime are fields 14, 15.
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("stat: bad CPU time %q", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
