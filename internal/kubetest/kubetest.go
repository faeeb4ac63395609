// Package kubetest runs a real kube-apiserver and etcd for the Kubernetes
// tests of policyd's packages, through controller-runtime's envtest. It is
// for tests only: _test.go files import it, the policyd binary never does.
// Start takes the binaries from KUBEBUILDER_ASSETS (hack/kube-bins.sh) and
// never builds them; a package starts one Env in TestMain and gives each
// test its own namespace. See docs/design.md.
package kubetest

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// ErrNoAssets means KUBEBUILDER_ASSETS is unset, so there is no
// kube-apiserver or etcd binary to start.
var ErrNoAssets = errors.New(`KUBEBUILDER_ASSETS is not set; run the tests through hack/test.sh (make test), or first: export KUBEBUILDER_ASSETS="$(hack/kube-bins.sh)"`)

// Options is what differs between the packages' API servers.
type Options struct {
	// APIServerFlags are extra kube-apiserver flags, name (without "--") to
	// value.
	APIServerFlags map[string]string
	// Webhooks, if it names any webhook configuration, has envtest install
	// it and make a serving certificate for it (read back from
	// Env.Envtest.WebhookInstallOptions).
	Webhooks envtest.WebhookInstallOptions
	// CRDs are directories (or files) of CustomResourceDefinitions to
	// install and wait for before Start returns.
	CRDs []string
}

// Env is a running API server and etcd.
type Env struct {
	// Config authenticates as the cluster admin (system:masters).
	Config *rest.Config
	// Kube is a clientset for Config.
	Kube kubernetes.Interface
	// Envtest is the underlying environment, for what Env does not wrap:
	// etcd's URL, the webhook serving certificate.
	Envtest *envtest.Environment
}

// Start starts kube-apiserver and etcd. The caller must Stop the Env, also
// when its tests fail.
func Start(opts Options) (*Env, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, ErrNoAssets
	}
	// envtest logs through controller-runtime's logger, which nothing here
	// sets; unset, it prints a stack trace on first use.
	ctrllog.SetLogger(logr.Discard())
	te := &envtest.Environment{WebhookInstallOptions: opts.Webhooks, CRDDirectoryPaths: opts.CRDs, ErrorIfCRDPathMissing: len(opts.CRDs) > 0}
	args := te.ControlPlane.GetAPIServer().Configure()
	// The controller-manager, when a test starts one, runs no endpoints
	// controller, so nothing would reconcile the kubernetes service's
	// endpoints; don't let the API server try.
	args.Set("endpoint-reconciler-type", "none")
	for k, v := range opts.APIServerFlags {
		args.Set(k, v)
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("kubernetes client: %w", err), te.Stop())
	}
	return &Env{Config: cfg, Kube: kube, Envtest: te}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error {
	if err := e.Envtest.Stop(); err != nil {
		return fmt.Errorf("stop envtest: %w", err)
	}
	return nil
}

// Kubeconfig says what WriteKubeconfig writes. The zero value is the admin
// talking to the API server directly.
type Kubeconfig struct {
	// Server replaces the API server's URL, e.g. with a proxy in front of it.
	Server string
	// Impersonate is the user the admin's requests act as.
	Impersonate string
	// Token, if set, is the only credential instead of the admin's client
	// certificate; a made-up one is a credential the API server rejects
	// (401).
	Token string
}

// WriteKubeconfig writes a kubeconfig file for the API server to path, for
// a policyd node under test (which reads kubernetes.kubeconfig).
func (e *Env) WriteKubeconfig(path string, k Kubeconfig) error {
	return writeKubeconfig(path, e.Config, k)
}

// writeKubeconfig writes a kubeconfig for the client certificate of rc (a
// user envtest made), changed as k says.
func writeKubeconfig(path string, rc *rest.Config, k Kubeconfig) error {
	server := rc.Host
	if k.Server != "" {
		server = k.Server
	}
	auth := &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData, Impersonate: k.Impersonate}
	if k.Token != "" {
		auth = &clientcmdapi.AuthInfo{Token: k.Token, Impersonate: k.Impersonate}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["user"] = auth
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user"}
	kc.CurrentContext = "envtest"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// Namespace creates a namespace with a fresh name derived from the test's,
// with the given labels and annotations (either may be nil), and returns
// its name. The namespace is not deleted: without a namespace controller
// it would stay Terminating anyway, and names never repeat.
func (e *Env) Namespace(t testing.TB, labels, annotations map[string]string) string {
	t.Helper()
	// A DNS label: every character of the test's name that is not a
	// lower-case letter or a digit becomes "-".
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + fmt.Sprintf("-%d", time.Now().UnixNano()%100000)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: maps.Clone(labels), Annotations: maps.Clone(annotations)}}
	if _, err := e.Kube.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// Warnings records the warnings the API server returns (deprecated fields,
// Pod Security, admission webhooks' warnings); set it as a rest.Config's
// WarningHandler.
type Warnings struct {
	mu   sync.Mutex
	msgs []string
}

// HandleWarningHeader implements rest.WarningHandler.
func (w *Warnings) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

// Take returns and clears the warnings seen so far.
func (w *Warnings) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}
