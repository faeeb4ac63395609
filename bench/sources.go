package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/loopback"
)

// Targets of the sources scenario (docs/performance.md): a Git push and its webhook
// to every sidecar holding the change; a push found by polling alone
// within the interval and a second.
const (
	targetGitHookP99 = time.Second
	gitPollSlack     = time.Second
)

// sourcesConfig holds the sources scenario's flags.
type sourcesConfig struct {
	grpc, ws         int
	nodes            int
	rounds           int
	pollInterval     time.Duration
	timeout          time.Duration
	connectTimeout   time.Duration
	startConcurrency int
	kube             bool
	objects          int
	idle             time.Duration
	updates          updateCounter
}

// sourcesScenario measures the policy sources end to end on a 3-node
// cluster of policyd processes with SDK sidecars of one org: a Git push
// followed by its webhook, and a push that only the poll finds, each until
// every sidecar holds the change; with -kube also kubectl apply against a
// real kube-apiserver (sources_kube.go).
func sourcesScenario() scenario {
	return scenario{
		name:    "sources",
		summary: "policy sources: git push + webhook and poll-only to every SDK sidecar; with -kube, kubectl apply to every sidecar and to RolledOut",
		setup: func(fs *flag.FlagSet) runner {
			c := &sourcesConfig{}
			fs.IntVar(&c.grpc, "grpc", 500, "SDK sidecars on the discovery stream (gRPC)")
			fs.IntVar(&c.ws, "ws", 500, "SDK sidecars on the WebSocket feed")
			fs.IntVar(&c.nodes, "nodes", 3, "cluster size")
			fs.IntVar(&c.rounds, "rounds", 10, "changes measured per path")
			fs.DurationVar(&c.pollInterval, "poll-interval", 2*time.Second, "interval of the poll-only Git source")
			fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "how long one change may take to reach every sidecar")
			fs.DurationVar(&c.connectTimeout, "connect-timeout", 3*time.Minute, "how long every sidecar may take to connect")
			fs.IntVar(&c.startConcurrency, "dial-concurrency", defaultStartConcurrency, "sidecars starting at once")
			fs.BoolVar(&c.kube, "kube", true, "also measure the Kubernetes source (needs hack/kube-bins.sh's binaries)")
			fs.IntVar(&c.objects, "objects", 1000, "objects of the Kubernetes batch apply")
			fs.DurationVar(&c.idle, "idle", 30*time.Second, "how long the leader's CPU is read with every object unchanged")
			return c
		},
	}
}

func (c *sourcesConfig) validate() error {
	var errs []error
	if c.grpc < 0 || c.ws < 0 || c.grpc+c.ws == 0 {
		errs = append(errs, fmt.Errorf("-grpc and -ws must not be negative and not both 0"))
	}
	if c.nodes < 1 || c.rounds < 1 || c.objects < 1 {
		errs = append(errs, fmt.Errorf("-nodes, -rounds and -objects must be at least 1"))
	}
	if c.pollInterval < time.Second {
		errs = append(errs, fmt.Errorf("-poll-interval must be at least 1s (sources.git[].interval), got %v", c.pollInterval))
	}
	return errors.Join(errs...)
}

