package kubernetes_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/policyd/policyd/admission"
	"github.com/policyd/policyd/config"
	"github.com/policyd/policyd/kubetest"
)

// restConfig is the one envtest API server of this package.
var restConfig *rest.Config

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	env, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	restConfig = env.Config
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}

// manifest is one YAML document and the file it came from.
type manifest struct {
	file string
	obj  *unstructured.Unstructured
}

func (m manifest) String() string {
	return fmt.Sprintf("%s: %s %s", m.file, m.obj.GetKind(), objectName(m.obj))
}

func objectName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// kustomizationResources is the resources list of kustomization.yaml, the
// order manifests are applied in.
func kustomizationResources(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := utilyaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k.Resources
}

// readManifests decodes every document of every manifest file, in
// kustomization order.
func readManifests(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	for _, file := range kustomizationResources(t) {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var obj map[string]any
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if obj == nil {
				continue // an empty document
			}
			out = append(out, manifest{file: file, obj: &unstructured.Unstructured{Object: obj}})
		}
	}
	return out
}

// TestManifestsApply creates every manifest on the real API server with
// strict field validation: an unknown or misspelt field, a schema error or a
// Pod Security "restricted" violation fails. Then it asks the API server
// what the ServiceAccount may do, to check that the bindings grant the
// reload controller and drift detection what they need, and no more.
func TestManifestsApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" })
	listed := slices.Sorted(slices.Values(kustomizationResources(t)))
	if !slices.Equal(files, listed) {
		t.Fatalf("kustomization.yaml lists %v; the directory holds %v", listed, files)
	}

	cfg := rest.CopyConfig(restConfig)
	// A manifest that draws a warning (deprecated fields, Pod Security
	// violations) fails.
	warn := &kubetest.Warnings{}
	cfg.WarningHandler = warn
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))

	manifests := readManifests(t)
	if len(manifests) < 10 {
		t.Fatalf("only %d documents found", len(manifests))
	}
	kinds := map[string]int{}
	for _, m := range manifests {
		gvk := m.obj.GroupVersionKind()
		kinds[gvk.Kind]++
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%v: no such API: %v", m, err)
		}
		var r dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			if m.obj.GetNamespace() == "" {
				t.Fatalf("%v: namespaced, but names no namespace", m)
			}
			r = dyn.Resource(mapping.Resource).Namespace(m.obj.GetNamespace())
		}
		// Server-side apply, as `kubectl apply --server-side` does: it also
		// succeeds when the test runs again on the same API server (-count).
		body, err := m.obj.MarshalJSON()
		if err != nil {
			t.Fatalf("encode %v: %v", m, err)
		}
		force := true
		created, err := r.Patch(ctx, m.obj.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			FieldValidation: metav1.FieldValidationStrict, FieldManager: "manifests-test", Force: &force,
		})
		if err != nil {
			t.Fatalf("apply %v: %v", m, err)
		}
		if w := warn.Take(); len(w) > 0 {
			t.Errorf("apply %v: the API server warned: %q", m, w)
		}
		if created.GetUID() == "" {
			t.Fatalf("apply %v: no uid in the answer", m)
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
		"ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget", "MutatingWebhookConfiguration"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the manifests", k)
		}
	}
	t.Run("rbac", func(t *testing.T) { checkAccess(ctx, t, cfg) })
}

// checkAccess asks the API server (SubjectAccessReview) what the policyd
// ServiceAccount may do. (Drift's cluster-wide read and parent-patch rights
// cover Deployments everywhere, so the reload Role's namespace is not a
// boundary of its own.)
func checkAccess(ctx context.Context, t *testing.T, cfg *rest.Config) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const user = "system:serviceaccount:policyd:policyd"
	tests := []struct {
		why                             string
		verb, group, resource, ns, name string
		want                            bool
	}{
		{"reload: list configmaps", "list", "", "configmaps", "default", "", true},
		{"reload: watch configmaps", "watch", "", "configmaps", "default", "", true},
		{"reload: restart a deployment", "patch", "apps", "deployments", "default", "web", true},
		{"reload: no deleting", "delete", "apps", "deployments", "default", "web", false},
		{"reload: no writing configmaps", "update", "", "configmaps", "default", "cfg", false},
		{"drift: read any parent", "get", "apps", "replicasets", "team-a", "web-1", true},
		{"drift: informers on any kind", "watch", "example.com", "widgets", "team-a", "", true},
		{"drift: namespaces for the mode annotation", "watch", "", "namespaces", "", "", true},
		{"drift: annotate a parent", "patch", "apps", "statefulsets", "team-a", "db", true},
		{"drift: annotate a job", "patch", "batch", "jobs", "team-a", "j", true},
		{"drift: no patching non-parents", "patch", "", "configmaps", "team-a", "cfg", false},
		{"no creating pods", "create", "", "pods", "team-a", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.why, func(t *testing.T) {
			r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   user,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:policyd", "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: tc.verb, Group: tc.group, Resource: tc.resource, Namespace: tc.ns, Name: tc.name,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed != tc.want {
				t.Fatalf("%s %s.%s in %q: allowed=%v, want %v (%s)", tc.verb, tc.resource, tc.group, tc.ns, r.Status.Allowed, tc.want, r.Status.Reason)
			}
		})
	}
}

