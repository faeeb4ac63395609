package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
)

// Console targets: a page's server render time on loopback and its weight
// (HTML plus the assets it references).
const (
	targetConsoleP99    = 50 * time.Millisecond
	targetConsoleWeight = 150 << 10
)

// consoleToken is the admin token of the console run's tokens file.
const consoleToken = "bench-console-admin-token-0123456789"

// consoleConfig holds the console scenario's flags.
type consoleConfig struct {
	sidecarFlags
	orgs       int
	revisions  int
	policySize int
	requests   int
	nackEvery  int
	cpuWindow  time.Duration
	tabs       int
	chromium   string
	profileDir string
	profileFor time.Duration
}

// consoleScenario measures the web console at /ui/ of a node holding
// 1,000 policies and 20,000 sidecars: each page's render time and weight
// over HTTP with a signed-in cookie, and the node's CPU with headless
// Chromium tabs sitting on the live Overview.
func consoleScenario() scenario {
	return scenario{
		name:    "console",
		summary: "the web console: render time and weight of every /ui/ page at 1k policies and 20k sidecars, CPU of live Overview tabs",
		setup: func(fs *flag.FlagSet) runner {
			c := &consoleConfig{}
			c.register(fs, sidecarFlagDefaults{
				streams: 10000, streamsUsage: "simulated gRPC discovery streams",
				ws: 10000, wsUsage: "simulated WebSocket feed connections",
				nodes: 1, nodesUsage: "cluster size; with more than 1 the console of a follower is measured",
				policies: 50, policiesUsage: "policies per org",
				streamsPerConn: 100, streamsPerConnUsage: "gRPC streams multiplexed on one client connection",
			})
			fs.IntVar(&c.orgs, "orgs", 20, "orgs the policies and sidecars are spread over")
			fs.IntVar(&c.revisions, "revisions", 3, "revisions of every policy (each one a PUT)")
			fs.IntVar(&c.policySize, "policy-size", 4096, "pad every policy's JSON body to this many bytes")
			fs.IntVar(&c.requests, "n", 200, "sequential GETs of each page")
			fs.IntVar(&c.nackEvery, "nack-every", 100, "every n-th gRPC sidecar NACKs every response (0: none)")
			fs.DurationVar(&c.cpuWindow, "cpu-window", 30*time.Second, "length of each CPU window (no browser, then -tabs tabs)")
			fs.IntVar(&c.tabs, "tabs", 5, "headless Chromium tabs on the live Overview (0: skip the browser part)")
			fs.StringVar(&c.chromium, "chromium", "", "Chromium executable; empty: $POLICYD_CHROMIUM, else chromium on PATH")
			fs.StringVar(&c.profileDir, "cpu-profile", "", "after the timed GETs, write CPU profiles of every node taken while bench GETs every\npage in turn for -cpu-profile-for, to this directory as <node>-<role>-console.pprof")
			fs.DurationVar(&c.profileFor, "cpu-profile-for", 10*time.Second, "length of the -cpu-profile window")
			return c
		},
	}
}

func (c *consoleConfig) validate() error {
	errs := c.sidecarFlags.validate(1)
	if c.orgs < 1 {
		errs = append(errs, fmt.Errorf("-orgs must be at least 1, got %d", c.orgs))
	}
	if c.revisions < 2 {
		errs = append(errs, fmt.Errorf("-revisions must be at least 2 (the diff page compares two), got %d", c.revisions))
	}
	if c.policySize < 0 || c.policySize > maxBodySize {
		errs = append(errs, fmt.Errorf("-policy-size must be between 0 and %d, got %d", maxBodySize, c.policySize))
	}
	if c.requests < 1 {
		errs = append(errs, fmt.Errorf("-n must be at least 1, got %d", c.requests))
	}
	if c.nackEvery < 0 {
		errs = append(errs, fmt.Errorf("-nack-every must not be negative, got %d", c.nackEvery))
	}
	if c.cpuWindow < time.Second {
		errs = append(errs, fmt.Errorf("-cpu-window must be at least 1s, got %v", c.cpuWindow))
	}
	if c.tabs < 0 {
		errs = append(errs, fmt.Errorf("-tabs must not be negative, got %d", c.tabs))
	}
	return errors.Join(errs...)
}

