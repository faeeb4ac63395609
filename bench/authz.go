package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
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
	"sync"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/authz"
	"github.com/policyd/policyd/internal/authz/benchset"
	"github.com/policyd/policyd/internal/loopback"
)

// The target for one decision through ext_authz gRPC on loopback.
const targetAuthzP99 = time.Millisecond

// authzConfig holds the authz scenario's flags.
type authzConfig struct {
	requests     int
	warmup       int
	concurrency  int
	conns        int
	duration     time.Duration
	httpRequests int
	httpDuration time.Duration
	idle         time.Duration
	authzCPUs    string
}

// authzScenario measures `policyd authz`, the decision sidecar:
// its idle RSS, the latency of one check at a time through ext_authz gRPC
// and POST /v1/check, and the decisions per second it serves with many
// checks in flight, on the CPUs of -authz-cpus. One policyd node holds 20
// ValidatingPolicies and 20 ToolPolicies for the sidecar's org.
func authzScenario() scenario {
	return scenario{
		name:    "authz",
		summary: "policyd authz (one node, 20 ValidatingPolicies + 20 ToolPolicies): idle RSS, gRPC and HTTP decision latency, decisions/s on one core",
		setup: func(fs *flag.FlagSet) runner {
			c := &authzConfig{}
			fs.IntVar(&c.requests, "requests", 20000, "sequential ext_authz checks timed per case (allow, deny)")
			fs.IntVar(&c.warmup, "warmup", 2000, "checks sent before each timed run, not timed")
			fs.IntVar(&c.concurrency, "concurrency", 32, "checks in flight in the throughput runs")
			fs.IntVar(&c.conns, "conns", 4, "gRPC connections the throughput run's checks share (Envoy opens one per worker)")
			fs.DurationVar(&c.duration, "duration", 10*time.Second, "length of the gRPC throughput run")
			fs.IntVar(&c.httpRequests, "http-requests", 5000, "sequential POST /v1/check requests timed per case")
			fs.DurationVar(&c.httpDuration, "http-duration", 3*time.Second, "length of the HTTP throughput run")
			fs.DurationVar(&c.idle, "idle", 2*time.Second, "how long the sidecar idles after it is ready before its RSS is read")
			fs.StringVar(&c.authzCPUs, "authz-cpus", "1", "CPU list the authz process is pinned to (taskset -c), \"\" for none; unless\n"+
				"-load-cpus is given, bench runs on its other CPUs while it measures")
			return c
		},
	}
}

func (c *authzConfig) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"-requests", c.requests}, {"-concurrency", c.concurrency}, {"-conns", c.conns}, {"-http-requests", c.httpRequests}} {
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
	}{{"-duration", c.duration}, {"-http-duration", c.httpDuration}} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", f.name, f.v))
		}
	}
	if c.idle < 0 {
		errs = append(errs, fmt.Errorf("-idle must not be negative, got %v", c.idle))
	}
	if c.authzCPUs != "" {
		if _, err := parseCPUList(c.authzCPUs); err != nil {
			errs = append(errs, fmt.Errorf("-authz-cpus: %w", err))
		}
	}
	return errors.Join(errs...)
}

// authzHTTPBody is the POST /v1/check body of a case: the same request
// attributes as authzRequest, plus a tool call that no ToolPolicy denies,
// so that both kinds are evaluated.
func authzHTTPBody(denied bool) []byte {
	path := benchset.Path(denied)
	peer := func(addr, principal string) map[string]any {
		return map[string]any{"address": addr, "principal": principal}
	}
	b, err := json.Marshal(authz.CheckRequest{
		Request: map[string]any{
			"method": "GET", "path": path, "host": "api.example.com", "scheme": "https", "protocol": "HTTP/1.1",
			"headers": benchset.Headers(path), "size": 0, "id": "7c1f5c2e-3b1a-4a43-9d0e-4f8a2d6b9e01",
			"source":            peer("10.0.3.17:43122", "spiffe://cluster.local/ns/shop/sa/frontend"),
			"destination":       peer("10.0.5.4:8080", "spiffe://cluster.local/ns/shop/sa/orders"),
			"contextExtensions": map[string]string{"virtual_host": "orders"},
		},
		Tool:  "Bash",
		Input: map[string]any{"command": "ls -la /tmp"},
	})
	if err != nil {
		panic(err) // static shapes: a bug
	}
	return b
}

