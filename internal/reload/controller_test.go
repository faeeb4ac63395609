package reload_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// wait is the deadline of every wait in these tests: generous, because a
// loaded two-core machine runs the API server, etcd and policyd at once.
const wait = 30 * time.Second

// pendingFor returns the queued restart of (scope, cm) in v, if any.
func pendingFor(n *node, t testing.TB, scope, cm string) (store.ReloadPending, bool) {
	for _, p := range n.view(t).Queue {
		if p.Scope == scope && p.ConfigMap == cm {
			return p, true
		}
	}
	return store.ReloadPending{}, false
}

func cachedHash(n *node, t testing.TB, scope, cm string) string {
	for _, h := range n.view(t).Cache {
		if h.Scope == scope && h.ConfigMap == cm {
			return h.Hash
		}
	}
	return ""
}

// waitRestarts waits until n has recorded want restarts of (scope, cm) and
// nothing of it is queued, and returns them, newest first.
func waitRestarts(t *testing.T, n *node, scope, cm string, want int) []store.ReloadRestart {
	t.Helper()
	var got []store.ReloadRestart
	poll.Eventually(t, fmt.Sprintf("%d restart(s) of %s/%s", want, scope, cm), func() error {
		v := n.view(t)
		got = got[:0]
		for _, r := range v.Restarts {
			if r.Scope == scope && r.ConfigMap == cm {
				got = append(got, r)
			}
		}
		for _, p := range v.Queue {
			if p.Scope == scope && p.ConfigMap == cm {
				return fmt.Errorf("still queued: %+v (restarts so far %d)", p, len(got))
			}
		}
		if len(got) != want {
			return fmt.Errorf("%d restarts", len(got))
		}
		return nil
	}, poll.Within(wait))

	return got
}

// sentinel changes a ConfigMap of scope "canary" and waits until the
// controller has recorded the new hash. Watch events arrive in order, so
// every earlier event has been handled by then: what they did not queue,
// they will never queue.
func sentinel(t *testing.T, n *node, ns string, i int) {
	t.Helper()
	name := "sentinel"
	data := map[string]string{"n": fmt.Sprint(i)}
	var cm *corev1.ConfigMap
	if i == 0 {
		cm = createConfigMap(t, configMap(ns, name, "canary", data))
	} else {
		cm = updateConfigMap(t, ns, name, setData(data))
	}
	want := reload.DataHash(cm)
	poll.Eventually(t, "the sentinel change to be handled", func() error {
		if got := cachedHash(n, t, "canary", name); got != want {
			return fmt.Errorf("cached %q, want %q", got, want)
		}
		return nil
	}, poll.Within(wait))

}

func TestRestartOnlyTheConfigMapsScope(t *testing.T) {
	ns := namespace(t)
	createConfigMap(t, configMap(ns, "app", "test", map[string]string{"greeting": "hello"}))
	createConfigMap(t, configMap(ns, "app-prod", "prod", map[string]string{"greeting": "hello"}))
	createDeployment(t, deployment(ns, "web-test", scoped("test"), nil))
	createDeployment(t, deployment(ns, "api-test", scoped("test"), nil))
	createDeployment(t, deployment(ns, "web-prod", scoped("prod"), nil))
	createDeployment(t, deployment(ns, "other-test", map[string]string{"app": "other", "env": "test"}, nil))
	all := []string{"web-test", "api-test", "web-prod", "other-test"}
	n := startSingle(t, nodeConfig(t, "n1", ns, 0))
	before := generations(t, ns, all...)

	cm := updateConfigMap(t, ns, "app", setData(map[string]string{"greeting": "bonjour"}))
	rs := waitRestarts(t, n, "test", "app", 1)

	after := generations(t, ns, all...)
	for _, name := range all {
		want := before[name]
		if strings.HasSuffix(name, "-test") && name != "other-test" {
			want++
			if err := patchedWith(getDeployment(t, ns, name), cm); err != nil {
				t.Error(err)
			}
		}
		if after[name] != want {
			t.Errorf("%s: generation %d, want %d", name, after[name], want)
		}
	}
	slices.Sort(rs[0].Patched)
	if d := cmp.Diff([]string{"api-test", "web-test"}, rs[0].Patched); d != "" {
		t.Errorf("patched (-want +got):\n%s", d)
	}
	if rs[0].Hash != reload.DataHash(cm) || rs[0].Reason != "change" {
		t.Errorf("restart = %+v", rs[0])
	}
	if got := servertest.Metric(t, n.reg, "configmap_reload_restarts_total", "env", "test"); got != 2 {
		t.Errorf("restarts_total{env=test} = %v, want 2", got)
	}
	// Every restart is an event of type reload, naming the controller as
	// its actor (the audit trail).
	page, err := n.Store().ListEvents(store.EventFilter{Type: store.EntityReload})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 1 || page.Events[0].EntityID != "test/app" {
		t.Errorf("reload events = %+v", page.Events)
	}
	for _, ev := range page.Events {
		if ev.Actor != command.ActorReload {
			t.Errorf("reload event %d: actor %q, want %q", ev.ID, ev.Actor, command.ActorReload)
		}
	}
	byActor, err := n.Store().ListEvents(store.EventFilter{Actor: command.ActorReload})
	if err != nil {
		t.Fatal(err)
	}
	if len(byActor.Events) != len(page.Events) {
		t.Errorf("events of actor %s: %d, want the %d reload events", command.ActorReload, len(byActor.Events), len(page.Events))
	}
}

