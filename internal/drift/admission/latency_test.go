package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// realisticPair is a Deployment at rest and the ReplicaSet it controls, of
// the size a real cluster stores (pod template, managedFields).
func realisticPair(t testing.TB) (deploy, rs *unstructured.Unstructured) {
	t.Helper()
	replicas := int32(3)
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web", "tier": "frontend"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "web", Image: "registry.example.com/web:1.2.3",
			Ports:          []corev1.ContainerPort{{ContainerPort: 8080, Name: "http"}},
			Env:            []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}, {Name: "C", Value: "3"}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz"}}},
		}}},
	}
	truth := true
	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "d-uid", Generation: 4, ResourceVersion: "100",
			Annotations:   map[string]string{pfx + "controllers": UserHash("system:serviceaccount:kube-system:deployment-controller"), pfx + "phase": PhaseInitialized},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: "Apply"}}},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Template: tmpl},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 3, ReadyReplicas: 3, AvailableReplicas: 3,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}},
	}
	r := &appsv1.ReplicaSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "web-abc", Namespace: "ns", UID: "rs-uid", Generation: 2, ResourceVersion: "101",
			Annotations:     map[string]string{pfx + "updaters": UserHash("system:serviceaccount:kube-system:deployment-controller")},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d-uid", Controller: &truth}}},
		Spec:   appsv1.ReplicaSetSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Template: tmpl},
		Status: appsv1.ReplicaSetStatus{ObservedGeneration: 2, Replicas: 3, ReadyReplicas: 3},
	}
	toU := func(o runtime.Object) *unstructured.Unstructured {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		return &unstructured.Unstructured{Object: m}
	}
	return toU(d), toU(r)
}

// latencyBodies are review bodies for a mix of requests against warm
// parents: drift (log mode, so the full path with patch and effects), a
// metadata-only update, and a new origin.
func latencyBodies(t testing.TB) [][]byte {
	_, rs := realisticPair(t)
	scaled := with(rs, func(u *unstructured.Unstructured) { sub(u, "spec")["replicas"] = int64(5) })
	labelled := with(rs, ann("example.com/x", "y"))
	var bodies [][]byte
	for i, c := range []struct {
		user string
		new  *unstructured.Unstructured
	}{
		{"system:serviceaccount:kube-system:deployment-controller", scaled},
		{"system:serviceaccount:kube-system:deployment-controller", labelled},
		{"alice", scaled},
	} {
		req := request("UPDATE", c.user, rs, c.new)
		req.UID = types.UID(fmt.Sprintf("uid-%d", i))
		bodies = append(bodies, reviewBody(t, req))
	}
	return bodies
}

// TestHandlerLatency measures the decision latency of the handler in
// process: 10,000 reviews through ServeHTTP with the parent already cached
// (as with warm informers). It logs p50/p99 and asserts only correctness;
// speed is reported, not asserted.
//
//	go test ./internal/drift/admission -run TestHandlerLatency -v -count=1
func TestHandlerLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("latency measurement")
	}
	deploy, _ := realisticPair(t)
	h := NewHandler(logMode(), nil, newFakeObjects(deploy), discardSink{}, nil)
	bodies := latencyBodies(t)
	const n = 10000
	lat := make([]time.Duration, 0, n)
	for i := range n {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(bodies[i%len(bodies)]))
		r.Header.Set("Content-Type", "application/json")
		start := time.Now()
		h.ServeHTTP(rec, r)
		lat = append(lat, time.Since(start))
		if rec.Code != 200 || !bytes.Contains(rec.Body.Bytes(), []byte(`"allowed":true`)) {
			t.Fatalf("review %d: %d %s", i, rec.Code, rec.Body)
		}
		if i%len(bodies) == 0 && !bytes.Contains(rec.Body.Bytes(), []byte(`drift-logged`)) {
			var out map[string]any
			_ = json.Unmarshal(rec.Body.Bytes(), &out)
			t.Fatalf("review %d is not the drift path: %v", i, out)
		}
	}
	slices.Sort(lat)
	t.Logf("handler decision latency over %d reviews (Deployment→ReplicaSet, drift/metadata-only/new-origin mix): p50 %v, p99 %v, max %v",
		n, lat[n/2], lat[n*99/100], lat[n-1])
}

// BenchmarkHandler is the same path as TestHandlerLatency, per review.
//
//	go test ./internal/drift/admission -run '^$' -bench BenchmarkHandler -benchmem
func BenchmarkHandler(b *testing.B) {
	deploy, _ := realisticPair(b)
	h := NewHandler(logMode(), nil, newFakeObjects(deploy), discardSink{}, nil)
	bodies := latencyBodies(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(bodies[i%len(bodies)]))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, r)
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
		i++
	}
}

// discardSink accepts effects and forgets them, so a long run does not
// measure a growing slice.
type discardSink struct{}

func (discardSink) Submit(context.Context, []Effect) error { return nil }