func (c *authzConfig) run(ctx context.Context, env *runEnv) (err error) {
	var authzCPUs cpuList
	if c.authzCPUs != "" {
		authzCPUs, _ = parseCPUList(c.authzCPUs) // validated
		if err := (&pinFlags{node: authzCPUs}).check(env.allowedCPUs, env.allowedErr); err != nil {
			return fmt.Errorf("-authz-cpus: %w", err)
		}
	}
	cl, _, stop, err := startReady(ctx, env, 1, nil)
	if err != nil {
		return err
	}
	defer stop(&err)
	client := newLoadClient(c.concurrency, 1, 30*time.Second)
	defer client.CloseIdleConnections()
	api, err := nodeAPI(client, cl.nodes[0].httpAddr)
	if err != nil {
		return err
	}
	set := benchset.Policies()
	for name, doc := range set {
		if _, err := api.PutPolicy(ctx, name, doc, adminclient.AnyRevision); err != nil {
			return fmt.Errorf("PUT /v1/policies/%s: %w", name, err)
		}
	}

	sc, err := startAuthz(env, cl.nodes[0].grpcAddr, authzCPUs.String())
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := sc.stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stop authz: %w", stopErr))
		}
		if err != nil && ctx.Err() == nil {
			sc.dumpLogs(env.stderr)
		}
	}()
	nd := sc.nodes[0]
	readyStart := time.Now()
	if err := waitAuthzReady(ctx, client, sc, len(set), env.readyTimeout); err != nil {
		return err
	}
	env.logf("authz ready with %d policies in %v (pid %d, CPUs %s)", len(set), time.Since(readyStart).Round(time.Millisecond),
		nd.cmd.Process.Pid, cmp.Or(authzCPUs.String(), "not pinned"))

	// The load generator leaves the sidecar's CPUs alone, unless told
	// where to run.
	if authzCPUs.isSet() && env.loadCPUs == "" {
		var rest []int
		for _, cpu := range env.allowedCPUs {
			if !slices.Contains(authzCPUs.cpus, cpu) {
				rest = append(rest, cpu)
			}
		}
		if len(rest) == 0 {
			env.logf("warning: no CPU left for bench beside -authz-cpus %s: bench and the sidecar share it", &authzCPUs)
		} else {
			unpin, err := pinProcess(rest)
			if err != nil {
				return fmt.Errorf("pin bench to CPU(s) %s: %w", formatCPUs(rest), err)
			}
			defer func() {
				if uerr := unpin(); uerr != nil {
					err = errors.Join(err, fmt.Errorf("unpin bench: %w", uerr))
				}
			}()
			env.logf("pinned: bench to CPU(s) %s while it measures", formatCPUs(rest))
		}
	}

	if err := sleepUntil(ctx, time.Now().Add(c.idle)); err != nil {
		return err
	}
	idle, err := authzIdleFor(ctx, client, nd, len(set), c.idle, authzCPUs.String())
	if err != nil {
		return err
	}
	if err := env.emit(idle); err != nil {
		return err
	}
	env.logf("idle: RSS %s (anonymous %s, files %s), heap in use %s, %d goroutines", kib(idle.RSSBytes),
		kib(idle.RSSAnonBytes), kib(idle.RSSFileBytes), kib(idle.HeapInuseBytes), idle.Goroutines)

	cc, err := grpc.NewClient(nd.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("grpc client for %s: %w", nd.grpcAddr, err)
	}
	defer cc.Close()
	grpcCheck := grpcChecker(authv3.NewAuthorizationClient(cc))
	httpCheck := httpChecker(client, nd.httpAddr)
	base := authzFigure{Scenario: "authz", Policies: len(set), AuthzCPUs: authzCPUs.String()}
	pid := strconv.Itoa(nd.cmd.Process.Pid)

	for _, api := range []struct {
		name  string
		check func(bool) checkOnce
		n     int
	}{{"grpc", grpcCheck, c.requests}, {"http", httpCheck, c.httpRequests}} {
		for _, denied := range []bool{false, true} {
			check := api.check(denied)
			f := base
			f.API, f.Case, f.Mode, f.Concurrency = api.name, caseName(denied), "sequential", 1
			env.logf("%s %s: %d sequential checks", api.name, f.Case, api.n)
			if err := measureAuthz(ctx, &f, pid, check, c.warmup, api.n); err != nil {
				return err
			}
			if err := env.emit(&f); err != nil {
				return err
			}
		}
	}

	// Throughput: many checks in flight over a few connections, as Envoy's
	// workers send them.
	conns := make([]authv3.AuthorizationClient, c.conns)
	for i := range conns {
		cc, err := grpc.NewClient(nd.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("grpc client for %s: %w", nd.grpcAddr, err)
		}
		defer cc.Close()
		conns[i] = authv3.NewAuthorizationClient(cc)
	}
	spread := func(w int) checkOnce { return grpcChecker(conns[w%len(conns)])(false) }
	gf := base
	gf.API, gf.Case, gf.Mode, gf.Concurrency, gf.Conns = "grpc", "allow", "concurrent", c.concurrency, c.conns
	env.logf("grpc allow: %d in flight on %d connections for %v", c.concurrency, c.conns, c.duration)
	if err := measureAuthzConcurrent(ctx, &gf, pid, spread, c.warmup, c.duration, c.concurrency); err != nil {
		return err
	}
	if err := env.emit(&gf); err != nil {
		return err
	}
	hf := base
	hf.API, hf.Case, hf.Mode, hf.Concurrency, hf.Conns = "http", "allow", "concurrent", c.concurrency, c.concurrency
	env.logf("http allow: %d in flight for %v", c.concurrency, c.httpDuration)
	if err := measureAuthzConcurrent(ctx, &hf, pid, func(int) checkOnce { return httpCheck(false) }, c.warmup, c.httpDuration, c.concurrency); err != nil {
		return err
	}
	if err := env.emit(&hf); err != nil {
		return err
	}
	return sc.checkAlive()
}

