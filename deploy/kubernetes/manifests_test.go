package kubernetes_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
)

// restConfig is the one envtest API server of this package.
var restConfig *rest.Config

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipped under -short (make check): needs kube-apiserver and etcd")
		return 0
	}
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

// applier applies manifests to the API server the way `kubectl apply
// --server-side` does, with strict field validation, and fails on any
// warning (deprecated fields, Pod Security violations).
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	warn   *kubetest.Warnings
}

func newApplier(t *testing.T) (*applier, *rest.Config) {
	t.Helper()
	cfg := rest.CopyConfig(restConfig)
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
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), warn: warn}, cfg
}

func (a *applier) resource(t *testing.T, m manifest) dynamic.ResourceInterface {
	t.Helper()
	gvk := m.obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%v: no such API: %v", m, err)
	}
	if mapping.Scope.Name() != "namespace" {
		return a.dyn.Resource(mapping.Resource)
	}
	if m.obj.GetNamespace() == "" {
		t.Fatalf("%v: namespaced, but names no namespace", m)
	}
	return a.dyn.Resource(mapping.Resource).Namespace(m.obj.GetNamespace())
}

// apply applies every manifest in order. Server-side apply also succeeds
// when the test runs again on the same API server (-count).
func (a *applier) apply(ctx context.Context, t *testing.T, ms []manifest) {
	t.Helper()
	for _, m := range ms {
		body, err := m.obj.MarshalJSON()
		if err != nil {
			t.Fatalf("encode %v: %v", m, err)
		}
		force := true
		got, err := a.resource(t, m).Patch(ctx, m.obj.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			FieldValidation: metav1.FieldValidationStrict, FieldManager: "manifests-test", Force: &force,
		})
		if err != nil {
			t.Fatalf("apply %v: %v", m, err)
		}
		if w := a.warn.Take(); len(w) > 0 {
			t.Errorf("apply %v: the API server warned: %q", m, w)
		}
		if got.GetUID() == "" {
			t.Fatalf("apply %v: no uid in the answer", m)
		}
	}
}

// remove deletes the manifests' objects, so that a later run starts from
// the base alone.
func (a *applier) remove(ctx context.Context, t *testing.T, ms []manifest) {
	t.Helper()
	for _, m := range slices.Backward(ms) {
		if err := a.resource(t, m).Delete(ctx, m.obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %v: %v", m, err)
		}
	}
}

// installCRDs installs testdata's cert-manager CRDs and waits until the API
// server serves them.
func (a *applier) installCRDs(ctx context.Context, t *testing.T) {
	t.Helper()
	crds := readFile(t, "testdata/cert-manager-crds.yaml")
	a.apply(ctx, t, crds)
	crdRes := a.resource(t, crds[0])
	for _, crd := range crds {
		poll.Eventually(t, crd.obj.GetName()+" established", func() error {
			got, err := crdRes.Get(ctx, crd.obj.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if c, _ := c.(map[string]any); c["type"] == "Established" && c["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("conditions %v", conds)
		}, poll.Within(30*time.Second))

	}
	a.mapper.Reset()
}

func kinds(ms []manifest) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		out[m.obj.GetKind()]++
	}
	return out
}

func requireKinds(t *testing.T, what string, ms []manifest, want ...string) {
	t.Helper()
	have := kinds(ms)
	for _, k := range want {
		if have[k] == 0 {
			t.Errorf("no %s in %s", k, what)
		}
	}
}