func TestNoRestartWithoutDataChange(t *testing.T) {
	ns := namespace(t)
	data := map[string]string{"a": "1", "b": "2"}
	createConfigMap(t, configMap(ns, "app", "test", data))
	createDeployment(t, deployment(ns, "web", scoped("test"), nil))
	n := startSingle(t, nodeConfig(t, "n1", ns, 0))
	sentinel(t, n, ns, 0)
	before := generations(t, ns, "web")
	hash := cachedHash(n, t, "test", "app")
	if hash == "" {
		t.Fatal("the listed ConfigMap was not seeded into the cache")
	}

	edits := []struct {
		name string
		edit func(*corev1.ConfigMap)
	}{
		{"same data applied again", setData(map[string]string{"b": "2", "a": "1"})},
		{"label-only edit", func(cm *corev1.ConfigMap) { cm.Labels["team"] = "blue" }},
		{"annotation-only edit", func(cm *corev1.ConfigMap) { cm.Annotations = map[string]string{"note": "x"} }},
	}
	for i, e := range edits {
		t.Run(e.name, func(t *testing.T) {
			updateConfigMap(t, ns, "app", e.edit)
			sentinel(t, n, ns, i+1)
			if p, ok := pendingFor(n, t, "test", "app"); ok {
				t.Errorf("a restart was queued: %+v", p)
			}
			if got := cachedHash(n, t, "test", "app"); got != hash {
				t.Errorf("cached hash %q, want %q", got, hash)
			}
			if got := generations(t, ns, "web"); got["web"] != before["web"] {
				t.Errorf("web patched: generation %d, want %d", got["web"], before["web"])
			}
		})
	}
	if rs := appRestarts(n.view(t).Restarts); len(rs) != 0 {
		t.Errorf("restarts of test/app recorded: %+v", rs)
	}
}