// typed finds the one document of a kind (and name, if not empty) and
// converts it to its API type.
func typed[T any](t *testing.T, ms []manifest, kind, name string, into *T) {
	t.Helper()
	var found []manifest
	for _, m := range ms {
		if m.obj.GetKind() == kind && (name == "" || m.obj.GetName() == name) {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d documents of kind %s named %q, want 1", len(found), kind, name)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(found[0].obj.Object, into, true); err != nil {
		t.Fatalf("%v: %v", found[0], err)
	}
}

// podEnv is the environment a container of sts sees in pod podName, with
// $(VAR) references expanded as the kubelet expands them.
func podEnv(t *testing.T, c corev1.Container, podName, namespace string) []string {
	t.Helper()
	vals := map[string]string{}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = podName
			case "metadata.namespace":
				v = namespace
			default:
				t.Fatalf("env %s: field %s is not simulated by this test", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom != nil:
			t.Fatalf("env %s: only fieldRef sources are simulated by this test", e.Name)
		default:
			for k, kv := range vals {
				v = strings.ReplaceAll(v, "$("+k+")", kv)
			}
			if strings.Contains(v, "$(") {
				t.Fatalf("env %s=%q refers to a variable not defined before it", e.Name, e.Value)
			}
		}
		vals[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env
}

func port(t *testing.T, c corev1.Container, name string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return 0
}

func mountPath(t *testing.T, c corev1.Container, volume string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	t.Fatalf("container %s does not mount volume %q", c.Name, volume)
	return ""
}

func addrPort(t *testing.T, key, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", key, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s %q: %v", key, addr, err)
	}
	return host, n
}

