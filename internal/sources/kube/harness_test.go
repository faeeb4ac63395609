package kube

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/sources"
)

// One kube-apiserver and etcd for the package, with the CRDs from
// deploy/kubernetes/crds/ installed. The resources are cluster-scoped, so
// each test deletes what it made.
var (
	testEnv *kubetest.Env
	dyn     dynamic.Interface
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // the admission tests need no API server
	}
	os.Exit(run(m))
}

// run starts the API server with the CRDs and the shipped webhook
// configuration (components/policy-webhook), serves the webhook, and runs
// the tests.
func run(m *testing.M) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	deploy := filepath.Join("..", "..", "..", "deploy", "kubernetes")
	raw, err := os.ReadFile(filepath.Join(deploy, "components", "policy-webhook", "webhook.yaml"))
	if err != nil {
		return fail(err)
	}
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(raw, &vwc); err != nil {
		return fail(fmt.Errorf("webhook.yaml: %w", err))
	}
	testEnv, err = kubetest.Start(kubetest.Options{
		CRDs: []string{filepath.Join(deploy, "crds")},
		Webhooks: envtest.WebhookInstallOptions{
			LocalServingHost:   "127.0.0.1",
			ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{&vwc},
		},
	})
	if err != nil {
		return fail(err)
	}
	if dyn, err = dynamic.NewForConfig(testEnv.Config); err != nil {
		return fail(errors.Join(err, testEnv.Stop()))
	}
	wh := testEnv.Envtest.WebhookInstallOptions
	cert, err := tls.LoadX509KeyPair(filepath.Join(wh.LocalServingCertDir, "tls.crt"), filepath.Join(wh.LocalServingCertDir, "tls.key"))
	if err != nil {
		return fail(errors.Join(err, testEnv.Stop()))
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort)))
	if err != nil {
		return fail(errors.Join(err, testEnv.Stop()))
	}
	mux := http.NewServeMux()
	mux.Handle(AdmissionPath, NewAdmission(nil, nil))
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()

	code := m.Run()
	if err := srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "webhook server:", err)
		code = 1
	}
	if err := testEnv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// needAPIServer skips a test under -short.
func needAPIServer(t *testing.T) {
	t.Helper()
	if testEnv == nil {
		t.Skip("needs kube-apiserver and etcd (not under -short)")
	}
	t.Cleanup(func() { deleteAll(t) })
}

// deleteAll deletes every object of both kinds and waits until they are
// gone.
func deleteAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, k := range kinds {
		if err := dyn.Resource(k.gvr).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("delete %s: %v", k.gvr.Resource, err)
		}
	}
	poll.Eventually(t, "every object deleted", func() error {
		for _, k := range kinds {
			l, err := dyn.Resource(k.gvr).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if n := len(l.Items); n > 0 {
				return fmt.Errorf("%d %s left", n, k.gvr.Resource)
			}
		}
		return nil
	})
}

// fakeFleet answers Rollout from a table; a policy it does not know has no
// sidecars.
type fakeFleet struct {
	mu      sync.Mutex
	rollout map[string]sources.Sidecars
	staging map[string]string
	// next, when set, answers Rollout instead of the table.
	next  func(name string, calls int) sources.Sidecars
	calls map[string]int
	total atomic.Int64
}

func newFakeFleet() *fakeFleet {
	return &fakeFleet{rollout: map[string]sources.Sidecars{}, staging: map[string]string{}, calls: map[string]int{}}
}

func (f *fakeFleet) Reach(_ context.Context, name string) (sources.Sidecars, error) {
	f.total.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	if f.next != nil {
		return f.next(name, f.calls[name]), nil
	}
	return f.rollout[name], nil
}

func (f *fakeFleet) Staging(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.staging[name]
}

func (f *fakeFleet) set(name string, sc sources.Sidecars, stage string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rollout[name] = sc
	f.staging[name] = stage
}

// write is one status write the driver sent.
type write struct {
	at   time.Time
	name string
}

// writeLog records the driver's status writes at the HTTP level.
type writeLog struct {
	mu     sync.Mutex
	writes []write
}

func (l *writeLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/status") {
			parts := strings.Split(strings.TrimSuffix(r.URL.Path, "/status"), "/")
			l.mu.Lock()
			l.writes = append(l.writes, write{at: time.Now(), name: parts[len(parts)-1]})
			l.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (l *writeLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.writes)
}

func (l *writeLog) of(name string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Time
	for _, w := range l.writes {
		if w.name == name {
			out = append(out, w.at)
		}
	}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// running is a driver whose Watch runs for the rest of the test.
type running struct {
	*Driver
	fleet   *fakeFleet
	writes  *writeLog
	changed chan struct{}
}

func startDriver(t *testing.T, cfg Config) *running {
	t.Helper()
	fleet := newFakeFleet()
	wl := &writeLog{}
	rc := rest.CopyConfig(testEnv.Config)
	rc.WrapTransport = wl.wrap
	d, err := New(cfg, rc, fleet, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	r := &running{Driver: d, fleet: fleet, writes: wl, changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- d.Watch(ctx, func() {
			select {
			case r.changed <- struct{}{}:
			default:
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	return r
}

// testWriter sends the driver's log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// observe waits for a complete observation that check accepts.
func (r *running) observe(t *testing.T, what string, check func(*sources.Observation) error) *sources.Observation {
	t.Helper()
	var last *sources.Observation
	poll.Eventually(t, what, func() error {
		obs, err := r.Observe(context.Background())
		if err != nil {
			return err
		}
		if !obs.Complete {
			return errors.New("observation not complete")
		}
		last = obs
		return check(obs)
	})
	return last
}

// create creates a typed object and returns it as the API server has it.
func create(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	u := toUnstructured(t, obj)
	gvr, _ := resourceOf(u.GetKind())
	got, err := dyn.Resource(gvr).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return got
}

func toUnstructured(t testing.TB, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	switch obj.(type) {
	case *v1alpha1.ToolPolicy:
		u.SetKind("ToolPolicy")
	case *v1alpha1.ValidatingPolicy:
		u.SetKind("ValidatingPolicy")
	}
	return u
}

// statusOf reads an object's status from the API server.
func statusOf(kind, name string) (*v1alpha1.PolicyStatus, error) {
	gvr, _ := resourceOf(kind)
	u, err := dyn.Resource(gvr).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var st v1alpha1.PolicyStatus
	if raw, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st); err != nil {
			return nil, err
		}
	}
	return &st, nil
}

// cond is a condition without its times, for comparing.
type cond struct{ Type, Status, Reason, Message string }

func conds(st *v1alpha1.PolicyStatus) []cond {
	out := make([]cond, 0, len(st.Conditions))
	for _, c := range st.Conditions {
		out = append(out, cond{c.Type, string(c.Status), c.Reason, c.Message})
	}
	return out
}

func condition(st *v1alpha1.PolicyStatus, typ string) *metav1.Condition {
	return meta.FindStatusCondition(st.Conditions, typ)
}

func toolPolicy(name string, spec v1alpha1.ToolPolicySpec) *v1alpha1.ToolPolicy {
	return &v1alpha1.ToolPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
}