// TestManifestsApply applies the base to a real API server with strict
// field validation (an unknown or misspelt field, a schema error or a Pod
// Security "restricted" violation fails) and asks the API server what the
// ServiceAccount may do; then it applies the components (cert-manager's
// objects against a minimal copy of its CRDs) and asks again: drift's
// cluster-wide rights exist only with the drift component.
func TestManifestsApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a, cfg := newApplier(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.installCRDs(ctx, t)

	base := readManifests(t, ".")
	requireKinds(t, "the base", base, "Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
		"Service", "NetworkPolicy", "StatefulSet", "PodDisruptionBudget")
	a.apply(ctx, t, base)
	t.Run("rbac without drift", func(t *testing.T) { checkAccess(ctx, t, cs, false) })

	var comps []manifest
	for _, dir := range componentDirs(t) {
		comps = append(comps, readManifests(t, dir)...)
	}
	requireKinds(t, "the components", comps, "Issuer", "Certificate", "ConfigMap", "ClusterRole",
		"ClusterRoleBinding", "Service", "NetworkPolicy", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
	t.Cleanup(func() {
		// Its own deadline: the test's may be spent.
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		a.remove(cctx, t, comps)
	})
	a.apply(ctx, t, comps)
	t.Run("rbac with drift", func(t *testing.T) { checkAccess(ctx, t, cs, true) })
}

// checkAccess asks the API server (SubjectAccessReview) what the policyd
// ServiceAccount may do, with and without the drift component. (With drift,
// its cluster-wide read and parent-patch rights cover Deployments
// everywhere, so the reload Role's namespace is not a boundary of its own.)
func checkAccess(ctx context.Context, t *testing.T, cs kubernetes.Interface, drift bool) {
	const user = "system:serviceaccount:policyd:policyd"
	tests := []struct {
		why                             string
		verb, group, resource, ns, name string
		want, withDrift                 bool
	}{
		{"reload: list configmaps", "list", "", "configmaps", "default", "", true, true},
		{"reload: watch configmaps", "watch", "", "configmaps", "default", "", true, true},
		{"reload: restart a deployment", "patch", "apps", "deployments", "default", "web", true, true},
		{"reload: no deleting", "delete", "apps", "deployments", "default", "web", false, false},
		{"reload: no writing configmaps", "update", "", "configmaps", "default", "cfg", false, false},
		{"reload: configmaps of its namespace only", "list", "", "configmaps", "team-a", "", false, false},
		{"drift: read a parent", "get", "apps", "replicasets", "team-a", "web-1", false, true},
		{"drift: informers on a parent kind", "watch", "apps", "deployments", "", "", false, true},
		{"drift: informers on jobs", "list", "batch", "jobs", "", "", false, true},
		{"drift: no informers on other kinds", "watch", "example.com", "widgets", "team-a", "", false, false},
		{"drift: namespaces for the mode annotation", "watch", "", "namespaces", "", "", false, true},
		{"drift: annotate a parent", "patch", "apps", "statefulsets", "team-a", "db", false, true},
		{"drift: annotate a job", "patch", "batch", "jobs", "team-a", "j", false, true},
		{"drift: no patching non-parents", "patch", "", "configmaps", "team-a", "cfg", false, false},
		{"source: informers on toolpolicies", "watch", "policyd.io", "toolpolicies", "", "", false, true},
		{"source: list validatingpolicies", "list", "policyd.io", "validatingpolicies", "", "", false, true},
		{"source: write a status", "update", "policyd.io", "toolpolicies/status", "", "acme.p", false, true},
		{"source: patch a status", "patch", "policyd.io", "validatingpolicies/status", "", "acme.p", false, true},
		{"source: no writing a spec", "update", "policyd.io", "toolpolicies", "", "acme.p", false, false},
		{"source: no deleting", "delete", "policyd.io", "validatingpolicies", "", "acme.p", false, false},
		{"no secrets anywhere", "list", "", "secrets", "", "", false, false},
		{"no secrets of a tenant", "get", "", "secrets", "team-a", "db-password", false, false},
		{"no secrets of its own namespace", "get", "", "secrets", "policyd", "policyd-cluster-secret", false, false},
		{"no creating pods", "create", "", "pods", "team-a", "", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.why, func(t *testing.T) {
			want := tc.want
			if drift {
				want = tc.withDrift
			}
			resource, sub, _ := strings.Cut(tc.resource, "/")
			r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   user,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:policyd", "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: tc.verb, Group: tc.group, Resource: resource, Subresource: sub, Namespace: tc.ns, Name: tc.name,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed != want {
				t.Fatalf("%s %s.%s in %q: allowed=%v, want %v (%s)", tc.verb, tc.resource, tc.group, tc.ns, r.Status.Allowed, want, r.Status.Reason)
			}
		})
	}
}

// TestRBACNamesWhatItGrants checks every Role and ClusterRole: no wildcard
// group, resource or verb, and never Secrets. (checkAccess asks the API
// server about examples; this covers every rule.)
func TestRBACNamesWhatItGrants(t *testing.T) {
	all := render(t, componentDirs(t)...)
	roles := 0
	for _, m := range all {
		if m.obj.GetKind() != "Role" && m.obj.GetKind() != "ClusterRole" {
			continue
		}
		roles++
		var r rbacv1.ClusterRole // a Role's fields are a subset
		convert(t, m, &r)
		for i, rule := range r.Rules {
			for _, v := range slices.Concat(rule.APIGroups, rule.Resources, rule.Verbs, rule.ResourceNames) {
				if strings.Contains(v, "*") {
					t.Errorf("%v: rule %d grants %q", m, i, v)
				}
			}
			if len(rule.NonResourceURLs) > 0 {
				t.Errorf("%v: rule %d grants non-resource URLs %v", m, i, rule.NonResourceURLs)
			}
			if slices.Contains(rule.APIGroups, "") && slices.Contains(rule.Resources, "secrets") {
				t.Errorf("%v: rule %d grants Secrets", m, i)
			}
		}
	}
	if roles < 4 {
		t.Fatalf("%d roles found, want the reload Role, drift's two ClusterRoles and the Kubernetes source's", roles)
	}
	// The base binds nothing cluster-wide: drift's rights come with its component.
	for _, m := range readManifests(t, ".") {
		if k := m.obj.GetKind(); k == "ClusterRole" || k == "ClusterRoleBinding" {
			t.Errorf("%v: the base holds cluster-wide RBAC; it belongs in a component", m)
		}
	}
}