func (c *consoleConfig) run(ctx context.Context, env *runEnv) (err error) {
	cfg := *c
	if err := cfg.checkFileLimit(env.fileLimit); err != nil {
		return err
	}
	tokens := filepath.Join(env.workDir, "admin-tokens")
	if err := os.WriteFile(tokens, []byte("admin "+consoleToken+" bench\n"), 0o600); err != nil {
		return fmt.Errorf("write tokens file: %w", err)
	}
	env.logf("starting a %d-node cluster in %s", cfg.nodes, env.workDir)
	cl, err := startCluster(clusterSpec{binary: env.binary, dir: env.workDir, nodes: cfg.nodes, logLevel: env.nodeLogLevel,
		env: slices.Concat([]string{inactivityEnv}, env.nodeEnv), cpus: env.nodeCPUs, token: consoleToken,
		extra: "auth:\n  admin_tokens_file: " + strconv.Quote(tokens) + "\n"})
	if err != nil {
		return fmt.Errorf("start cluster: %w", err)
	}
	var fl *fleet
	defer func() {
		if fl != nil {
			env.logf("closing the sidecars")
			fl.close()
		}
		env.logf("stopping the cluster")
		if stopErr := cl.stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stop cluster: %w", stopErr))
		}
		if err != nil && ctx.Err() == nil {
			cl.dumpLogs(env.stderr)
		}
	}()
	leader, err := cl.waitReady(ctx, env.readyTimeout)
	if err != nil {
		return fmt.Errorf("wait for the cluster: %w", err)
	}
	measured := consoleNode(cl, leader)
	env.logf("cluster ready, leader %s; measuring the console of %s", leader, measured.id)

	client := newLoadClient(32, cfg.nodes, 60*time.Second)
	client.Transport = withBearer(client.Transport, consoleToken)
	defer client.CloseIdleConnections()
	addrs := cl.httpAddrs()
	start := time.Now()
	for rev := range cfg.revisions {
		if err := seedRevision(ctx, client, addrs, cfg.orgs, cfg.policies, cfg.policySize, rev); err != nil {
			return fmt.Errorf("seed policies: %w", err)
		}
	}
	env.logf("wrote %d policies × %d revisions of %d B in %v", cfg.orgs*cfg.policies, cfg.revisions, cfg.policySize,
		time.Since(start).Round(time.Millisecond))
	if cfg.ws > 0 {
		if err := seedEmployees(ctx, client, addrs, cfg.ws, cfg.orgs); err != nil {
			return fmt.Errorf("seed employees: %w", err)
		}
	}
	initial := map[int]string{}
	for k := range cfg.orgs {
		if initial[k], err = orgVersion(ctx, client, addrs[0], orgName(k), true); err != nil {
			return err
		}
	}
	env.logf("opening %d gRPC streams (%d per connection) and %d WebSocket connections", cfg.streams, cfg.streamsPerConn, cfg.ws)
	openStart := time.Now()
	if fl, err = openFleet(ctx, fleetSpec{grpc: cfg.streams, ws: cfg.ws, grpcAddrs: cl.grpcAddrs(), httpAddrs: addrs,
		nodes: cfg.nodes, orgs: cfg.orgs, grpcScope: "employee", grpcHead: true, streamsPerConn: cfg.streamsPerConn,
		dialConcurrency: cfg.dialConcurrency, nackEvery: cfg.nackEvery}); err != nil {
		return fmt.Errorf("open sidecars: %w", err)
	}
	w := fl.watch(initial)
	complete, err := fl.wait(ctx, w, cfg.connectTimeout)
	if err != nil {
		return err
	}
	if !complete {
		return fmt.Errorf("after %v, %d of %d sidecars do not hold the initial version; first errors: %q",
			cfg.connectTimeout, countMissing(w), len(w.expected), fl.errors())
	}
	env.logf("every sidecar holds its org's set %v after opening started", time.Since(openStart).Round(time.Millisecond))

	api, err := nodeAPI(client, measured.httpAddr)
	if err != nil {
		return err
	}
	ro, err := startConsoleRollout(ctx, api, cfg.policySize)
	if err != nil {
		return err
	}
	detail := propPolicyName(0, 0)
	hist, err := api.History(ctx, "policies", detail, true)
	if err != nil {
		return fmt.Errorf("history of %s: %w", detail, err)
	}
	if len(hist.Revisions) < 2 {
		return fmt.Errorf("history of %s: %d revisions, want at least 2", detail, len(hist.Revisions))
	}
	revs := []uint64{hist.Revisions[0].Revision, hist.Revisions[len(hist.Revisions)-1].Revision}
	slices.Sort(revs)
	// Let the rollout's canary push and the registry settle.
	if err := sleepUntil(ctx, time.Now().Add(3*time.Second)); err != nil {
		return err
	}

	base := "http://" + measured.httpAddr
	page, err := newConsoleClient(ctx, base)
	if err != nil {
		return err
	}
	defer page.http.CloseIdleConnections()
	paths := []string{"/ui/", "/ui/sidecars", "/ui/sidecars?state=nacked", "/ui/sidecars?page=200", "/ui/policies",
		"/ui/policies/" + detail, fmt.Sprintf("/ui/policies/%s?from=%d&to=%d", detail, revs[0], revs[1]),
		"/ui/rollouts", "/ui/rollouts/" + ro, "/ui/drift", "/ui/reload", "/ui/sources", "/ui/events"}
	for _, p := range paths {
		f, err := page.measure(ctx, p, cfg.requests)
		if err != nil {
			return err
		}
		if err := env.emit(f); err != nil {
			return err
		}
	}
	if cfg.profileDir != "" {
		if err := profilePages(ctx, cl, leader, page, paths, cfg.profileDir, cfg.profileFor); err != nil {
			return err
		}
		env.logf("CPU profiles of %v of page GETs written to %s", cfg.profileFor, cfg.profileDir)
	}
	if err := cl.checkAlive(); err != nil {
		return err
	}
	return cfg.measureCPU(ctx, env, measured, base)
}

