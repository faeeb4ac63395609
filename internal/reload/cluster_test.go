package reload_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// cluster is a 3-node policyd cluster with the reload controller enabled on
// every node.
type cluster struct {
	t     *testing.T
	nodes []*node // nil when stopped
	cfgs  []config.Config
}

func newCluster(t *testing.T, ns string, debounce time.Duration) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := range 3 {
		cfg := nodeConfig(t, fmt.Sprintf("node%d", i+1), ns, debounce)
		cfg.Raft.Bootstrap = i == 0
		n := startNode(t, cfg)
		c.nodes = append(c.nodes, n)
		c.cfgs = append(c.cfgs, n.cfg)
		if i == 0 {
			c.leader()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_, err := c.nodes[0].Join(ctx, cfg.NodeID, n.RaftAddr())
		cancel()
		if err != nil {
			t.Fatalf("join %s: %v", cfg.NodeID, err)
		}
	}
	c.leader()
	return c
}

// leader waits for a leader that every running node agrees on, whose
// controller has synced, and returns its index.
func (c *cluster) leader() int {
	c.t.Helper()
	li := -1
	poll.Eventually(c.t, "a leader", func() error {
		li = -1
		for i, n := range c.nodes {
			if n != nil && n.IsLeader() {
				li = i
			}
		}
		if li < 0 {
			return fmt.Errorf("no leader")
		}
		return nil
	}, poll.Within(wait))

	waitSynced(c.t, c.nodes[li])
	return li
}

// restarts sums configmap_reload_restarts_total over the running nodes and
// names the nodes that restarted anything.
func (c *cluster) restarts() (total float64, by []string) {
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		if v := servertest.Metric(c.t, n.reg, "configmap_reload_restarts_total"); v > 0 {
			total += v
			by = append(by, n.ID())
		}
	}
	return total, by
}

// TestClusterFailover runs the controller on a 3-node policyd cluster: only
// the leader patches; a restart pending inside the debounce window when the
// leader stops is performed exactly once by the next leader; and a failover
// without any ConfigMap change patches nothing.
func TestClusterFailover(t *testing.T) {
	const debounce = 3 * time.Second
	ns := namespace(t)
	cm := createConfigMap(t, configMap(ns, "app", "test", map[string]string{"v": "1"}))
	// Reconciled Deployments: a start, or a failover, must leave them alone.
	createDeployment(t, deployment(ns, "web", scoped("test"), restartAnnotations(cm)))
	createDeployment(t, deployment(ns, "api", scoped("test"), restartAnnotations(cm)))
	c := newCluster(t, ns, debounce)
	li := c.leader()
	for i, n := range c.nodes {
		if want := i == li; (n.ReloadStatus().State == reload.StateRunning) != want {
			t.Errorf("%s: controller %+v, running should be %v", n.ID(), n.ReloadStatus(), want)
		}
	}

	t.Run("pending restart survives the leader", func(t *testing.T) {
		old := c.nodes[li]
		cm = updateConfigMap(t, ns, "app", setData(map[string]string{"v": "2"}))
		hash := reload.DataHash(cm)
		poll.Eventually(t, "the change to be queued", func() error {
			p, ok := pendingFor(old, t, "test", "app")
			if !ok || p.Hash != hash {
				return fmt.Errorf("queued %+v", p)
			}
			return nil
		}, poll.Within(wait))

		p, _ := pendingFor(old, t, "test", "app")
		// The queue is replicated: every follower holds the same entry,
		// and shows its own controller as not leading.
		for _, n := range c.nodes {
			if n == old {
				continue
			}
			poll.Eventually(t, n.ID()+" to hold the queued restart", func() error {
				v := n.view(t)
				if v.Controller.State != reload.StateNotLeader {
					return fmt.Errorf("controller %+v", v.Controller)
				}
				if q, ok := pendingFor(n, t, "test", "app"); !ok || q != p {
					return fmt.Errorf("queue %+v, want %+v", v.Queue, p)
				}
				return nil
			}, poll.Within(wait))

		}
		if !time.Now().Before(p.DueAt) {
			t.Skipf("the machine is too slow to stop the leader inside the %v window", debounce)
		}
		stopped := time.Now()
		old.stop(t)
		c.nodes[li] = nil
		li = c.leader()
		t.Logf("new leader %s resumed the controller %v after the old leader was stopped (synced after %v)",
			c.nodes[li].ID(), c.nodes[li].ReloadStatus().Since.Sub(stopped).Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
		if got := generations(t, ns, "web", "api"); got["web"] != 1 || got["api"] != 1 {
			t.Errorf("patched before the window ended: %v", got)
		}

		rs := waitRestarts(t, c.nodes[li], "test", "app", 1)
		if rs[0].Hash != hash || !rs[0].RestartedAt.After(p.DueAt) && !rs[0].RestartedAt.Equal(p.DueAt) {
			t.Errorf("restart %+v, want hash %s at or after %v", rs[0], hash, p.DueAt)
		}
		for _, name := range []string{"web", "api"} {
			d := getDeployment(t, ns, name)
			if d.Generation != 2 {
				t.Errorf("%s: generation %d, want 2 (exactly one patch)", name, d.Generation)
			}
			if err := patchedWith(d, cm); err != nil {
				t.Error(err)
			}
		}
		total, by := c.restarts()
		if total != 2 || !slices.Equal(by, []string{c.nodes[li].ID()}) {
			t.Errorf("restarts_total %v by %v, want 2 by the leader %s only", total, by, c.nodes[li].ID())
		}
	})

	t.Run("failover without change patches nothing", func(t *testing.T) {
		// Bring the stopped node back so that a quorum survives the next
		// stop.
		for i, n := range c.nodes {
			if n == nil {
				cfg := c.cfgs[i]
				cfg.Raft.Bootstrap = false
				c.nodes[i] = startNode(t, cfg)
			}
		}
		before := generations(t, ns, "web", "api")
		restartsBefore := len(appRestarts(c.nodes[li].view(t).Restarts))
		seen := watchDeployments(t, ns)

		old := c.nodes[li]
		old.stop(t)
		c.nodes[li] = nil
		li = c.leader()
		// Synced: the new leader listed, compared and reconciled; a storm
		// would be queued or done by now. The sentinel then proves the
		// watch is live and every earlier event handled.
		sentinel(t, c.nodes[li], ns, 0)
		v := c.nodes[li].view(t)
		for _, p := range v.Queue {
			if p.Scope != "canary" {
				t.Errorf("a failover queued a restart: %+v", p)
			}
		}
		if got := len(appRestarts(v.Restarts)); got != restartsBefore {
			t.Errorf("%d restarts of test/app after a failover, want %d", got, restartsBefore)
		}
		if got := generations(t, ns, "web", "api"); got["web"] != before["web"] || got["api"] != before["api"] {
			t.Errorf("a failover patched: generations %v, were %v", got, before)
		}
		if n := seen(); n != 0 {
			t.Errorf("%d Deployment modifications during the failover, want 0", n)
		}
	})
}

// watchDeployments watches the Deployments of ns from now on and returns
// a function that tells how many modifications it has seen.
func watchDeployments(t *testing.T, ns string) func() int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := admin.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatalf("watch deployments: %v", err)
	}
	done := make(chan struct{})
	var n atomic.Int64
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if _, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type == watch.Modified {
				n.Add(1)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
	return func() int { return int(n.Load()) }
}

