package reload_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/server"
	"github.com/policyd/policyd/internal/server/adminapi"
	"github.com/policyd/policyd/internal/server/servertest"
)

// One kube-apiserver and etcd for the whole package, started in TestMain.
// Each test works in its own namespace.
var (
	testEnv *kubetest.Env
	admin   kubernetes.Interface
)

// controllerUser is the identity the controller runs as in most tests
// (impersonated by the envtest admin): it holds exactly the RBAC documented
// in the reload package, so the tests also prove that RBAC sufficient.
const controllerUser = "policyd-reload"

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipped under -short (make check): needs kube-apiserver and etcd")
		os.Exit(0)
	}
	var err error
	testEnv, err = kubetest.Start(kubetest.Options{APIServerFlags: map[string]string{
		// Without the watch cache, a ConfigMap watch from a compacted
		// resourceVersion is answered by etcd with 410 Gone, as in a cluster
		// whose watch cache window has passed; with it, the cache would
		// serve the old version from memory and TestWatchGoneRelists could
		// not reach the 410 path.
		"watch-cache-sizes": "configmaps#0",
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	admin = testEnv.Kube
	code := m.Run()
	if err := testEnv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		// After the API server is gone, so are client-go's connections.
		if err := goleak.Find(
			goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
			// hashicorp/raft never answers a future still queued in its
			// (batched) apply channel when it shuts down, so the node's
			// waiter for it stays blocked; a stopped leader can leave one.
			goleak.IgnoreAnyFunction("github.com/policyd/policyd/internal/server.(*Node).applyLocal.func1"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// namespace creates a fresh namespace holding the controller user's Role
// and RoleBinding.
func namespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	name := testEnv.Namespace(t, nil, nil)
	if _, err := admin.RbacV1().Roles(name).Create(ctx, controllerRole(true), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create role: %v", err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: controllerUser},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: controllerUser}},
	}
	if _, err := admin.RbacV1().RoleBindings(name).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create role binding: %v", err)
	}
	return name
}

// controllerRole is the RBAC docs/operations.md documents for the reload controller; withPatch false
// takes away patch on deployments.
func controllerRole(withPatch bool) *rbacv1.Role {
	verbs := []string{"get", "list", "patch"}
	if !withPatch {
		verbs = verbs[:2]
	}
	return &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: verbs},
		},
	}
}

// kubeconfig writes a kubeconfig for the envtest API server and returns its
// path.
func kubeconfig(t *testing.T, k kubetest.Kubeconfig) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testEnv.WriteKubeconfig(path, k); err != nil {
		t.Fatal(err)
	}
	return path
}

// nodeConfig is a policyd node on loopback with the reload controller
// watching ns as controllerUser, with short Raft timeouts.
func nodeConfig(t *testing.T, id, ns string, debounce time.Duration) config.Config {
	t.Helper()
	cfg := servertest.Config(filepath.Join(t.TempDir(), id), id)
	cfg.Raft.Bootstrap = true
	cfg.Reload.Enabled = true
	cfg.Reload.Namespace = ns
	cfg.Reload.Debounce = debounce
	cfg.Kubernetes.Kubeconfig = kubeconfig(t, kubetest.Kubeconfig{Impersonate: controllerUser})
	return cfg
}

// node is a running policyd node and its metrics registry.
type node struct {
	*server.Node
	cfg config.Config
	reg *prometheus.Registry
	hc  *http.Client

	closeOnce sync.Once
}

// startNode starts a node and closes it when the test ends.
func startNode(t *testing.T, cfg config.Config) *node {
	t.Helper()
	reg := prometheus.NewRegistry()
	n, err := server.New(cfg, servertest.Logger(t), reg)
	if err != nil {
		t.Fatalf("start node %s: %v", cfg.NodeID, err)
	}
	n.Start()
	nd := &node{Node: n, cfg: cfg, reg: reg, hc: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}}
	nd.cfg.Raft.Addr = n.RaftAddr() // a restart must come back on the same Raft address
	t.Cleanup(func() { nd.stop(t) })
	return nd
}

func (n *node) stop(t testing.TB) {
	n.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("close node %s: %v", n.ID(), err)
		}
		n.hc.CloseIdleConnections()
	})
}

