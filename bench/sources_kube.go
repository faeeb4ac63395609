package main

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
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/kubetest"
)

// Targets of the Kubernetes source (docs/performance.md).
const (
	targetKubeRolledOutP99 = 2 * time.Second
	targetBatchVersions    = 3
	targetBatchFinal       = 10 * time.Second
)

// benchKube is a real kube-apiserver with the CRDs, and kubectl.
type benchKube struct {
	env        *kubetest.Env
	dyn        dynamic.Interface
	kubeconfig string
	kubectl    string
	dir        string
}

// startBenchKube starts kube-apiserver and etcd from hack/kube-bins.sh with
// the CRDs of deploy/kubernetes/crds.
func startBenchKube(ctx context.Context, env *runEnv) (*benchKube, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	env.logf("finding kube-apiserver, etcd and kubectl with hack/kube-bins.sh (builds them once)")
	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "kube-bins.sh")).Output()
	if err != nil {
		return nil, fmt.Errorf("hack/kube-bins.sh: %w", err)
	}
	assets := strings.TrimSpace(string(out))
	if err := os.Setenv("KUBEBUILDER_ASSETS", assets); err != nil {
		return nil, err
	}
	ke, err := kubetest.Start(kubetest.Options{CRDs: []string{filepath.Join(root, "deploy", "kubernetes", "crds")}})
	if err != nil {
		return nil, err
	}
	k := &benchKube{env: ke, kubectl: filepath.Join(assets, "kubectl"), dir: filepath.Join(env.workDir, "kube")}
	if err := os.MkdirAll(k.dir, 0o755); err != nil {
		return nil, errors.Join(err, ke.Stop())
	}
	k.kubeconfig = filepath.Join(k.dir, "kubeconfig")
	if err := ke.WriteKubeconfig(k.kubeconfig, kubetest.Kubeconfig{}); err != nil {
		return nil, errors.Join(err, ke.Stop())
	}
	if k.dyn, err = dynamic.NewForConfig(ke.Config); err != nil {
		return nil, errors.Join(err, ke.Stop())
	}
	return k, nil
}

func (k *benchKube) stop() { _ = k.env.Stop() }

// config is the nodes' kubernetes section.
func (k *benchKube) config() string {
	return fmt.Sprintf("kubernetes:\n  kubeconfig: %q\n", k.kubeconfig)
}

// apply runs kubectl apply -f with doc.
func (k *benchKube) apply(ctx context.Context, doc string) error {
	f := filepath.Join(k.dir, "apply.yaml")
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, k.kubectl, "--kubeconfig", k.kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", f)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %w: %s", err, lastLine(string(out)))
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// kubeToolPolicy is a ToolPolicy object in org.
func kubeToolPolicy(name, org, reason string) string {
	return fmt.Sprintf("apiVersion: policyd.io/v1alpha1\nkind: ToolPolicy\nmetadata: {name: %s}\nspec:\n  scope: {org: %s}\n  toolName: Bash\n  action: deny\n  reason: %q\n", name, org, reason)
}

// final reports whether obj's status says its generation is committed and
// rolled out.
func final(obj *unstructured.Unstructured) bool {
	st, _ := obj.Object["status"].(map[string]any)
	if st == nil {
		return false
	}
	if og, _ := st["observedGeneration"].(int64); og != obj.GetGeneration() {
		return false
	}
	conds, _ := st["conditions"].([]any)
	ok := 0
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if (m["type"] == "Accepted" || m["type"] == "RolledOut") && m["status"] == string(metav1.ConditionTrue) {
			ok++
		}
	}
	return ok == 2
}