func TestAddedDeletedRecreated(t *testing.T) {
	ns := namespace(t)
	createDeployment(t, deployment(ns, "web", scoped("test"), nil))
	n := startSingle(t, nodeConfig(t, "n1", ns, 0))
	ctx := context.Background()

	// ADDED with no baseline: seeds the cache only.
	cm := createConfigMap(t, configMap(ns, "late", "test", map[string]string{"v": "1"}))
	sentinel(t, n, ns, 0)
	if got := cachedHash(n, t, "test", "late"); got != reload.DataHash(cm) {
		t.Errorf("new ConfigMap not seeded: cached %q", got)
	}
	if p, ok := pendingFor(n, t, "test", "late"); ok {
		t.Errorf("a new ConfigMap queued a restart: %+v", p)
	}

	// DELETED: nothing.
	if err := admin.CoreV1().ConfigMaps(ns).Delete(ctx, "late", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sentinel(t, n, ns, 1)
	if p, ok := pendingFor(n, t, "test", "late"); ok {
		t.Errorf("a deletion queued a restart: %+v", p)
	}
	if g := getDeployment(t, ns, "web").Generation; g != 1 {
		t.Errorf("web generation %d after add and delete, want 1", g)
	}

	// Recreated with other data: the baseline survives the deletion, so
	// this ADDED is a change.
	cm = createConfigMap(t, configMap(ns, "late", "test", map[string]string{"v": "2"}))
	waitRestarts(t, n, "test", "late", 1)
	if err := patchedWith(getDeployment(t, ns, "web"), cm); err != nil {
		t.Error(err)
	}
	if g := getDeployment(t, ns, "web").Generation; g != 2 {
		t.Errorf("web generation %d, want 2 (one patch)", g)
	}
}

func TestDebounceCoalesces(t *testing.T) {
	const debounce = 2 * time.Second
	ns := namespace(t)
	createConfigMap(t, configMap(ns, "app", "test", map[string]string{"v": "0"}))
	createDeployment(t, deployment(ns, "web", scoped("test"), nil))
	n := startSingle(t, nodeConfig(t, "n1", ns, debounce))

	var cm *corev1.ConfigMap
	var last time.Time
	for i := 1; i <= 3; i++ {
		last = time.Now()
		cm = updateConfigMap(t, ns, "app", setData(map[string]string{"v": fmt.Sprint(i)}))
	}
	want := reload.DataHash(cm)
	poll.Eventually(t, "the third change to be queued", func() error {
		if got := cachedHash(n, t, "test", "app"); got != want {
			return fmt.Errorf("cached %q", got)
		}
		return nil
	}, poll.Within(wait))

	if p, ok := pendingFor(n, t, "test", "app"); ok {
		// Coalesced: one entry, for the last data, due a window after it.
		if p.Hash != want || p.DueAt.Before(last.Add(debounce)) {
			t.Errorf("queued %+v, want hash %s due after %v", p, want, last.Add(debounce))
		}
	}
	rs := waitRestarts(t, n, "test", "app", 1)
	if rs[0].Hash != want {
		t.Errorf("restarted with hash %s, want the last change's %s", rs[0].Hash, want)
	}
	if !rs[0].RestartedAt.After(last.Add(debounce)) {
		t.Errorf("restarted at %v, before the window after the last change ended (%v)", rs[0].RestartedAt, last.Add(debounce))
	}
	if g := getDeployment(t, ns, "web").Generation; g != 2 {
		t.Errorf("web generation %d, want 2: three changes, one patch", g)
	}
	if err := patchedWith(getDeployment(t, ns, "web"), cm); err != nil {
		t.Error(err)
	}
	if got := servertest.Metric(t, n.reg, "configmap_reload_debounced_total", "env", "test"); got != 3 {
		t.Errorf("debounced_total = %v, want 3", got)
	}
}

func TestStartupReconciliation(t *testing.T) {
	t.Run("change while the daemon is down", func(t *testing.T) {
		ns := namespace(t)
		cm := createConfigMap(t, configMap(ns, "app", "test", map[string]string{"v": "1"}))
		createDeployment(t, deployment(ns, "web", scoped("test"), restartAnnotations(cm)))
		cfg := nodeConfig(t, "n1", ns, time.Hour) // a missed change restarts at once, whatever the debounce
		n := startSingle(t, cfg)
		if v := n.view(t); len(v.Queue) != 0 || len(v.Restarts) != 0 {
			t.Fatalf("reconciled Deployments restarted at start: %+v", v)
		}
		n.stop(t)

		cm = updateConfigMap(t, ns, "app", setData(map[string]string{"v": "2"}))
		n = startSingle(t, n.cfg)
		rs := waitRestarts(t, n, "test", "app", 1)
		if rs[0].Hash != reload.DataHash(cm) {
			t.Errorf("restart = %+v, want hash %s", rs[0], reload.DataHash(cm))
		}
		if err := patchedWith(getDeployment(t, ns, "web"), cm); err != nil {
			t.Error(err)
		}
		if g := getDeployment(t, ns, "web").Generation; g != 2 {
			t.Errorf("web generation %d, want 2 (one restart)", g)
		}
	})

	tests := []struct {
		name string
		// annotations of the Deployment's pod template, given the
		// ConfigMap as it is when the daemon starts.
		annotations func(cm *corev1.ConfigMap) map[string]string
		restarts    int
		reason      string
	}{
		{"stale hash annotation", func(cm *corev1.ConfigMap) map[string]string {
			a := restartAnnotations(cm)
			a[reload.HashAnnotation("policyd.io", cm.Name)] = "0000"
			return a
		}, 1, "startup-drift"},
		{"legacy restart annotation only", func(*corev1.ConfigMap) map[string]string {
			return map[string]string{reload.RestartedAtAnnotation("policyd.io"): "2020-01-01T00:00:00Z"}
		}, 1, "legacy-repair"},
		{"neither annotation", func(*corev1.ConfigMap) map[string]string { return nil }, 0, ""},
		{"current hash", restartAnnotations, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			cm := createConfigMap(t, configMap(ns, "app", "test", map[string]string{"v": "1"}))
			createDeployment(t, deployment(ns, "web", scoped("test"), tc.annotations(cm)))
			n := startSingle(t, nodeConfig(t, "n1", ns, time.Hour))
			if tc.restarts == 0 {
				// Synced means reconciliation ran: anything it decided is
				// queued or done by now.
				if v := n.view(t); len(v.Queue) != 0 || len(v.Restarts) != 0 {
					t.Errorf("reconciliation restarted: queue %+v, restarts %+v", v.Queue, v.Restarts)
				}
				if g := getDeployment(t, ns, "web").Generation; g != 1 {
					t.Errorf("web generation %d, want 1", g)
				}
				return
			}
			rs := waitRestarts(t, n, "test", "app", tc.restarts)
			if rs[0].Reason != tc.reason {
				t.Errorf("reason %q, want %q", rs[0].Reason, tc.reason)
			}
			if err := patchedWith(getDeployment(t, ns, "web"), cm); err != nil {
				t.Error(err)
			}
			// One time only: the next start finds the hash recorded.
			n.stop(t)
			n = startSingle(t, n.cfg)
			if v := n.view(t); len(v.Queue) != 0 || len(v.Restarts) != tc.restarts {
				t.Errorf("after a second start: queue %+v, %d restarts, want %d", v.Queue, len(v.Restarts), tc.restarts)
			}
			if g := getDeployment(t, ns, "web").Generation; g != 2 {
				t.Errorf("web generation %d, want 2 (one restart)", g)
			}
		})
	}
}

