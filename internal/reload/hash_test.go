package reload

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestDataHash(t *testing.T) {
	base := &corev1.ConfigMap{Data: map[string]string{"a": "1", "b": "2"}}
	// A fixed vector, computed independently of this code ("d", count,
	// then length-prefixed key and value pairs in key order; "b", count):
	// the hash is recorded in Deployments' annotations and in Raft, so a
	// changed algorithm would restart every Deployment once.
	if got, want := DataHash(base), "225941b11ae109ca7a726d9dc82b2cafbf0c294e19ec20625571e0bf2f585c99"; got != want {
		t.Errorf("DataHash = %s, want %s", got, want)
	}
	tests := []struct {
		name string
		cm   *corev1.ConfigMap
		same bool
	}{
		{"labels and annotations are not data", &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"x": "y"}, Annotations: map[string]string{"n": "m"}},
			Data:       map[string]string{"b": "2", "a": "1"},
		}, true},
		{"a changed value", &corev1.ConfigMap{Data: map[string]string{"a": "1", "b": "3"}}, false},
		{"an added key", &corev1.ConfigMap{Data: map[string]string{"a": "1", "b": "2", "c": ""}}, false},
		{"concatenation does not collide", &corev1.ConfigMap{Data: map[string]string{"a": "1b", "": "2"}}, false},
		{"binary data counts", &corev1.ConfigMap{Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"k": {0}}}, false},
		{"data and binaryData are distinct", &corev1.ConfigMap{BinaryData: map[string][]byte{"a": []byte("1"), "b": []byte("2")}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DataHash(tc.cm) == DataHash(base); got != tc.same {
				t.Errorf("same hash = %v, want %v", got, tc.same)
			}
		})
	}
}

func TestHashAnnotation(t *testing.T) {
	tests := []struct{ cm, want string }{
		{"app", "policyd.io/config-hash-app"},
		{strings.Repeat("a", 51), "policyd.io/config-hash-" + strings.Repeat("a", 51)},
	}
	for _, tc := range tests {
		if got := HashAnnotation("policyd.io", tc.cm); got != tc.want {
			t.Errorf("HashAnnotation(%q) = %q, want %q", tc.cm, got, tc.want)
		}
	}
	long1, long2 := strings.Repeat("a", 253), strings.Repeat("a", 252)+"b"
	k1, k2 := HashAnnotation("policyd.io", long1), HashAnnotation("policyd.io", long2)
	if k1 == k2 {
		t.Errorf("two long names share the key %q", k1)
	}
	for _, k := range []string{k1, k2, HashAnnotation("policyd.io", "app")} {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%q is not a valid annotation key: %v", k, errs)
		}
	}
}

func TestReconcileAction(t *testing.T) {
	const p = "policyd.io"
	hashKey, restartKey := HashAnnotation(p, "app"), RestartedAtAnnotation(p)
	tests := []struct {
		name string
		ann  map[string]string
		want startupAction
	}{
		{"hash matches", map[string]string{hashKey: "h", restartKey: "t"}, inSync},
		{"hash differs", map[string]string{hashKey: "old", restartKey: "t"}, drifted},
		{"hash differs without restart annotation", map[string]string{hashKey: "old"}, drifted},
		{"legacy restart annotation only", map[string]string{restartKey: "t"}, legacyRepair},
		{"another configmap's hash and a restart", map[string]string{HashAnnotation(p, "other"): "h", restartKey: "t"}, legacyRepair},
		{"neither", map[string]string{"unrelated": "x"}, baselineUnknown},
		{"no annotations", nil, baselineUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := reconcileAction(tc.ann, p, "app", "h"); got != tc.want {
				t.Errorf("reconcileAction = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWatchErrorAndFatal(t *testing.T) {
	gone := watchError(&metav1.Status{Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	if !isGone(gone) {
		t.Errorf("410 event %v is not gone", gone)
	}
	other := watchError(&metav1.Status{Code: http.StatusInternalServerError, Message: "boom"})
	if isGone(other) || isFatal(fatal(other)) {
		t.Errorf("500 event %v classified as gone or fatal", other)
	}
	if !apierrors.IsInternalError(errors.Unwrap(other)) {
		t.Errorf("500 event lost its status: %v", other)
	}
	tests := []struct {
		err    error
		reason string
	}{
		{apierrors.NewUnauthorized("no"), reasonUnauthorized},
		{apierrors.NewForbidden(corev1.Resource("configmaps"), "", errors.New("rbac")), reasonForbidden},
		{apierrors.NewServiceUnavailable("later"), ""},
	}
	for _, tc := range tests {
		var f *errFatal
		ok := errors.As(fatal(tc.err), &f)
		if ok != (tc.reason != "") || ok && f.reason != tc.reason {
			t.Errorf("fatal(%v) = %v, want reason %q", tc.err, f, tc.reason)
		}
	}
}