// profilePages profiles every node for d while GETting paths in turn.
func profilePages(ctx context.Context, cl *cluster, leader string, page *consoleClient, paths []string, dir string, d time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create profile dir: %w", err)
	}
	wait := profileNodes(ctx, cl, leader, dir, "console", 0, d)
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		if _, _, err := page.get(ctx, paths[i%len(paths)]); err != nil {
			return errors.Join(err, wait())
		}
	}
	return wait()
}

// consoleNode is the node whose console is measured: a follower when there
// is one, as an operator's load balancer may pick any node.
func consoleNode(cl *cluster, leader string) *node {
	for _, nd := range cl.nodes {
		if nd.id != leader {
			return nd
		}
	}
	return cl.nodes[0]
}

// seedRevision PUTs every policy once more: revision rev of each.
func seedRevision(ctx context.Context, client *http.Client, addrs []string, orgs, perOrg, size, rev int) error {
	var puts []restPut
	for k := range orgs {
		for p := range perOrg {
			name := propPolicyName(k, p)
			puts = append(puts, restPut{"/v1/policies/" + name, propPolicyBody(name, orgName(k), rev, size)})
		}
	}
	return putAll(ctx, client, addrs, puts, 16)
}

// consoleClient is a signed-in console visitor over plain HTTP.
type consoleClient struct {
	base   string
	http   *http.Client
	assets map[string]int // asset path → its size, fetched once
}

