package admission

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Identities the tests play.
const (
	ctrlUser  = "system:serviceaccount:kube-system:widget-controller"
	human     = "alice"
	hpaUser   = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
	otherUser = "system:serviceaccount:other:other-controller"
	pfx       = "policyd.io/"
)

var (
	hCtrl  = UserHash(ctrlUser)
	hHuman = UserHash(human)
	hOther = UserHash(otherUser)
	now    = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
)

type objOpt func(*unstructured.Unstructured)

func newObj(apiVersion, kind, name string, opts ...objOpt) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion,
		"kind":       kind,
		"metadata": map[string]any{
			"name": name, "namespace": "ns", "uid": name + "-uid", "resourceVersion": "7",
		},
	}}
	for _, o := range opts {
		o(u)
	}
	return u
}

func md(u *unstructured.Unstructured) map[string]any { return u.Object["metadata"].(map[string]any) }

func sub(u *unstructured.Unstructured, field string) map[string]any {
	m, ok := u.Object[field].(map[string]any)
	if !ok {
		m = map[string]any{}
		u.Object[field] = m
	}
	return m
}

// ann sets an annotation; a key without "/" is under the prefix.
func ann(k, v string) objOpt {
	return func(u *unstructured.Unstructured) {
		if !strings.Contains(k, "/") {
			k = pfx + k
		}
		a, _ := md(u)["annotations"].(map[string]any)
		if a == nil {
			a = map[string]any{}
			md(u)["annotations"] = a
		}
		a[k] = v
	}
}

func noAnn(k string) objOpt {
	return func(u *unstructured.Unstructured) {
		if a, ok := md(u)["annotations"].(map[string]any); ok {
			delete(a, pfx+k)
		}
	}
}

func gen(g int64) objOpt { return func(u *unstructured.Unstructured) { md(u)["generation"] = g } }
func obsGen(g int64) objOpt {
	return func(u *unstructured.Unstructured) { sub(u, "status")["observedGeneration"] = g }
}
func specField(k string, v any) objOpt {
	return func(u *unstructured.Unstructured) { sub(u, "spec")[k] = v }
}
func statusField(k string, v any) objOpt {
	return func(u *unstructured.Unstructured) { sub(u, "status")[k] = v }
}
func deleting() objOpt {
	return func(u *unstructured.Unstructured) { md(u)["deletionTimestamp"] = "2026-03-01T11:00:00Z" }
}
func cond(t, s string) objOpt {
	return func(u *unstructured.Unstructured) {
		st := sub(u, "status")
		cs, _ := st["conditions"].([]any)
		st["conditions"] = append(cs, map[string]any{"type": t, "status": s})
	}
}
func uid(id string) objOpt { return func(u *unstructured.Unstructured) { md(u)["uid"] = id } }

func ownedBy(p *unstructured.Unstructured, controller bool) objOpt {
	return func(u *unstructured.Unstructured) {
		md(u)["ownerReferences"] = []any{map[string]any{
			"apiVersion": p.GetAPIVersion(), "kind": p.GetKind(), "name": p.GetName(),
			"uid": string(p.GetUID()), "controller": controller,
		}}
	}
}

// with returns a copy of u with more options applied.
func with(u *unstructured.Unstructured, opts ...objOpt) *unstructured.Unstructured {
	c := u.DeepCopy()
	for _, o := range opts {
		o(c)
	}
	return c
}

// steadyParent is an initialized Widget at rest (generation ==
// observedGeneration, Ready=True) whose controller is ctrlUser.
func steadyParent(opts ...objOpt) *unstructured.Unstructured {
	base := []objOpt{gen(3), obsGen(3), cond("Ready", "True"), ann("controllers", hCtrl), ann("phase", PhaseInitialized), specField("size", int64(1))}
	return newObj("example.com/v1", "Widget", "w", append(base, opts...)...)
}

// initializingParent is steadyParent before it was ever ready.
func initializingParent(opts ...objOpt) *unstructured.Unstructured {
	base := []objOpt{noAnn("phase"), func(u *unstructured.Unstructured) { delete(u.Object, "status") }}
	return steadyParent(append(base, opts...)...)
}

// childOf is a Gadget controlled by parent, last written by ctrlUser.
func childOf(parent *unstructured.Unstructured, opts ...objOpt) *unstructured.Unstructured {
	base := []objOpt{gen(5), ownedBy(parent, true), ann("updaters", hCtrl), specField("replicas", int64(1))}
	return newObj("example.com/v1", "Gadget", "g", append(base, opts...)...)
}

func request(op admissionv1.Operation, user string, oldObj, newObj *unstructured.Unstructured) *admissionv1.AdmissionRequest {
	o := newObj
	if o == nil {
		o = oldObj
	}
	gv, _ := schemaGV(o.GetAPIVersion())
	r := &admissionv1.AdmissionRequest{
		UID:       types.UID("req-1"),
		Kind:      metav1.GroupVersionKind{Group: gv.Group, Version: gv.Version, Kind: o.GetKind()},
		Resource:  metav1.GroupVersionResource{Group: gv.Group, Version: gv.Version, Resource: strings.ToLower(o.GetKind()) + "s"},
		Name:      o.GetName(),
		Namespace: o.GetNamespace(),
		Operation: op,
		UserInfo:  authnv1.UserInfo{Username: user, Groups: []string{"system:authenticated"}},
	}
	if newObj != nil {
		r.Object = runtime.RawExtension{Raw: mustJSON(newObj.Object)}
	}
	if oldObj != nil {
		r.OldObject = runtime.RawExtension{Raw: mustJSON(oldObj.Object)}
	}
	return r
}

func schemaGV(apiVersion string) (metav1.GroupVersion, error) {
	g, v, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return metav1.GroupVersion{Version: apiVersion}, nil
	}
	return metav1.GroupVersion{Group: g, Version: v}, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// hopsJSON is a trace annotation value of hops.
func hopsJSON(hops []Hop) string { return string(mustJSON(hops)) }

// applied is obj after the decision's patch, as the API server would store
// it.
func applied(t *testing.T, obj *unstructured.Unstructured, d Decision) *unstructured.Unstructured {
	t.Helper()
	if len(d.Patch) == 0 {
		return obj
	}
	p, err := jsonpatch.DecodePatch(d.Patch)
	if err != nil {
		t.Fatalf("decode patch %s: %v", d.Patch, err)
	}
	b, err := p.Apply(mustJSON(obj.Object))
	if err != nil {
		t.Fatalf("apply patch %s: %v", d.Patch, err)
	}
	out, err := decodeObject(b)
	if err != nil {
		t.Fatalf("decode patched object: %v", err)
	}
	return out
}

// ours is the object's annotations under the prefix, without it.
func ours(u *unstructured.Unstructured) map[string]string {
	out := map[string]string{}
	for k, v := range u.GetAnnotations() {
		if after, ok := strings.CutPrefix(k, pfx); ok {
			out[after] = v
		}
	}
	return out
}

func effectKinds(d Decision) []EffectKind {
	var out []EffectKind
	for _, e := range d.Effects {
		out = append(out, e.Kind)
	}
	return out
}

func enforce() Config { return Config{AnnotationPrefix: "policyd.io", Mode: ModeEnforce} }
func logMode() Config { return Config{AnnotationPrefix: "policyd.io", Mode: ModeLog} }