// TestManifestsAgree checks that the pieces fit: the ConfigMap's config file
// loads and validates for every pod, with the environment the StatefulSet
// gives it, and its addresses, paths and peers match the pods, services and
// webhook.
func TestManifestsAgree(t *testing.T) {
	ms := readManifests(t)
	var (
		sts      appsv1.StatefulSet
		cm       corev1.ConfigMap
		headless corev1.Service
		client   corev1.Service
		pdb      policyv1.PodDisruptionBudget
		hook     admissionregistrationv1.MutatingWebhookConfiguration
	)
	typed(t, ms, "StatefulSet", "", &sts)
	typed(t, ms, "ConfigMap", "", &cm)
	typed(t, ms, "Service", sts.Spec.ServiceName, &headless)
	typed(t, ms, "PodDisruptionBudget", "", &pdb)
	typed(t, ms, "MutatingWebhookConfiguration", "", &hook)
	if len(hook.Webhooks) != 1 || hook.Webhooks[0].ClientConfig.Service == nil {
		t.Fatalf("want one webhook served by a service: %+v", hook.Webhooks)
	}
	wh := hook.Webhooks[0]
	typed(t, ms, "Service", wh.ClientConfig.Service.Name, &client)

	if got := *sts.Spec.Replicas; got != 3 {
		t.Errorf("replicas = %d, want 3", got)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy = %q: pods must start together to elect a first leader", sts.Spec.PodManagementPolicy)
	}
	if headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("service %s must be headless and publish not-ready pods (peers resolve before any is ready)", headless.Name)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", pdb.Spec.MaxUnavailable)
	}
	if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Ignore ||
		wh.TimeoutSeconds == nil || *wh.TimeoutSeconds != 5 ||
		wh.SideEffects == nil || *wh.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		t.Errorf("webhook: failurePolicy %v, timeoutSeconds %v, sideEffects %v; want Ignore, 5, NoneOnDryRun", wh.FailurePolicy, wh.TimeoutSeconds, wh.SideEffects)
	}
	if p := wh.ClientConfig.Service.Path; p == nil || *p != admission.Path {
		t.Errorf("webhook path %v, want %s", p, admission.Path)
	}

	c := sts.Spec.Template.Spec.Containers[0]
	if sc := sts.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("pods must run as non-root")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("readiness probe must be GET /readyz")
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Error("liveness probe must be GET /healthz")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("cpu and memory requests must be set")
	}

	// The config file goes where the container reads it (--config).
	cfgPath := ""
	for i, a := range c.Args {
		if a == "--config" && i+1 < len(c.Args) {
			cfgPath = c.Args[i+1]
		}
	}
	var cmKey string
	for _, m := range c.VolumeMounts {
		if m.MountPath == cfgPath {
			cmKey = m.SubPath
		}
	}
	file, ok := cm.Data[cmKey]
	if cfgPath == "" || !ok {
		t.Fatalf("--config %q is not a key of ConfigMap %s mounted at that path", cfgPath, cm.Name)
	}
	path := filepath.Join(t.TempDir(), "policyd.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}

	for i := range int(*sts.Spec.Replicas) {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		t.Run(pod, func(t *testing.T) {
			cfg, err := config.Load(path, podEnv(t, c, pod, sts.Namespace), nil)
			if err != nil {
				t.Fatalf("the config does not load in pod %s: %v", pod, err)
			}
			if cfg.NodeID != pod {
				t.Errorf("node_id = %q, want the pod name %q", cfg.NodeID, pod)
			}
			if want := mountPath(t, c, sts.Spec.VolumeClaimTemplates[0].Name); cfg.DataDir != want {
				t.Errorf("data_dir = %q, want the volume claim's mount %q", cfg.DataDir, want)
			}
			if len(cfg.Raft.Peers) != int(*sts.Spec.Replicas) {
				t.Fatalf("%d raft.peers for %d replicas", len(cfg.Raft.Peers), *sts.Spec.Replicas)
			}
			dns := pod + "." + headless.Name
			for _, adv := range []struct{ key, addr, port string }{
				{"raft.advertise", cfg.RaftAdvertise(), "raft"},
				{"grpc.advertise", cfg.GRPCAdvertise(), "grpc"},
				{"http.advertise", cfg.HTTPAdvertise(), "http"},
			} {
				if want := net.JoinHostPort(dns, strconv.Itoa(port(t, c, adv.port))); adv.addr != want {
					t.Errorf("%s = %q, want %q", adv.key, adv.addr, want)
				}
			}
			for j, p := range cfg.Raft.Peers {
				want := config.Peer{ID: fmt.Sprintf("%s-%d", sts.Name, j), Address: net.JoinHostPort(fmt.Sprintf("%s-%d.%s", sts.Name, j, headless.Name), strconv.Itoa(port(t, c, "raft")))}
				if p != want {
					t.Errorf("raft.peers[%d] = %+v, want %+v", j, p, want)
				}
			}
			for _, l := range []struct{ key, addr, port string }{
				{"http.addr", cfg.HTTP.Addr, "http"}, {"grpc.addr", cfg.GRPC.Addr, "grpc"},
				{"raft.addr", cfg.Raft.Addr, "raft"}, {"drift.addr", cfg.Drift.Addr, "drift"},
			} {
				if _, p := addrPort(t, l.key, l.addr); p != port(t, c, l.port) {
					t.Errorf("%s %q does not listen on the container's %s port %d", l.key, l.addr, l.port, port(t, c, l.port))
				}
			}
			if dir := mountPath(t, c, "drift-tls"); filepath.Dir(cfg.Drift.TLS.CertFile) != dir || filepath.Dir(cfg.Drift.TLS.KeyFile) != dir {
				t.Errorf("drift.tls files %q, %q are not in the mounted secret %s", cfg.Drift.TLS.CertFile, cfg.Drift.TLS.KeyFile, dir)
			}
			if dir := mountPath(t, c, "admin-tokens"); filepath.Dir(cfg.Auth.AdminTokensFile) != dir {
				t.Errorf("auth.admin_tokens_file %q is not in the mounted secret %s", cfg.Auth.AdminTokensFile, dir)
			}
		})
	}

	// The webhook's service port leads to the container's drift port.
	var target string
	for _, p := range client.Spec.Ports {
		if wh.ClientConfig.Service.Port != nil && p.Port == *wh.ClientConfig.Service.Port {
			target = p.TargetPort.String()
		}
	}
	if target != "drift" {
		t.Errorf("webhook port %v of service %s targets %q, want the container port drift", wh.ClientConfig.Service.Port, client.Name, target)
	}
}