// startSingle starts a one-node cluster and waits until its controller has
// synced.
func startSingle(t *testing.T, cfg config.Config) *node {
	t.Helper()
	n := startNode(t, cfg)
	waitSynced(t, n)
	return n
}

func waitSynced(t *testing.T, n *node) {
	t.Helper()
	poll.Eventually(t, n.ID()+"'s reload controller to sync", func() error {
		st := n.ReloadStatus()
		if st.State != reload.StateRunning || !st.Synced {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	}, poll.Within(30*time.Second))

}

// view is GET /v1/reload on n.
func (n *node) view(t testing.TB) adminapi.ReloadView {
	t.Helper()
	resp, err := n.hc.Get("http://" + n.HTTPAddr() + "/v1/reload")
	if err != nil {
		t.Fatalf("GET /v1/reload: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/reload: %d %s %v", resp.StatusCode, body, err)
	}
	var v adminapi.ReloadView
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("decode /v1/reload %s: %v", body, err)
	}
	return v
}

// Kubernetes objects of the tests: ConfigMaps and Deployments labelled
// app=helloworld (the default selector) and env=<scope>.

func configMap(ns, name, scope string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "helloworld", "env": scope}},
		Data:       data,
	}
}

func createConfigMap(t *testing.T, cm *corev1.ConfigMap) *corev1.ConfigMap {
	t.Helper()
	out, err := admin.CoreV1().ConfigMaps(cm.Namespace).Create(context.Background(), cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create configmap %s: %v", cm.Name, err)
	}
	return out
}

// updateConfigMap applies edit to the current ConfigMap and returns the
// stored result.
func updateConfigMap(t *testing.T, ns, name string, edit func(cm *corev1.ConfigMap)) *corev1.ConfigMap {
	t.Helper()
	ctx := context.Background()
	cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get configmap %s: %v", name, err)
	}
	edit(cm)
	out, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update configmap %s: %v", name, err)
	}
	return out
}

func setData(data map[string]string) func(*corev1.ConfigMap) {
	return func(cm *corev1.ConfigMap) { cm.Data = data }
}

// deployment is a Deployment with the given labels and pod-template
// annotations (nothing runs it: envtest has no controller manager).
func deployment(ns, name string, lbls, annotations map[string]string) *appsv1.Deployment {
	podLabels := map[string]string{"pod": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: annotations},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
			},
		},
	}
}

func scoped(scope string) map[string]string {
	return map[string]string{"app": "helloworld", "env": scope}
}

func createDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	if _, err := admin.AppsV1().Deployments(d.Namespace).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment %s: %v", d.Name, err)
	}
}

func getDeployment(t testing.TB, ns, name string) *appsv1.Deployment {
	t.Helper()
	d, err := admin.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get deployment %s: %v", name, err)
	}
	return d
}

// generations records the generation of each named Deployment: every
// pod-template patch bumps it by one, and nothing else changes it here.
func generations(t testing.TB, ns string, names ...string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, n := range names {
		out[n] = getDeployment(t, ns, n).Generation
	}
	return out
}

// restartAnnotations are the pod-template annotations a restart writes.
func restartAnnotations(cm *corev1.ConfigMap) map[string]string {
	return map[string]string{
		reload.RestartedAtAnnotation("policyd.io"):   "2020-01-01T00:00:00Z",
		reload.HashAnnotation("policyd.io", cm.Name): reload.DataHash(cm),
	}
}

// patchedWith fails unless d's pod template carries a restart for cm's
// current data.
func patchedWith(d *appsv1.Deployment, cm *corev1.ConfigMap) error {
	ann := d.Spec.Template.Annotations
	if got, want := ann[reload.HashAnnotation("policyd.io", cm.Name)], reload.DataHash(cm); got != want {
		return fmt.Errorf("deployment %s: hash annotation %q, want %q", d.Name, got, want)
	}
	if _, err := time.Parse(time.RFC3339, ann[reload.RestartedAtAnnotation("policyd.io")]); err != nil {
		return fmt.Errorf("deployment %s: restartedAt: %w", d.Name, err)
	}
	return nil
}

// proxy is a TCP proxy in front of the API server that a test can cut:
// open connections are closed and new ones refused until it is restored,
// as in a network partition between the controller and the API server.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *proxy) url() string { return "https://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}
