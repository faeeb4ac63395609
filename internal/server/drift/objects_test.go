package drift_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/drift"
	"github.com/policyd/policyd/internal/server/servertest"
)

func newObjects(t *testing.T) *drift.Objects {
	t.Helper()
	o := drift.NewObjects(servertest.Logger(t), dynamic.NewForConfigOrDie(env.Config), discovery.NewDiscoveryClientForConfigOrDie(env.Config))
	t.Cleanup(o.Close)
	return o
}

func TestObjectsParent(t *testing.T) {
	ns := env.newNamespace(t, "single", admission.ModeLog)
	c := newChain(t, ns, env.node)
	o := newObjects(t)
	ref := *metav1.NewControllerRef(c.dep, deploymentGVK)

	// The first request for a kind starts its informer and falls back to a
	// GET; later ones are served from the cache.
	p, err := o.Parent(t.Context(), ns, ref)
	if err != nil || p == nil || p.GetUID() != c.dep.UID {
		t.Fatalf("Parent = %v, %v; want the deployment", p, err)
	}
	poll.Eventually(t, "the informer to hold the deployment", func() error {
		if o.Cached(deploymentGVK, ns, "web") == nil {
			return errors.New("not cached")
		}
		return nil
	}, poll.Within(30*time.Second))

	for _, tc := range []struct {
		name    string
		ref     metav1.OwnerReference
		wantNil bool
		wantErr bool
	}{
		{"cached", ref, false, false},
		{"missing: not found is nil, nil", func() metav1.OwnerReference { r := ref; r.Name, r.UID = "nope", ""; return r }(), true, false},
		{"namesake with another uid: the owner is gone", func() metav1.OwnerReference { r := ref; r.UID = types.UID("other"); return r }(), true, false},
		{"unknown kind: an error (500)", metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Widget", Name: "w"}, false, true},
		{"bad apiVersion: an error", metav1.OwnerReference{APIVersion: "a/b/c", Kind: "X", Name: "w"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := o.Parent(t.Context(), ns, tc.ref)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && (p == nil) != tc.wantNil {
				t.Fatalf("parent = %v, want nil %v", p, tc.wantNil)
			}
		})
	}
	nsObj, err := o.Namespace(t.Context(), ns)
	if err != nil || nsObj == nil || nsObj.GetAnnotations()[prefix+"/mode"] != admission.ModeLog {
		t.Errorf("Namespace = %v, %v", nsObj, err)
	}
	if missing, err := o.Namespace(t.Context(), "no-such-namespace"); err != nil || missing != nil {
		t.Errorf("Namespace(missing) = %v, %v; want nil, nil", missing, err)
	}
	o.Close()
	if _, err := o.Parent(context.Background(), ns, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "x"}); !errors.Is(err, drift.ErrClosed) {
		t.Errorf("Parent after Close: %v, want ErrClosed", err)
	}
}

type discard struct{}

func (discard) Submit(context.Context, []admission.Effect) error { return nil }

// TestHandlerLatencyWarmInformers measures the webhook's decision in
// process, parent and namespace read from warm informers: p50 and p99 over
// 10,000 reviews of the decisions that read only the cache (a human's
// change, a new origin; the controller's metadata-only change), and over
// 1,000 of a controller's drift, which also reads the parent from the API
// server to confirm it. It logs the figures; it asserts only that every
// review was answered alike.
func TestHandlerLatencyWarmInformers(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	ns := env.newNamespace(t, "single", admission.ModeLog)
	newChain(t, ns, env.node)
	o := newObjects(t)
	h := admission.NewHandler(admission.Config{AnnotationPrefix: prefix, Mode: admission.ModeLog}, nil, o, discard{}, nil)
	rs, err := env.Kube.AppsV1().ReplicaSets(ns).Get(t.Context(), "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs.APIVersion, rs.Kind = "apps/v1", "ReplicaSet"
	scaled, labelled := rs.DeepCopy(), rs.DeepCopy()
	scaled.Spec.Replicas = int32p(5)
	labelled.Labels["touched"] = "yes"
	raw := func(v any) runtime.RawExtension {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	review := func(user string, changed *appsv1.ReplicaSet) []byte {
		b, err := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{
				UID:       "review",
				Kind:      metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "ReplicaSet"},
				Resource:  metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"},
				Name:      "web-1",
				Namespace: ns,
				Operation: admissionv1.Update,
				UserInfo:  authenticationv1.UserInfo{Username: user},
				Object:    raw(changed),
				OldObject: raw(rs),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	do := func(body []byte) *admissionv1.AdmissionResponse {
		req := httptest.NewRequest(http.MethodPost, admission.Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("review answer %d %q: %v", w.Code, w.Body.String(), err)
		}
		return out.Response
	}
	drift := review(controllerUser, scaled)
	// Warm: the first review starts the informer; wait until it serves.
	first := do(drift)
	poll.Eventually(t, "warm informers", func() error {
		if o.Cached(deploymentGVK, ns, "web") == nil {
			return errors.New("not cached")
		}
		return nil
	}, poll.Within(30*time.Second))

	if !first.Allowed || len(first.Warnings) == 0 {
		t.Fatalf("review = %+v, want a logged drift (allowed with a warning)", first)
	}
	measure := func(what string, n int, bodies [][]byte, want func(*admissionv1.AdmissionResponse) bool) {
		ds := make([]time.Duration, 0, n)
		for i := range n {
			start := time.Now()
			resp := do(bodies[i%len(bodies)])
			ds = append(ds, time.Since(start))
			if !want(resp) {
				t.Fatalf("%s: review %d = %+v", what, i, resp)
			}
		}
		slices.Sort(ds)
		t.Logf("in-process decision latency, warm informers, %d reviews (%s): p50 %v p99 %v max %v",
			n, what, ds[n/2], ds[n*99/100], ds[n-1])
	}
	quiet := func(r *admissionv1.AdmissionResponse) bool { return r.Allowed && len(r.Warnings) == 0 }
	measure("cache only: a human's change, the controller's metadata-only change", 10000,
		[][]byte{review(humanUser, scaled), review(controllerUser, labelled)}, quiet)
	measure("logged drift, confirmed on the API server", 1000, [][]byte{drift},
		func(r *admissionv1.AdmissionResponse) bool { return r.Allowed && len(r.Warnings) > 0 })
}