func caseName(denied bool) string {
	if denied {
		return "deny"
	}
	return "allow"
}

// startAuthz starts `policyd authz` following benchset.Org on the node at
// grpcAddr, on free loopback ports, pinned to cpus unless it is empty. It
// is a cluster of one for its stop and log handling.
func startAuthz(env *runEnv, grpcAddr, cpus string) (*cluster, error) {
	ports, err := loopback.FreePorts(2)
	if err != nil {
		return nil, err
	}
	nd := &node{
		id:       "authz",
		grpcAddr: loopback.Addr(ports[0]),
		httpAddr: loopback.Addr(ports[1]),
		dir:      filepath.Join(env.workDir, "authz"),
		cpus:     cpus,
	}
	nd.logPath = filepath.Join(nd.dir, "authz.log")
	nd.args = []string{"authz", "--servers", grpcAddr, "--org", benchset.Org,
		"--grpc-addr", nd.grpcAddr, "--http-addr", nd.httpAddr}
	if err := os.MkdirAll(nd.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", nd.dir, err)
	}
	if err := nd.start(env.binary, nil); err != nil {
		return nil, err
	}
	return &cluster{dir: nd.dir, nodes: []*node{nd}, binary: env.binary}, nil
}

// waitAuthzReady polls the sidecar until /readyz answers 200 and its
// /metrics count policies policies: the node's policy index may take in
// the last writes after the first snapshot was sent.
func waitAuthzReady(ctx context.Context, client *http.Client, sc *cluster, policies int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nd := sc.nodes[0]
	var last error
	for {
		if err := sc.checkAlive(); err != nil {
			return err
		}
		last = authzReadyOnce(ctx, client, nd.httpAddr, policies)
		if last == nil {
			return nil
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("authz not ready after %v: %w", timeout, last)
			}
			return err
		}
	}
}

func authzReadyOnce(ctx context.Context, client *http.Client, addr string, policies int) error {
	code, body, err := get(ctx, client, "http://"+addr+"/readyz")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("/readyz: %d %s", code, bytes.TrimSpace(body))
	}
	m, err := fetchMetrics(ctx, client, addr)
	if err != nil {
		return err
	}
	if got := parsePromText(m)["policyd_authz_policies"]; int(got) != policies {
		return fmt.Errorf("holds %g policies, want %d", got, policies)
	}
	return nil
}