func appRestarts(rs []store.ReloadRestart) []store.ReloadRestart {
	var out []store.ReloadRestart
	for _, r := range rs {
		if r.Scope == "test" && r.ConfigMap == "app" {
			out = append(out, r)
		}
	}
	return out
}

// TestReloadLatency measures, over 20 changes, the time from a ConfigMap
// update to the Deployment's patch as seen by a watcher, minus the
// debounce. It logs the figures (run with -v) and asserts only that every
// change was rolled out exactly once.
func TestReloadLatency(t *testing.T) {
	const (
		debounce = 500 * time.Millisecond
		changes  = 20
	)
	ns := namespace(t)
	createConfigMap(t, configMap(ns, "app", "test", map[string]string{"v": "0"}))
	createDeployment(t, deployment(ns, "web", scoped("test"), nil))
	n := startSingle(t, nodeConfig(t, "n1", ns, debounce))

	ctx, cancel := context.WithCancel(context.Background())
	w, err := admin.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	type seen struct {
		hash string
		at   time.Time
	}
	patches := make(chan seen, 2*changes)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if d, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type == watch.Modified {
				patches <- seen{d.Spec.Template.Annotations[reload.HashAnnotation("policyd.io", "app")], time.Now()}
			}
		}
	}()
	defer func() {
		cancel()
		w.Stop()
		<-done
	}()

	var lat []time.Duration
	for i := 1; i <= changes; i++ {
		sent := time.Now()
		cm := updateConfigMap(t, ns, "app", setData(map[string]string{"v": fmt.Sprint(i)}))
		select {
		case p := <-patches:
			if p.hash != reload.DataHash(cm) {
				t.Fatalf("change %d: patched with hash %q, want %q", i, p.hash, reload.DataHash(cm))
			}
			lat = append(lat, p.at.Sub(sent)-debounce)
		case <-time.After(wait):
			t.Fatalf("change %d: no patch within %v", i, wait)
		}
		waitRestarts(t, n, "test", "app", i)
	}
	if g := getDeployment(t, ns, "web").Generation; g != changes+1 {
		t.Errorf("web generation %d, want %d: one patch per change", g, changes+1)
	}
	select {
	case p := <-patches:
		t.Errorf("an extra patch: %+v", p)
	default:
	}
	slices.Sort(lat)
	t.Logf("ConfigMap update to Deployment patch, minus the %v debounce, over %d changes (single node, envtest): p50 %v, p99 %v, min %v, max %v",
		debounce, changes, lat[len(lat)/2].Round(100*time.Microsecond), lat[(len(lat)*99+99)/100-1].Round(100*time.Microsecond),
		lat[0].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond))
}