// newConsoleClient signs in at base with POST /ui/signin and keeps the
// session cookie in its jar.
func newConsoleClient(ctx context.Context, base string) (*consoleClient, error) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	cc := &consoleClient{base: base, assets: map[string]int{}, http: &http.Client{
		Jar: jar, Timeout: 30 * time.Second,
		// One connection, kept alive: the latency is the server's, not a dial's.
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, DisableCompression: true},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}
	form := url.Values{"token": {consoleToken}, "next": {"/ui/"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/ui/signin", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := cc.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST /ui/signin: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return nil, fmt.Errorf("POST /ui/signin: %s, want 303", resp.Status)
	}
	u, _ := url.Parse(base + "/ui/")
	if !slices.ContainsFunc(jar.Cookies(u), func(c *http.Cookie) bool { return c.Name == "policyd_console" }) {
		return nil, errors.New("POST /ui/signin set no policyd_console cookie")
	}
	return cc, nil
}

// get fetches path and reads the whole body; the duration is from sending
// the request to the body's last byte.
func (cc *consoleClient) get(ctx context.Context, path string) ([]byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cc.base+path, nil)
	if err != nil {
		return nil, 0, err
	}
	start := time.Now()
	resp, err := cc.http.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	d := time.Since(start)
	if err != nil {
		return nil, 0, fmt.Errorf("GET %s: read body: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("GET %s: %s: %.200s", path, resp.Status, body)
	}
	return body, d, nil
}

// measure GETs path n times in a row and weighs its last answer.
func (cc *consoleClient) measure(ctx context.Context, path string, n int) (*consolePageFigure, error) {
	samples := make([]time.Duration, 0, n)
	var body []byte
	for range n {
		b, d, err := cc.get(ctx, path)
		if err != nil {
			return nil, err
		}
		body = b
		samples = append(samples, d)
	}
	f := &consolePageFigure{Scenario: "console", Path: path, Requests: n, HTMLBytes: len(body)}
	for _, a := range assetRefs(body) {
		size, ok := cc.assets[a]
		if !ok {
			b, _, err := cc.get(ctx, a)
			if err != nil {
				return nil, err
			}
			size = len(b)
			cc.assets[a] = size
		}
		f.AssetBytes += size
		f.Assets = append(f.Assets, a)
	}
	f.WeightBytes = f.HTMLBytes + f.AssetBytes
	s := summarize(samples)
	f.P50Ms, f.P90Ms, f.P99Ms, f.MaxMs = ms(s.p50), ms(s.p90), ms(s.p99), ms(s.max)
	f.TargetP99Ms, f.TargetWeightBytes = ms(targetConsoleP99), targetConsoleWeight
	f.TargetMet = s.p99 <= targetConsoleP99 && f.WeightBytes <= targetConsoleWeight
	return f, nil
}

// assetRef matches a page's reference to one of the console's assets.
var assetRef = regexp.MustCompile(`(?:href|src)="(/ui/assets/[^"?#]+)`)

