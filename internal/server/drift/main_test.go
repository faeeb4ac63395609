package drift_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server"
	"github.com/policyd/policyd/internal/server/servertest"
)

// The package's tests share one kube-apiserver (envtest) and one
// single-node policyd whose drift listener serves the webhook envtest
// registers, so the API server really calls it: env, a stack. Each test
// works in its own namespace; the namespace's <prefix>/mode annotation
// picks enforce or log. No kube-controller-manager runs against env: its
// tests play the deployment controller with an impersonated identity.
// TestRealControllers starts a stack of its own for the real ones.
var env *stack

const (
	// testLabel selects which policyd a namespace's requests go to.
	testLabel = "policyd-test"
	prefix    = "policyd.io"

	controllerUser = "system:serviceaccount:kube-system:deployment-controller"
	humanUser      = "alice@example.com"
)

var (
	deploymentGVK = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	namespaceGVK  = schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipped under -short (make check): needs kube-apiserver and etcd")
		return 0
	}
	dir, err := os.MkdirTemp("", "policyd-drift-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The default initialization order as an alternative to the built-in
	// rule for Deployments (which the test-played controller meets), so
	// TestInitializationRules can show both.
	s, err := startStack(dir, "single", logger, func(c *config.Config) {
		c.Drift.Initialization = []string{"apps/Deployment=Available+observedGeneration", "apps/Deployment=default"}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.stop(func(err error) { fmt.Fprintln(os.Stderr, err) })
	env = s
	return m.Run()
}

// stack is a kube-apiserver whose drift webhook, registered for the
// namespaces labelled testLabel=label, is served by a single-node policyd
// (node) that delivers its reports to recv.
type stack struct {
	*kubetest.Env
	label      string
	kubeconfig string
	certDir    string
	caData     []byte
	node       *server.Node
	recv       *receiver
}

// startStack starts a stack with its files under dir; configure, if set,
// changes the node's configuration. On error, what was started is stopped.
func startStack(dir, label string, logger *slog.Logger, configure func(*config.Config)) (s *stack, err error) {
	path := strings.TrimPrefix(admission.Path, "/")
	kenv, err := kubetest.Start(kubetest.Options{
		Webhooks: envtest.WebhookInstallOptions{
			LocalServingHost: "127.0.0.1",
			MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{{
				ObjectMeta: metav1.ObjectMeta{Name: "policyd-drift-" + label},
				Webhooks: []admissionregistrationv1.MutatingWebhook{webhook(label+".drift.policyd.io", label,
					admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Name: "policyd", Namespace: "default", Path: &path}})},
			}},
		},
	})
	if err != nil {
		return nil, err
	}
	wh := kenv.Envtest.WebhookInstallOptions
	s = &stack{Env: kenv, label: label, certDir: wh.LocalServingCertDir, caData: wh.LocalServingCAData, kubeconfig: filepath.Join(dir, label+".kubeconfig")}
	defer func() {
		if err != nil {
			s.stop(func(error) {})
		}
	}()
	if err := kenv.WriteKubeconfig(s.kubeconfig, kubetest.Kubeconfig{}); err != nil {
		return nil, err
	}
	s.recv = newReceiver()
	ncfg := s.nodeConfig(filepath.Join(dir, label), label)
	ncfg.Raft.Bootstrap = true
	ncfg.Drift.Addr = net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	ncfg.Drift.Callbacks = []string{s.recv.URL}
	if configure != nil {
		configure(&ncfg)
	}
	if s.node, err = server.New(ncfg, logger, nil); err != nil {
		return nil, fmt.Errorf("start policyd: %w", err)
	}
	s.node.Start()
	if err := poll.Until(context.Background(), 30*time.Second, func() error {
		if !s.node.IsLeader() {
			return errors.New("not leader")
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("policyd did not become leader: %w", err)
	}
	return s, nil
}

// stop stops what startStack started, reporting errors to report.
func (s *stack) stop(report func(error)) {
	if s.node != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.node.Close(ctx); err != nil {
			report(fmt.Errorf("close policyd: %w", err))
		}
	}
	if s.recv != nil {
		s.recv.Close()
	}
	if err := s.Stop(); err != nil {
		report(err)
	}
}

// webhook is the drift webhook as deploy/ registers it: every apps/v1
// workload and its status, failurePolicy Fail, for the namespaces labelled
// testLabel=label.
func webhook(name, label string, cc admissionregistrationv1.WebhookClientConfig) admissionregistrationv1.MutatingWebhook {
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNoneOnDryRun
	timeout := int32(10)
	return admissionregistrationv1.MutatingWebhook{
		Name:         name,
		ClientConfig: cc,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{"apps"}, APIVersions: []string{"v1"},
				Resources: []string{"deployments", "deployments/status", "replicasets", "replicasets/status"},
			},
		}},
		FailurePolicy:           &fail,
		SideEffects:             &none,
		TimeoutSeconds:          &timeout,
		AdmissionReviewVersions: []string{"v1"},
		NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{testLabel: label}},
	}
}