// sourcesFigure is one measured path.
type sourcesFigure struct {
	Scenario string  `json:"scenario"`
	Path     string  `json:"path"`
	Nodes    int     `json:"nodes"`
	Sidecars int     `json:"sidecars"`
	Rounds   int     `json:"rounds"`
	Samples  int     `json:"samples"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	TargetMs float64 `json:"target_p99_ms,omitempty"`
	Note     string  `json:"note,omitempty"`
}

func (f *sourcesFigure) columns() []string {
	return []string{"scenario", "path", "nodes", "sidecars", "rounds", "samples", "p50 ms", "p99 ms", "max ms", "target p99 ms"}
}

func (f *sourcesFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{f.Scenario, f.Path, strconv.Itoa(f.Nodes), strconv.Itoa(f.Sidecars), strconv.Itoa(f.Rounds),
		strconv.Itoa(f.Samples), num(f.P50Ms), num(f.P99Ms), num(f.MaxMs), num(f.TargetMs)}
}

func (f *sourcesFigure) targets() []targetResult {
	if f.TargetMs == 0 {
		return nil
	}
	return []targetResult{{Target: fmt.Sprintf("sources %s p99 <= %g ms", f.Path, f.TargetMs),
		Measured: fmt.Sprintf("%g ms", f.P99Ms), Met: f.P99Ms <= f.TargetMs}}
}

// gitRemote is a bare repository served by git daemon on loopback, with a
// work tree that pushes to it.
type gitRemote struct {
	url    string
	bare   string
	work   string
	env    []string
	daemon *exec.Cmd
}

// startGitRemote starts git daemon over a new bare repository under dir.
func startGitRemote(dir string) (*gitRemote, error) {
	ports, err := loopback.FreePorts(1)
	if err != nil {
		return nil, err
	}
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	cfg := "[user]\n\tname = bench\n\temail = bench@example.com\n[init]\n\tdefaultBranch = main\n"
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	g := &gitRemote{bare: filepath.Join(dir, "repos", "policies.git"), work: filepath.Join(dir, "work"),
		env: append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0")}
	for _, args := range [][]string{{"init", "-q", "--bare", g.bare}, {"init", "-q", g.work}, {"-C", g.work, "remote", "add", "origin", g.bare}} {
		if _, err := g.git(args...); err != nil {
			return nil, err
		}
	}
	g.daemon = exec.Command("git", "daemon", "--reuseaddr", "--export-all", "--base-path="+filepath.Join(dir, "repos"),
		"--listen=127.0.0.1", "--port="+strconv.Itoa(ports[0]), filepath.Join(dir, "repos"))
	g.daemon.Env = g.env
	if err := g.daemon.Start(); err != nil {
		return nil, fmt.Errorf("git daemon: %w", err)
	}
	g.url = "git://" + loopback.Addr(ports[0]) + "/policies.git"
	return g, nil
}

func (g *gitRemote) git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Env = g.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// push writes files into the work tree, commits and pushes them; it
// returns the commit.
func (g *gitRemote) push(files map[string]string, msg string) (string, error) {
	for name, content := range files {
		p := filepath.Join(g.work, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	for _, args := range [][]string{{"-C", g.work, "add", "-A"}, {"-C", g.work, "commit", "-q", "-m", msg}, {"-C", g.work, "push", "-q", "origin", "HEAD:refs/heads/main"}} {
		if _, err := g.git(args...); err != nil {
			return "", err
		}
	}
	return g.git("-C", g.work, "rev-parse", "HEAD")
}

func (g *gitRemote) stop() {
	if g.daemon != nil && g.daemon.Process != nil {
		_ = g.daemon.Process.Kill()
		_ = g.daemon.Wait()
	}
}

// gitSourceDoc is the scenario's policy in org as a Git document.
func gitSourceDoc(name, org, reason string) string {
	return fmt.Sprintf("name: %s\nkind: ToolPolicy\nscope: {org: %s}\nspec: {tool_name: Bash, action: deny, reason: %q}\n", name, org, reason)
}

const benchHookSecret = "bench-hook-secret"

func (c *sourcesConfig) run(ctx context.Context, env *runEnv) (err error) {
	remote, err := startGitRemote(filepath.Join(env.workDir, "git"))
	if err != nil {
		return err
	}
	defer remote.stop()
	org := orgName(0)
	if _, err := remote.push(map[string]string{
		"hooked/p.yaml": gitSourceDoc("bench.hooked", org, "r0"),
		"polled/p.yaml": gitSourceDoc("bench.polled", org, "r0"),
	}, "init"); err != nil {
		return err
	}
	secretFile := filepath.Join(env.workDir, "hook-secret")
	if err := os.WriteFile(secretFile, []byte(benchHookSecret), 0o600); err != nil {
		return err
	}
	extra := fmt.Sprintf(`sources:
  git:
  - {name: hooked, url: %q, ref: main, path: hooked, interval: 1h, webhook_secret_file: %q}
  - {name: polled, url: %q, ref: main, path: polled, interval: %s}
`, remote.url, secretFile, remote.url, c.pollInterval)
	var kube *benchKube
	if c.kube {
		if kube, err = startBenchKube(ctx, env); err != nil {
			return err
		}
		defer kube.stop()
		extra += "  kubernetes: {enabled: true}\n" + kube.config()
	}

	env.logf("starting a %d-node cluster with Git sources on %s", c.nodes, remote.url)
	cl, err := startCluster(clusterSpec{binary: env.binary, dir: env.workDir, nodes: c.nodes,
		logLevel: env.nodeLogLevel, env: env.nodeEnv, cpus: env.nodeCPUs, extra: extra})
	if err != nil {
		return fmt.Errorf("start cluster: %w", err)
	}
	defer func() {
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
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
	api, err := nodeAPIs(hc, cl.httpAddrs())
	if err != nil {
		return err
	}
	env.logf("cluster ready, leader %s; waiting for the first syncs", leader)
	if err := waitSynced(ctx, api[0], map[string]string{"git:hooked": "", "git:polled": ""}, c.timeout); err != nil {
		return err
	}

	if c.ws > 0 {
		// A WebSocket sidecar is an employee, which must exist.
		lc := newLoadClient(32, c.nodes, 30*time.Second)
		err := seedEmployees(ctx, lc, cl.httpAddrs(), c.ws, 1)
		lc.CloseIdleConnections()
		if err != nil {
			return fmt.Errorf("seed employees: %w", err)
		}
	}
	env.logf("opening %d gRPC and %d WebSocket SDK sidecars", c.grpc, c.ws)
	sf, err := openSDKFleet(ctx, cl, sdkFleetSpec{grpc: c.grpc, ws: c.ws, orgs: 1, grpcScope: "employee",
		startConcurrency: c.startConcurrency, onUpdate: c.updates.onUpdate})
	if err != nil {
		return err
	}
	defer sf.close()
	version, err := orgVersion(ctx, hc, cl.nodes[0].httpAddr, org, true)
	if err != nil {
		return err
	}
	if ok, err := sf.wait(ctx, sf.watch(map[int]string{0: version}), c.connectTimeout); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("the sidecars did not all connect and hold %s within %v", version, c.connectTimeout)
	}
	sidecars := c.grpc + c.ws

	measure := func(path, file, name, source string, hook bool, target time.Duration, note string) error {
		var lat []time.Duration
		for r := range c.rounds {
			commit, err := remote.push(map[string]string{file: gitSourceDoc(name, org, fmt.Sprintf("r%d", r+1))}, path)
			if err != nil {
				return err
			}
			start := sf.since()
			if hook {
				if err := sendHook(ctx, hc, cl.nodes[r%len(cl.nodes)].httpAddr, strings.TrimPrefix(source, "git:")); err != nil {
					return err
				}
			}
			if err := waitSynced(ctx, api[0], map[string]string{source: commit}, c.timeout); err != nil {
				return err
			}
			v, err := orgVersion(ctx, hc, cl.nodes[0].httpAddr, org, true)
			if err != nil {
				return err
			}
			w := sf.watch(map[int]string{0: v})
			if ok, err := sf.wait(ctx, w, c.timeout); err != nil {
				return err
			} else if !ok {
				return fmt.Errorf("%s round %d: not every sidecar holds %s within %v", path, r, v, c.timeout)
			}
			for _, idx := range w.expected {
				if at, ok := w.heldAt(idx); ok {
					lat = append(lat, at-start)
				}
			}
		}
		s := summarize(lat)
		f := &sourcesFigure{Scenario: "sources", Path: path, Nodes: c.nodes, Sidecars: sidecars, Rounds: c.rounds,
			Samples: s.count, P50Ms: ms(s.p50), P99Ms: ms(s.p99), MaxMs: ms(s.max), TargetMs: ms(target), Note: note}
		env.logf("%s: p50 %v, p99 %v over %d samples", path, s.p50, s.p99, s.count)
		return env.emit(f)
	}
	if err := measure("git push + webhook", "hooked/p.yaml", "bench.hooked", "git:hooked", true, targetGitHookP99,
		"from the push's return to each sidecar holding the change; the webhook goes to the nodes in turn"); err != nil {
		return err
	}
	if err := measure("git push, poll only", "polled/p.yaml", "bench.polled", "git:polled", false, c.pollInterval+gitPollSlack,
		fmt.Sprintf("interval %v; the target is the interval plus 1 s", c.pollInterval)); err != nil {
		return err
	}
	if kube != nil {
		if err := c.runKube(ctx, env, kube, cl, api, sf, hc); err != nil {
			return err
		}
	}
	return cl.checkAlive()
}

// sendHook posts a GitHub-signed push webhook for the Git source name.
func sendHook(ctx context.Context, hc *http.Client, addr, name string) error {
	body := []byte(`{"ref":"refs/heads/main"}`)
	mac := hmac.New(sha256.New, []byte(benchHookSecret))
	mac.Write(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/sources/"+name+"/hook", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("webhook to %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("webhook to %s: %s", addr, resp.Status)
	}
	return nil
}

// waitSynced waits until each source in want has a committed sync, of
// revision want[source] when that is not "".
func waitSynced(ctx context.Context, api *adminclient.Client, want map[string]string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		list, err := api.Sources(ctx)
		if err == nil {
			done := 0
			for _, s := range list.Sources {
				if rev, ok := want[s.Name]; ok && s.SyncIndex != 0 && (rev == "" || s.SyncedRevision == rev) {
					done++
				}
			}
			if done == len(want) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sources %v not synced within %v (last: %w)", want, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