// runKube measures the Kubernetes source on the running cluster: one
// changed object to every sidecar and to RolledOut=True; a batch of
// objects applied at once, the set versions each sidecar went through and
// the time until every status is final; the leader's CPU at rest.
func (c *sourcesConfig) runKube(ctx context.Context, env *runEnv, k *benchKube, cl *cluster, api []*adminclient.Client,
	sf *sdkFleet, hc *http.Client) error {
	org := orgName(0)
	sidecars := c.grpc + c.ws
	tp := k.dyn.Resource(v1alpha1.ToolPolicies)
	if err := k.apply(ctx, kubeToolPolicy("bench.kube-one", org, "r0")); err != nil {
		return err
	}
	if err := waitSynced(ctx, api[0], map[string]string{"kubernetes": ""}, c.timeout); err != nil {
		return err
	}
	var held, rolled, kubectl []time.Duration
	for r := range c.rounds {
		start := sf.since()
		if err := k.apply(ctx, kubeToolPolicy("bench.kube-one", org, fmt.Sprintf("r%d", r+1))); err != nil {
			return err
		}
		kubectl = append(kubectl, sf.since()-start)
		var v string
		deadline := time.Now().Add(c.timeout)
		for {
			p, err := api[0].Policy(ctx, "bench.kube-one")
			if err == nil && strings.Contains(string(p.Spec), fmt.Sprintf(`"r%d"`, r+1)) {
				if v, err = orgVersion(ctx, hc, cl.nodes[0].httpAddr, org, false); err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube round %d: the change did not reach %s", r, cl.nodes[0].id)
			}
			time.Sleep(2 * time.Millisecond)
		}
		w := sf.watch(map[int]string{0: v})
		if ok, err := sf.wait(ctx, w, c.timeout); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("kube round %d: not every sidecar holds %s within %v", r, v, c.timeout)
		}
		for _, idx := range w.expected {
			if at, ok := w.heldAt(idx); ok {
				held = append(held, at-start)
			}
		}
		for {
			obj, err := tp.Get(ctx, "bench.kube-one", metav1.GetOptions{})
			if err == nil && final(obj) {
				rolled = append(rolled, sf.since()-start)
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube round %d: RolledOut not True within %v", r, c.timeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	ks := summarize(kubectl)
	for _, fig := range []struct {
		path   string
		lat    []time.Duration
		target time.Duration
	}{{"kubectl apply → every sidecar", held, 0}, {"kubectl apply → RolledOut=True", rolled, targetKubeRolledOutP99}} {
		s := summarize(fig.lat)
		f := &sourcesFigure{Scenario: "sources", Path: fig.path, Nodes: c.nodes, Sidecars: sidecars, Rounds: c.rounds,
			Samples: s.count, P50Ms: ms(s.p50), P99Ms: ms(s.p99), MaxMs: ms(s.max), TargetMs: ms(fig.target),
			Note: fmt.Sprintf("from kubectl's start; kubectl itself took p50 %v", ks.p50.Round(time.Millisecond))}
		env.logf("%s: p50 %v, p99 %v", fig.path, s.p50, s.p99)
		if err := env.emit(f); err != nil {
			return err
		}
	}
	return c.kubeBatch(ctx, env, k, cl, sf)
}

// kubeBatch creates c.objects objects at once and counts, per sidecar, the
// set versions it received until every status was final.
func (c *sourcesConfig) kubeBatch(ctx context.Context, env *runEnv, k *benchKube, cl *cluster, sf *sdkFleet) error {
	org := orgName(0)
	base := &sourcesBatchFigure{}
	if err := c.idleCPU(ctx, env, cl, base); err != nil {
		return err
	}
	counts := c.updates.start(len(sf.cars))
	defer c.updates.stop()
	// At once: 16 creators in parallel, as a GitOps controller applies a
	// sync (kubectl creates them one by one, throttled by its client).
	tp := k.dyn.Resource(v1alpha1.ToolPolicies)
	start := time.Now()
	env.logf("creating %d objects at once, 16 at a time", c.objects)
	if err := createAll(ctx, tp, c.objects, org); err != nil {
		return err
	}
	created := time.Since(start)
	deadline := time.Now().Add(2 * time.Minute)
	var took time.Duration
	for {
		list, err := tp.List(ctx, metav1.ListOptions{})
		if err == nil {
			n := 0
			for i := range list.Items {
				if final(&list.Items[i]) {
					n++
				}
			}
			if n == len(list.Items) && n >= c.objects {
				took = time.Since(start)
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the batch's statuses were not final within 2m")
		}
		time.Sleep(20 * time.Millisecond)
	}
	most := int64(0)
	var per []time.Duration
	for i := range counts {
		n := counts[i].Load()
		most = max(most, n)
		per = append(per, time.Duration(n))
	}
	s := summarize(per)
	env.logf("batch: created in %v; every status final %v after the first; set versions per sidecar: median %d, max %d",
		created.Round(time.Millisecond), took.Round(time.Millisecond), s.p50, most)
	f := &sourcesBatchFigure{Scenario: "sources", Objects: c.objects, Nodes: c.nodes, Sidecars: len(sf.cars),
		VersionsMedian: int64(s.p50), VersionsMax: most, FinalMs: ms(took), CreateMs: ms(created),
		TargetVersions: targetBatchVersions, TargetFinalMs: ms(targetBatchFinal)}
	if err := c.idleCPU(ctx, env, cl, f); err != nil {
		return err
	}
	f.LeaderBaseCPUPct = base.LeaderIdleCPUPct
	return env.emit(f)
}

// idleCPU reads the leader's CPU while every object sits unchanged.
func (c *sourcesConfig) idleCPU(ctx context.Context, env *runEnv, cl *cluster, f *sourcesBatchFigure) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	leaderID, err := cl.waitReady(ctx, env.readyTimeout)
	if err != nil {
		return err
	}
	for _, nd := range cl.nodes {
		if nd.id != leaderID {
			continue
		}
		pid := strconv.Itoa(nd.cmd.Process.Pid)
		if err := sleepUntil(ctx, time.Now().Add(3*time.Second)); err != nil { // the last status writes settle
			return err
		}
		before, err := procCPU(pid)
		if err != nil {
			return err
		}
		if err := sleepUntil(ctx, time.Now().Add(c.idle)); err != nil {
			return err
		}
		after, err := procCPU(pid)
		if err != nil {
			return err
		}
		f.IdleS = c.idle.Seconds()
		f.LeaderIdleCPUPct = round2(100 * (after - before).Seconds() / c.idle.Seconds())
		env.logf("leader %s at rest: %.2f%% of a CPU", leaderID, f.LeaderIdleCPUPct)
	}
	hc.CloseIdleConnections()
	return nil
}

// sourcesBatchFigure is the batch apply and the leader at rest.
type sourcesBatchFigure struct {
	Scenario       string  `json:"scenario"`
	Objects        int     `json:"objects"`
	Nodes          int     `json:"nodes"`
	Sidecars       int     `json:"sidecars"`
	VersionsMedian int64   `json:"set_versions_per_sidecar_median"`
	VersionsMax    int64   `json:"set_versions_per_sidecar_max"`
	FinalMs        float64 `json:"every_status_final_ms"`
	// CreateMs is how long the API server took to create them all: the
	// sync coalesces what arrives within a second.
	CreateMs         float64 `json:"create_ms"`
	IdleS            float64 `json:"idle_s"`
	LeaderIdleCPUPct float64 `json:"leader_idle_cpu_pct"`
	// LeaderBaseCPUPct is the leader's CPU at rest before the batch: the
	// sidecars' keepalives, Raft heartbeats and the Git sources' polls.
	LeaderBaseCPUPct float64 `json:"leader_base_cpu_pct"`
	TargetVersions   int     `json:"target_versions_max"`
	TargetFinalMs    float64 `json:"target_final_ms"`
}

func (f *sourcesBatchFigure) columns() []string {
	return []string{"scenario", "objects", "nodes", "sidecars", "versions/sidecar median", "max", "create ms", "every status final ms", "leader CPU % at rest (before the batch)"}
}

func (f *sourcesBatchFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{f.Scenario, strconv.Itoa(f.Objects), strconv.Itoa(f.Nodes), strconv.Itoa(f.Sidecars),
		strconv.FormatInt(f.VersionsMedian, 10), strconv.FormatInt(f.VersionsMax, 10), num(f.CreateMs), num(f.FinalMs), num(f.LeaderIdleCPUPct) + " (" + num(f.LeaderBaseCPUPct) + ")"}
}

func (f *sourcesBatchFigure) targets() []targetResult {
	return []targetResult{
		{Target: fmt.Sprintf("sources: %d objects applied at once, at most %d set versions per sidecar", f.Objects, f.TargetVersions),
			Measured: fmt.Sprintf("max %d", f.VersionsMax), Met: f.VersionsMax <= int64(f.TargetVersions)},
		{Target: fmt.Sprintf("sources: every status of %d objects final within %g ms", f.Objects, f.TargetFinalMs),
			Measured: fmt.Sprintf("%g ms", f.FinalMs), Met: f.FinalMs <= f.TargetFinalMs},
	}
}

// updateCounter counts, while started, the sets each sidecar receives.
type updateCounter struct {
	counts atomic.Pointer[[]atomic.Int64]
}

func (u *updateCounter) start(n int) []atomic.Int64 {
	s := make([]atomic.Int64, n)
	u.counts.Store(&s)
	return s
}

func (u *updateCounter) stop() { u.counts.Store(nil) }

// onUpdate is every sidecar's sdkFleetSpec.onUpdate.
func (u *updateCounter) onUpdate(c *sidecar, _ client.Update, _ time.Duration) {
	if p := u.counts.Load(); p != nil {
		(*p)[c.idx].Add(1)
	}
}

// createAll creates n ToolPolicy objects in org, 16 at a time.
func createAll(ctx context.Context, tp dynamic.NamespaceableResourceInterface, n int, org string) error {
	names := make(chan int)
	errs := make(chan error, 16)
	for range 16 {
		go func() {
			var first error
			for i := range names {
				obj := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "policyd.io/v1alpha1", "kind": "ToolPolicy",
					"metadata": map[string]any{"name": fmt.Sprintf("bench.kube-%04d", i)},
					"spec":     map[string]any{"scope": map[string]any{"org": org}, "toolName": "Bash", "action": "deny", "reason": "batch"},
				}}
				if _, err := tp.Create(ctx, obj, metav1.CreateOptions{}); err != nil && first == nil {
					first = fmt.Errorf("create %s: %w", obj.GetName(), err)
				}
			}
			errs <- first
		}()
	}
	for i := range n {
		names <- i
	}
	close(names)
	var all []error
	for range 16 {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