// nodeConfig is a policyd node on loopback with short Raft timeouts and the
// drift webhook on envtest's serving certificate.
func (s *stack) nodeConfig(dataDir, id string) config.Config {
	cfg := servertest.Config(dataDir, id)
	cfg.Kubernetes.Kubeconfig = s.kubeconfig
	cfg.Drift.Addr = "127.0.0.1:0"
	cfg.Drift.TLS = config.TLS{CertFile: filepath.Join(s.certDir, "tls.crt"), KeyFile: filepath.Join(s.certDir, "tls.key")}
	cfg.Drift.Mode = admission.ModeLog
	return cfg
}

// actor is a client acting as one user, recording the API server's
// warnings (log mode's drift warning arrives as one).
type actor struct {
	user string
	kube kubernetes.Interface
	kubetest.Warnings
}

// newActor impersonates user; system:masters spares the test RBAC set-up,
// and the webhook identifies actors by user name only.
func (s *stack) newActor(t *testing.T, user string) *actor {
	t.Helper()
	a := &actor{user: user}
	rc := rest.CopyConfig(s.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:masters", "system:authenticated"}}
	rc.WarningHandler = &a.Warnings
	a.kube = kubernetes.NewForConfigOrDie(rc)
	return a
}

// newNamespace creates a namespace routed to the policyd labelled label
// (empty: no webhook), with the given drift mode ("" = drift.mode).
func (s *stack) newNamespace(t *testing.T, label, mode string) string {
	t.Helper()
	labels, annotations := map[string]string{}, map[string]string{}
	if label != "" {
		labels[testLabel] = label
	}
	if mode != "" {
		annotations[prefix+"/mode"] = mode
	}
	name := s.Namespace(t, labels, annotations)
	t.Cleanup(func() {
		_ = s.Kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if label == s.label {
		// The mode annotation is read from the webhook's namespace cache.
		poll.Eventually(t, "namespace in the webhook's cache", func() error {
			if s.node.DriftObjects().Cached(namespaceGVK, "", name) == nil {
				return errors.New("not cached")
			}
			return nil
		}, poll.Within(30*time.Second))

	}
	return name
}

// chain is a Deployment and its ReplicaSet, owned through a controller
// ownerReference, as the deployment controller makes them.
type chain struct {
	t    *testing.T
	ns   string
	node *server.Node
	ctrl *actor
	dep  *appsv1.Deployment
	rs   *appsv1.ReplicaSet
	// condition is the one condition the controller reports True
	// (Available, as the deployment controller does, unless a test says).
	condition appsv1.DeploymentConditionType
}

func int32p(v int32) *int32 { return &v }

// newChain creates the Deployment (as the admin) and the ReplicaSet (as the
// controller), then plays the controller until the Deployment is settled.
func newChain(t *testing.T, ns string, node *server.Node) *chain {
	t.Helper()
	return newChainReporting(t, ns, node, appsv1.DeploymentAvailable)
}

// newChainReporting is newChain with a controller that reports condition
// True instead of Available.
func newChainReporting(t *testing.T, ns string, node *server.Node, condition appsv1.DeploymentConditionType) *chain {
	t.Helper()
	c := &chain{t: t, ns: ns, node: node, ctrl: env.newActor(t, controllerUser), condition: condition}
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: int32p(1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate(labels),
		},
	}
	var err error
	if c.dep, err = env.Kube.AppsV1().Deployments(ns).Create(t.Context(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	c.rs = c.createRS("web-1", nil)
	c.settle()
	return c
}

func podTemplate(labels map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.com/app:1"}}},
	}
}

// createRS creates a ReplicaSet of the Deployment as the controller, with
// the given annotations (a controller copies the Deployment's).
func (c *chain) createRS(name string, annotations map[string]string) *appsv1.ReplicaSet {
	c.t.Helper()
	labels := map[string]string{"app": "web", "rs": name}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: c.ns, Annotations: annotations, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(c.dep, deploymentGVK)},
		},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: int32p(1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate(labels),
		},
	}
	out, err := c.ctrl.kube.AppsV1().ReplicaSets(c.ns).Create(c.t.Context(), rs, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create replicaset %s as the controller: %v", name, err)
	}
	return out
}

// deployment reads the Deployment.
func (c *chain) deployment() *appsv1.Deployment {
	c.t.Helper()
	d, err := env.Kube.AppsV1().Deployments(c.ns).Get(c.t.Context(), "web", metav1.GetOptions{})
	if err != nil {
		c.t.Fatalf("get deployment: %v", err)
	}
	return d
}