// authzIdleFigure is the sidecar's memory once ready and idle.
type authzIdleFigure struct {
	Scenario string  `json:"scenario"`
	Measure  string  `json:"measure"`
	Policies int     `json:"policies"`
	IdleS    float64 `json:"idle_s"`
	RSSBytes int64   `json:"rss_bytes"`
	// RSS of anonymous memory (heap, stacks) and of files (the binary's
	// pages, shared with every process running it).
	RSSAnonBytes   int64  `json:"rss_anon_bytes"`
	RSSFileBytes   int64  `json:"rss_file_bytes"`
	HeapInuseBytes int64  `json:"heap_inuse_bytes"`
	StackBytes     int64  `json:"stack_inuse_bytes"`
	Goroutines     int64  `json:"goroutines"`
	AuthzCPUs      string `json:"authz_cpus,omitempty"`
}

func authzIdleFor(ctx context.Context, client *http.Client, nd *node, policies int, idle time.Duration, cpus string) (*authzIdleFigure, error) {
	s, err := (&memProbe{nd: nd, client: client}).sample(ctx)
	if err != nil {
		return nil, err
	}
	f := &authzIdleFigure{Scenario: "authz", Measure: "idle", Policies: policies, IdleS: idle.Seconds(),
		RSSBytes: s.RSS, HeapInuseBytes: s.HeapInuse, StackBytes: s.StackInuse, Goroutines: s.Goroutines, AuthzCPUs: cpus}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(nd.cmd.Process.Pid) + "/status")
	if err == nil {
		f.RSSAnonBytes, err = parseStatusKB(status, "RssAnon")
	}
	if err == nil {
		f.RSSFileBytes, err = parseStatusKB(status, "RssFile")
	}
	if err != nil {
		return nil, fmt.Errorf("authz RSS: %w", err)
	}
	return f, nil
}

func (f *authzIdleFigure) columns() []string {
	return []string{"scenario", "measure", "policies", "rss KiB", "anon KiB", "file KiB", "heap KiB", "stack KiB", "goroutines"}
}

func (f *authzIdleFigure) row() []string {
	k := func(b int64) string { return strconv.FormatFloat(float64(b)/1024, 'f', 1, 64) }
	return []string{f.Scenario, f.Measure, strconv.Itoa(f.Policies), k(f.RSSBytes), k(f.RSSAnonBytes), k(f.RSSFileBytes),
		k(f.HeapInuseBytes), k(f.StackBytes),
		strconv.FormatInt(f.Goroutines, 10)}
}