// TestWatchGoneRelists cuts the controller off the API server, changes a
// ConfigMap and compacts etcd past the controller's resourceVersion, then
// lets it reconnect: its watch is refused with 410 Gone, it relists, and
// the change it never saw as an event still restarts.
func TestWatchGoneRelists(t *testing.T) {
	ns := namespace(t)
	createConfigMap(t, configMap(ns, "app", "test", map[string]string{"v": "1"}))
	createDeployment(t, deployment(ns, "web", scoped("test"), nil))
	host, err := url.Parse(testEnv.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, host.Host)
	cfg := nodeConfig(t, "n1", ns, 0)
	cfg.Kubernetes.Kubeconfig = kubeconfig(t, kubetest.Kubeconfig{Server: p.url(), Impersonate: controllerUser})
	n := startSingle(t, cfg)
	sentinel(t, n, ns, 0)

	p.setCut(true)
	cm := updateConfigMap(t, ns, "app", setData(map[string]string{"v": "2"}))
	// A later write, so that the compaction revision is past the change
	// too, and a watch from before it cannot be served.
	createConfigMap(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unrelated"}})
	compactEtcd(t)
	p.setCut(false)

	rs := waitRestarts(t, n, "test", "app", 1)
	if rs[0].Reason != "relist" || rs[0].Hash != reload.DataHash(cm) {
		t.Errorf("restart = %+v, want a relist restart with hash %s", rs[0], reload.DataHash(cm))
	}
	if err := patchedWith(getDeployment(t, ns, "web"), cm); err != nil {
		t.Error(err)
	}
	if got := servertest.Metric(t, n.reg, "configmap_reload_watch_errors_total"); got < 1 {
		t.Errorf("watch_errors_total = %v, want the 410 counted", got)
	}
	if got := servertest.Metric(t, n.reg, "configmap_reload_watch_reconnects_total"); got < 1 {
		t.Errorf("watch_reconnects_total = %v, want at least 1", got)
	}
}

// compactEtcd compacts envtest's etcd at its current revision.
func compactEtcd(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testEnv.Envtest.ControlPlane.Etcd.URL.String()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "compact-probe")
	if err != nil {
		t.Fatalf("etcd get: %v", err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("etcd compact at %d: %v", resp.Header.Revision, err)
	}
}

func TestPatchFailureRetries(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()
	createConfigMap(t, configMap(ns, "app", "test", map[string]string{"v": "1"}))
	createDeployment(t, deployment(ns, "web", scoped("test"), nil))
	n := startSingle(t, nodeConfig(t, "n1", ns, 0))

	if _, err := admin.RbacV1().Roles(ns).Update(ctx, controllerRole(false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := updateConfigMap(t, ns, "app", setData(map[string]string{"v": "2"}))
	poll.Eventually(t, "two failed attempts", func() error {
		p, ok := pendingFor(n, t, "test", "app")
		if !ok || p.Attempts < 2 {
			return fmt.Errorf("queued %+v (%v)", p, ok)
		}
		return nil
	}, poll.Within(wait))

	v := n.view(t)
	if len(v.Errors) < 2 || !strings.Contains(v.Errors[0].Error, "forbidden") {
		t.Errorf("errors = %+v, want the forbidden patches", v.Errors)
	}
	// Backoff: the second retry waits longer than the first.
	if len(v.Errors) >= 2 {
		first, second := v.Errors[1], v.Errors[0]
		if d1, d2 := first.RetryAt.Sub(first.FailedAt), second.RetryAt.Sub(second.FailedAt); d1 != time.Second || d2 != 2*time.Second {
			t.Errorf("retry delays %v then %v, want 1s then 2s", d1, d2)
		}
	}
	if g := getDeployment(t, ns, "web").Generation; g != 1 {
		t.Fatalf("web generation %d while patch is forbidden, want 1", g)
	}
	if n.ReloadStatus().State != reload.StateRunning {
		t.Errorf("a forbidden patch stopped the controller: %+v", n.ReloadStatus())
	}

	if _, err := admin.RbacV1().Roles(ns).Update(ctx, controllerRole(true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rs := waitRestarts(t, n, "test", "app", 1)
	if rs[0].Attempts < 2 {
		t.Errorf("restart after %d failed attempts, want at least 2", rs[0].Attempts)
	}
	if err := patchedWith(getDeployment(t, ns, "web"), cm); err != nil {
		t.Error(err)
	}
	if g := getDeployment(t, ns, "web").Generation; g != 2 {
		t.Errorf("web generation %d, want 2: exactly one restart", g)
	}
	if got := servertest.Metric(t, n.reg, "configmap_reload_retry_total", "env", "test"); got < 2 {
		t.Errorf("retry_total = %v, want at least 2", got)
	}
	if got := servertest.Metric(t, n.reg, "configmap_reload_errors_total", "env", "test"); got < 2 {
		t.Errorf("errors_total = %v, want at least 2", got)
	}
}

func TestAuthFailureStopsController(t *testing.T) {
	tests := []struct {
		name   string
		opts   kubetest.Kubeconfig
		reason string
	}{
		{"403 for a user without RBAC", kubetest.Kubeconfig{Impersonate: "nobody"}, "forbidden"},
		{"401 for a rejected credential", kubetest.Kubeconfig{Token: "not-a-valid-token"}, "unauthorized"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			cfg := nodeConfig(t, "n1", ns, 0)
			cfg.Kubernetes.Kubeconfig = kubeconfig(t, tc.opts)
			n := startNode(t, cfg)
			poll.Eventually(t, "the controller to stop", func() error {
				if st := n.ReloadStatus(); st.State != reload.StateStopped {
					return fmt.Errorf("status %+v", st)
				}
				return nil
			}, poll.Within(wait))

			v := n.view(t)
			if !strings.HasPrefix(v.Controller.Reason, tc.reason) {
				t.Errorf("status reason %q, want %s", v.Controller.Reason, tc.reason)
			}
			if got := servertest.Metric(t, n.reg, "configmap_reload_stopped", "reason", tc.reason); got != 1 {
				t.Errorf("configmap_reload_stopped{reason=%s} = %v, want 1", tc.reason, got)
			}
			// The daemon keeps serving: ready, and writes go through.
			if err := n.Ready(t.Context()); err != nil {
				t.Errorf("node not ready: %v", err)
			}
			resp, err := n.hc.Get("http://" + n.HTTPAddr() + "/readyz")
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("/readyz: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			if !n.IsLeader() {
				t.Error("the node gave up leadership")
			}
		})
	}
}