// settle plays the deployment controller until the Deployment is steady:
// its status observes its generation and says c.condition, the controller's
// hash and the initialized phase are recorded (the leader's patches bump a
// Deployment's generation, so this takes a few rounds), no follow-up task is
// pending, and the webhook's cache holds this state.
func (c *chain) settle() *appsv1.Deployment {
	c.t.Helper()
	var d *appsv1.Deployment
	hash := admission.UserHash(controllerUser)
	poll.Eventually(c.t, "the deployment to settle", func() error {
		var err error
		if d, err = env.Kube.AppsV1().Deployments(c.ns).Get(c.t.Context(), "web", metav1.GetOptions{}); err != nil {
			return err
		}
		if d.Status.ObservedGeneration != d.Generation || len(d.Status.Conditions) == 0 {
			d.Status.ObservedGeneration = d.Generation
			d.Status.Replicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas, d.Status.UpdatedReplicas = 1, 1, 1, 1
			now := metav1.Now()
			d.Status.Conditions = []appsv1.DeploymentCondition{{
				Type: c.condition, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable",
				LastUpdateTime: now, LastTransitionTime: now,
			}}
			if _, err := c.ctrl.kube.AppsV1().Deployments(c.ns).UpdateStatus(c.t.Context(), d, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update status: %w", err)
			}
			return errors.New("status updated; checking again")
		}
		if !strings.Contains(d.Annotations[prefix+"/controllers"], hash) {
			return fmt.Errorf("controllers annotation %q lacks %s", d.Annotations[prefix+"/controllers"], hash)
		}
		if got := d.Annotations[prefix+"/phase"]; got != admission.PhaseInitialized {
			return fmt.Errorf("phase annotation %q", got)
		}
		tasks, err := c.node.Store().DriftTasks()
		if err != nil {
			return err
		}
		for _, tk := range tasks {
			if tk.ReportID == "" {
				return fmt.Errorf("follow-up task %s pending", tk.Key)
			}
		}
		cached := c.node.DriftObjects().Cached(deploymentGVK, c.ns, "web")
		if cached == nil || cached.GetResourceVersion() != d.ResourceVersion {
			return errors.New("webhook cache behind")
		}
		return nil
	}, poll.Within(60*time.Second))

	c.dep = d
	return d
}

// annotateDeployment sets annotations on the Deployment (as the admin) and
// settles it again: the write bumps its generation.
func (c *chain) annotateDeployment(ann map[string]string) *appsv1.Deployment {
	c.t.Helper()
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := env.Kube.AppsV1().Deployments(c.ns).Patch(c.t.Context(), "web", "application/merge-patch+json", body, metav1.PatchOptions{}); err != nil {
		c.t.Fatalf("annotate deployment: %v", err)
	}
	return c.settle()
}

// scaleRS sets the ReplicaSet's replicas as a, returning the API error.
func (c *chain) scaleRS(a *actor, name string, replicas int32) (*appsv1.ReplicaSet, error) {
	c.t.Helper()
	body := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	return a.kube.AppsV1().ReplicaSets(c.ns).Patch(c.t.Context(), name, "application/merge-patch+json", []byte(body), metav1.PatchOptions{})
}

// changeDeploymentSpec is a human changing the Deployment's spec: its
// generation moves ahead of observedGeneration.
func (c *chain) changeDeploymentSpec(image string) {
	c.t.Helper()
	body := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"app","image":%q}]}}}}`, image)
	if _, err := env.Kube.AppsV1().Deployments(c.ns).Patch(c.t.Context(), "web", "application/strategic-merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
		c.t.Fatalf("change deployment spec: %v", err)
	}
	poll.Eventually(c.t, "the webhook cache to see the new generation", func() error {
		u := c.node.DriftObjects().Cached(deploymentGVK, c.ns, "web")
		if u == nil || u.GetGeneration() == c.dep.Generation {
			return errors.New("cache behind")
		}
		return nil
	}, poll.Within(30*time.Second))

}

// noApprovals fails while the Deployment still carries approvals.
func (c *chain) noApprovals() error {
	as, err := admission.ParseApprovals(c.deployment().Annotations[prefix+"/approvals"])
	if err != nil {
		return err
	}
	if len(as) != 0 {
		return fmt.Errorf("approvals still %+v", as)
	}
	return nil
}

func isForbidden(err error, contains string) error {
	if err == nil {
		return errors.New("allowed, want 403")
	}
	if !apierrors.IsForbidden(err) {
		return fmt.Errorf("error %w, want 403 Forbidden", err)
	}
	if !strings.Contains(err.Error(), contains) {
		return fmt.Errorf("error %w does not mention %q", err, contains)
	}
	return nil
}

// receiver is a drift callback endpoint. It answers fail503 requests with
// 503 before accepting, and records every report it accepted.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	fail     int // requests still to fail; -1: fail until told otherwise
	attempts map[string]int
	accepted []admission.DriftReport
}

func newReceiver() *receiver {
	r := &receiver{attempts: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var rep admission.DriftReport
	if err == nil {
		err = json.Unmarshal(body, &rep)
	}
	if err != nil || rep.Kind != "DriftReport" || req.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "not a DriftReport", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts[rep.Spec.ID]++
	if r.fail != 0 {
		if r.fail > 0 {
			r.fail--
		}
		http.Error(w, "not now", http.StatusServiceUnavailable)
		return
	}
	r.accepted = append(r.accepted, rep)
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) setFail(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = n
}

// reports returns the accepted reports about children in namespace ns.
func (r *receiver) reports(ns string) []admission.DriftReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []admission.DriftReport
	for _, rep := range r.accepted {
		if rep.Spec.Child.Namespace == ns {
			out = append(out, rep)
		}
	}
	return out
}

func (r *receiver) attemptsFor(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[id]
}