// authzFigure is one timed run of checks.
type authzFigure struct {
	Scenario    string `json:"scenario"`
	API         string `json:"api"`  // grpc (ext_authz) or http (POST /v1/check)
	Case        string `json:"case"` // allow, or deny by the last policy
	Mode        string `json:"mode"` // sequential (one at a time) or concurrent
	Concurrency int    `json:"concurrency"`
	Conns       int    `json:"conns,omitempty"`
	Policies    int    `json:"policies"`
	AuthzCPUs   string `json:"authz_cpus,omitempty"`
	// Checks timed, and over how long.
	Checks        int     `json:"checks"`
	DurationS     float64 `json:"duration_s"`
	DecisionsPerS float64 `json:"decisions_per_s"`
	MeanMs        float64 `json:"mean_ms"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	P999Ms        float64 `json:"p999_ms"`
	MaxMs         float64 `json:"max_ms"`
	// CPU the sidecar and bench used over the run, in seconds per second.
	AuthzCPU float64 `json:"authz_cpu"`
	BenchCPU float64 `json:"bench_cpu"`
	// DecisionsPerCPUS is decisions per CPU-second of the sidecar: on a
	// shared machine, what one core it had to itself would serve.
	DecisionsPerCPUS float64 `json:"decisions_per_cpu_s"`
	// Target: p99 through gRPC, one check at a time.
	Target    string `json:"target,omitempty"`
	TargetMet bool   `json:"target_met,omitempty"`
}

func (f *authzFigure) columns() []string {
	return []string{"scenario", "api", "case", "mode", "in flight", "checks", "decisions/s", "per cpu-s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "authz cpu", "bench cpu", "target"}
}

func (f *authzFigure) row() []string {
	fl := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	target := "-"
	if f.Target != "" {
		target = "no"
		if f.TargetMet {
			target = "yes"
		}
	}
	return []string{f.Scenario, f.API, f.Case, f.Mode, strconv.Itoa(f.Concurrency), strconv.Itoa(f.Checks),
		strconv.FormatFloat(f.DecisionsPerS, 'f', 0, 64), strconv.FormatFloat(f.DecisionsPerCPUS, 'f', 0, 64), fl(f.P50Ms), fl(f.P99Ms), fl(f.P999Ms), fl(f.MaxMs),
		strconv.FormatFloat(f.AuthzCPU, 'f', 2, 64), strconv.FormatFloat(f.BenchCPU, 'f', 2, 64), target}
}

func (f *authzFigure) targets() []targetResult {
	if f.Target == "" {
		return nil
	}
	return []targetResult{{
		Target:   fmt.Sprintf("authz %s via ext_authz gRPC on loopback, one at a time (%d policies): %s", f.Case, f.Policies, f.Target),
		Measured: fmt.Sprintf("p50 %g ms, p99 %g ms, p99.9 %g ms (%d checks)", f.P50Ms, f.P99Ms, f.P999Ms, f.Checks),
		Met:      f.TargetMet,
	}}
}

// checkOnce sends one check and reports an answer other than the case's
// expected one as an error.
type checkOnce func(ctx context.Context) error

// grpcChecker returns checks of a case through ext_authz gRPC.
func grpcChecker(ac authv3.AuthorizationClient) func(denied bool) checkOnce {
	return func(denied bool) checkOnce {
		req := benchset.Request(denied)
		return func(ctx context.Context) error {
			resp, err := ac.Check(ctx, req)
			if err != nil {
				return err
			}
			return checkGRPCAnswer(resp, denied)
		}
	}
}

// checkGRPCAnswer is nil when resp is the case's answer: OK, or 403 from
// benchset.DenyingPolicy.
func checkGRPCAnswer(resp *authv3.CheckResponse, denied bool) error {
	code := codes.Code(resp.GetStatus().GetCode())
	if !denied {
		if code != codes.OK {
			return fmt.Errorf("status %v (%q), want OK", code, resp.GetStatus().GetMessage())
		}
		return nil
	}
	if code != codes.PermissionDenied || resp.GetDeniedResponse().GetStatus().GetCode() != http.StatusForbidden {
		return fmt.Errorf("status %v, HTTP %v, want PERMISSION_DENIED and 403", code, resp.GetDeniedResponse().GetStatus().GetCode())
	}
	for _, h := range resp.GetDeniedResponse().GetHeaders() {
		if h.GetHeader().GetKey() == authz.HeaderPolicy {
			if got := h.GetHeader().GetValue(); got != benchset.DenyingPolicy {
				return fmt.Errorf("denied by %s, want %s", got, benchset.DenyingPolicy)
			}
			return nil
		}
	}
	return fmt.Errorf("denial without %s", authz.HeaderPolicy)
}

// httpChecker returns checks of a case through POST /v1/check.
func httpChecker(client *http.Client, addr string) func(denied bool) checkOnce {
	url := "http://" + addr + "/v1/check"
	return func(denied bool) checkOnce {
		body := authzHTTPBody(denied)
		return func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if err != nil {
				return fmt.Errorf("read answer: %w", err)
			}
			return checkHTTPAnswer(resp.StatusCode, b, denied)
		}
	}
}

// checkHTTPAnswer is nil when the answer is the case's: 200 with allowed,
// or denied by benchset.DenyingPolicy.
func checkHTTPAnswer(status int, body []byte, denied bool) error {
	if status != http.StatusOK {
		return fmt.Errorf("status %d: %s", status, bytes.TrimSpace(body))
	}
	var a authz.CheckResponse
	if err := json.Unmarshal(body, &a); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	switch {
	case a.Allowed == denied:
		return fmt.Errorf("allowed %v, want %v (policy %q, message %q, error %q)", a.Allowed, !denied, a.Policy, a.Message, a.Error)
	case denied && a.Policy != benchset.DenyingPolicy:
		return fmt.Errorf("denied by %q, want %s", a.Policy, benchset.DenyingPolicy)
	}
	return nil
}

// measureAuthz times n checks one at a time, after warmup untimed ones,
// into f.
func measureAuthz(ctx context.Context, f *authzFigure, pid string, check checkOnce, warmup, n int) error {
	for range warmup {
		if err := check(ctx); err != nil {
			return fmt.Errorf("%s %s warm-up: %w", f.API, f.Case, err)
		}
	}
	lat := make([]time.Duration, 0, n)
	cpu, err := startCPU(pid)
	if err != nil {
		return err
	}
	start := time.Now()
	for range n {
		t0 := time.Now()
		err := check(ctx)
		lat = append(lat, time.Since(t0))
		if err != nil {
			return fmt.Errorf("%s %s check %d: %w", f.API, f.Case, len(lat), err)
		}
	}
	elapsed := time.Since(start)
	if err := cpu.finish(f, elapsed); err != nil {
		return err
	}
	f.fill(lat, elapsed)
	f.perCPU()
	if f.API == "grpc" {
		f.Target = "p99 ≤ 1 ms"
		f.TargetMet = f.P99Ms <= ms(targetAuthzP99)
	}
	return nil
}

// measureAuthzConcurrent runs workers goroutines, each sending the checks
// of checkFor(its index) one after another, for d after a warm-up of
// warmup checks in all, and puts the decisions per second into f.
func measureAuthzConcurrent(ctx context.Context, f *authzFigure, pid string, checkFor func(worker int) checkOnce, warmup int, d time.Duration, workers int) error {
	run := func(until time.Time, perWorker int) ([][]time.Duration, error) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		lats := make([][]time.Duration, workers)
		var wg sync.WaitGroup
		for w := range workers {
			check := checkFor(w)
			wg.Go(func() {
				for i := 0; ctx.Err() == nil && (perWorker == 0 || i < perWorker); i++ {
					t0 := time.Now()
					if t0.After(until) {
						return
					}
					if err := check(ctx); err != nil {
						if ctx.Err() == nil {
							cancel(fmt.Errorf("%s %s worker %d: %w", f.API, f.Case, w, err))
						}
						return
					}
					lats[w] = append(lats[w], time.Since(t0))
				}
			})
		}
		wg.Wait()
		if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
		return lats, ctx.Err()
	}
	if warmup > 0 {
		if _, err := run(time.Now().Add(d), max(1, warmup/workers)); err != nil {
			return err
		}
	}
	cpu, err := startCPU(pid)
	if err != nil {
		return err
	}
	start := time.Now()
	lats, err := run(start.Add(d), 0)
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	if err := cpu.finish(f, elapsed); err != nil {
		return err
	}
	f.fill(slices.Concat(lats...), elapsed)
	f.perCPU()
	return nil
}

// fill summarizes lat, taken over elapsed, into f.
func (f *authzFigure) fill(lat []time.Duration, elapsed time.Duration) {
	s := summarize(lat)
	f.Checks = s.count
	f.DurationS = round2(elapsed.Seconds())
	f.DecisionsPerS = round2(float64(s.count) / elapsed.Seconds())
	f.MeanMs, f.P50Ms, f.P99Ms, f.MaxMs = ms(s.mean), ms(s.p50), ms(s.p99), ms(s.max)
	f.P999Ms = ms(percentile(lat, 99.9))
}

// cpuMark is the CPU time of the sidecar and of bench at the start of a run.
type cpuMark struct {
	pid           string
	authz, itself time.Duration
}

func startCPU(pid string) (cpuMark, error) {
	m := cpuMark{pid: pid}
	var err error
	if m.authz, err = procCPU(pid); err != nil {
		return m, fmt.Errorf("authz CPU time: %w", err)
	}
	if m.itself, err = procCPU("self"); err != nil {
		return m, fmt.Errorf("bench CPU time: %w", err)
	}
	return m, nil
}

// finish puts the CPU used since m, per second of elapsed, into f.
func (m cpuMark) finish(f *authzFigure, elapsed time.Duration) error {
	a, err := procCPU(m.pid)
	if err != nil {
		return fmt.Errorf("authz CPU time: %w", err)
	}
	b, err := procCPU("self")
	if err != nil {
		return fmt.Errorf("bench CPU time: %w", err)
	}
	f.AuthzCPU = round2((a - m.authz).Seconds() / elapsed.Seconds())
	f.BenchCPU = round2((b - m.itself).Seconds() / elapsed.Seconds())
	return nil
}

// perCPU sets DecisionsPerCPUS from the decisions and the sidecar's CPU.
func (f *authzFigure) perCPU() {
	if f.AuthzCPU > 0 {
		f.DecisionsPerCPUS = math.Round(f.DecisionsPerS / f.AuthzCPU)
	}
}