// assetRefs returns the console assets an HTML page references, each once,
// in order of first reference.
func assetRefs(html []byte) []string {
	var out []string
	for _, m := range assetRef.FindAllSubmatch(html, -1) {
		if a := string(m[1]); !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// consolePageFigure is one page's render time and weight.
type consolePageFigure struct {
	Scenario string  `json:"scenario"`
	Path     string  `json:"path"`
	Requests int     `json:"requests"`
	P50Ms    float64 `json:"p50_ms"`
	P90Ms    float64 `json:"p90_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	// Weight: the HTML plus every asset it references, uncompressed.
	HTMLBytes         int      `json:"html_bytes"`
	AssetBytes        int      `json:"asset_bytes"`
	Assets            []string `json:"assets"`
	WeightBytes       int      `json:"weight_bytes"`
	TargetP99Ms       float64  `json:"target_p99_ms"`
	TargetWeightBytes int      `json:"target_weight_bytes"`
	TargetMet         bool     `json:"target_met"`
}

func (f *consolePageFigure) columns() []string {
	return []string{"scenario", "page", "requests", "p50 ms", "p90 ms", "p99 ms", "max ms", "html KB", "weight KB", "met"}
}

func (f *consolePageFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	kb := func(b int) string { return strconv.FormatFloat(float64(b)/1024, 'f', 1, 64) }
	return []string{f.Scenario, f.Path, strconv.Itoa(f.Requests), num(f.P50Ms), num(f.P90Ms), num(f.P99Ms), num(f.MaxMs),
		kb(f.HTMLBytes), kb(f.WeightBytes), yesNo(f.TargetMet)}
}

func (f *consolePageFigure) targets() []targetResult {
	return []targetResult{{
		Target:   fmt.Sprintf("console %s: p99 ≤ %g ms, weight ≤ %d KB", f.Path, f.TargetP99Ms, f.TargetWeightBytes>>10),
		Measured: fmt.Sprintf("p99 %g ms, %.1f KB", f.P99Ms, float64(f.WeightBytes)/1024),
		Met:      f.TargetMet,
	}}
}

// measureCPU reads the node's CPU over a window with no browser, then over
// one with cfg.tabs Chromium tabs on the live Overview.
func (c *consoleConfig) measureCPU(ctx context.Context, env *runEnv, nd *node, base string) error {
	pid := strconv.Itoa(nd.cmd.Process.Pid)
	env.logf("node CPU over %v with no browser", c.cpuWindow)
	idle, err := cpuPercent(ctx, pid, c.cpuWindow)
	if err != nil {
		return err
	}
	f := &consoleCPUFigure{Scenario: "console", Node: nd.id, WindowS: c.cpuWindow.Seconds(), IdleCPUPct: round2(idle), CPUs: runtime.NumCPU()}
	path := c.chromiumPath()
	switch {
	case c.tabs == 0:
		f.Skipped = "-tabs 0"
	case path == "":
		f.Skipped = "no Chromium: set -chromium or $POLICYD_CHROMIUM, or install it (hack/chromium.sh)"
	}
	if f.Skipped != "" {
		env.logf("skipping the browser part: %s", f.Skipped)
		return env.emit(f)
	}
	env.logf("opening %d tabs of %s on %s/ui/", c.tabs, path, base)
	stop, err := openLiveTabs(ctx, path, base, c.tabs)
	if err != nil {
		return err
	}
	defer stop()
	env.logf("node CPU over %v with %d live tabs", c.cpuWindow, c.tabs)
	live, err := cpuPercent(ctx, pid, c.cpuWindow)
	if err != nil {
		return err
	}
	f.Tabs, f.LiveCPUPct, f.DeltaCPUPct = c.tabs, round2(live), round2(live-idle)
	return env.emit(f)
}

// chromiumPath is the browser to drive, or "" when there is none.
func (c *consoleConfig) chromiumPath() string {
	for _, p := range []string{c.chromium, os.Getenv("POLICYD_CHROMIUM")} {
		if p != "" {
			return p
		}
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// cpuPercent is process pid's CPU (utime+stime) over the next d, in % of
// one core.
func cpuPercent(ctx context.Context, pid string, d time.Duration) (float64, error) {
	before, err := procCPU(pid)
	if err != nil {
		return 0, fmt.Errorf("read CPU of %s: %w", pid, err)
	}
	start := time.Now()
	if err := sleepUntil(ctx, start.Add(d)); err != nil {
		return 0, err
	}
	after, err := procCPU(pid)
	if err != nil {
		return 0, fmt.Errorf("read CPU of %s: %w", pid, err)
	}
	return cpuShare(after-before, time.Since(start)), nil
}

// cpuShare is used CPU time over wall time, in % of one core.
func cpuShare(used, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return 100 * used.Seconds() / wall.Seconds()
}

// openLiveTabs starts one headless Chromium, signs in once (the tabs share
// its cookies) and opens n tabs on the Overview, waiting for each live
// view to connect. stop closes the browser.
func openLiveTabs(ctx context.Context, path, base string, n int) (stop func(), err error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	root, cancelRoot := chromedp.NewContext(alloc)
	stop = func() {
		_ = chromedp.Cancel(root)
		cancelRoot()
		cancelAlloc()
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	step := func(tab context.Context, what string, steps ...chromedp.Action[chromedp.Void]) error {
		tctx, cancel := context.WithTimeout(tab, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(tctx, steps...); err != nil {
			return fmt.Errorf("chromium: %s: %w", what, err)
		}
		return nil
	}
	// A context's first Do starts the browser or opens the tab, which end
	// when that context does: so no timeout on it.
	if err := chromedp.Do(root); err != nil {
		return stop, fmt.Errorf("chromium: start %s: %w", path, err)
	}
	if err := step(root, "sign in", chromedp.Navigate(base+"/ui/signin"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), consoleToken), chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.CSS("[data-live]"))); err != nil {
		return stop, err
	}
	tabs := []context.Context{root}
	for range n - 1 {
		tab, _ := chromedp.NewContext(root) // canceled with root
		if err := chromedp.Do(tab); err != nil {
			return stop, fmt.Errorf("chromium: open a tab: %w", err)
		}
		tabs = append(tabs, tab)
	}
	for i, tab := range tabs {
		if err := step(tab, fmt.Sprintf("tab %d: open /ui/", i+1), chromedp.Navigate(base+"/ui/"),
			chromedp.WaitVisible(chromedp.CSS("[data-live]"))); err != nil {
			return stop, err
		}
	}
	// Each live view says "Live." once its event stream is open, then
	// "Live, updated …".
	deadline := time.Now().Add(30 * time.Second)
	for i, tab := range tabs {
		for {
			s, err := chromedp.Run(tab, chromedp.Evaluate[string](
				`(e => e ? e.innerText.trim() : '')(document.getElementById('live-status'))`))
			if err != nil {
				return stop, fmt.Errorf("chromium: tab %d: live status: %w", i+1, err)
			}
			if strings.HasPrefix(s, "Live") {
				break
			}
			if time.Now().After(deadline) {
				return stop, fmt.Errorf("chromium: tab %d: the live view says %q, not Live, after 30s", i+1, s)
			}
			if err := sleepUntil(ctx, time.Now().Add(200*time.Millisecond)); err != nil {
				return stop, err
			}
		}
	}
	return stop, nil
}

// consoleCPUFigure is the node's CPU with and without live Overview tabs.
type consoleCPUFigure struct {
	Scenario    string  `json:"scenario"`
	Node        string  `json:"node"`
	WindowS     float64 `json:"window_s"`
	Tabs        int     `json:"tabs"`
	IdleCPUPct  float64 `json:"idle_cpu_pct"` // % of one core, no browser open
	LiveCPUPct  float64 `json:"live_cpu_pct"` // % of one core, Tabs tabs on /ui/
	DeltaCPUPct float64 `json:"delta_cpu_pct"`
	CPUs        int     `json:"cpus"`
	Skipped     string  `json:"skipped,omitempty"`
}

func (f *consoleCPUFigure) columns() []string {
	return []string{"scenario", "node", "window s", "tabs", "cpu % idle", "cpu % live", "difference"}
}

func (f *consoleCPUFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	if f.Skipped != "" {
		return []string{f.Scenario, f.Node, num(f.WindowS), "skipped", num(f.IdleCPUPct), "n/a", "n/a"}
	}
	return []string{f.Scenario, f.Node, num(f.WindowS), strconv.Itoa(f.Tabs), num(f.IdleCPUPct), num(f.LiveCPUPct), num(f.DeltaCPUPct)}
}
