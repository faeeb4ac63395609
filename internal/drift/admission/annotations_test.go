package admission

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

func TestUserHash(t *testing.T) {
	// Expected values computed independently (Python hashlib) from the
	// definition: SHA-256, first 4 bytes big-endian, base 36, pad, cut.
	tests := map[string]string{
		"alice": "c5xzg",
		"system:serviceaccount:kube-system:deployment-controller": "1likq",
		"":         "1r6c4",
		"admin":    "12yja",
		"user-399": "05w1b", // 274799 = "5w1b" in base 36: left-padded
	}
	for user, want := range tests {
		if got := UserHash(user); got != want {
			t.Errorf("UserHash(%q) = %q, want %q", user, got, want)
		}
	}
}

func TestHashLists(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"abcde", []string{"abcde"}},
		{" abcde , 12345 ", []string{"abcde", "12345"}},
		{"abcde,abcde,12345", []string{"abcde", "12345"}},
		{"ABCDE,abcd,abcdef,ab-de,,12345", []string{"12345"}},
		{"aaaaa,bbbbb,ccccc,ddddd,eeeee,fffff,ggggg", []string{"ccccc", "ddddd", "eeeee", "fffff", "ggggg"}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, ParseHashes(tc.in)); diff != "" {
			t.Errorf("ParseHashes(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
	five := []string{"aaaaa", "bbbbb", "ccccc", "ddddd", "eeeee"}
	if got, want := FormatHashes(AddHash(five, "fffff")), "bbbbb,ccccc,ddddd,eeeee,fffff"; got != want {
		t.Errorf("AddHash past 5 = %q, want %q (oldest dropped)", got, want)
	}
	if got := AddHash(five, "ccccc"); !cmp.Equal(got, five) {
		t.Errorf("AddHash of a present hash = %v, want unchanged", got)
	}
	if five[0] != "aaaaa" {
		t.Error("AddHash modified its input")
	}
	for _, tc := range []struct {
		prev, next string
		want       bool
	}{
		{"", "aaaaa", true},
		{"aaaaa", "aaaaa,bbbbb", true},
		{"aaaaa,bbbbb,ccccc,ddddd,eeeee", "bbbbb,ccccc,ddddd,eeeee,fffff", true},
		{"aaaaa", "bbbbb", false},
		{"aaaaa", "aaaaa,bbbbb,ccccc", false},
		{"aaaaa", "aaaaa", false},
		{"aaaaa", "aaaaa, bbbbb", false},
		{"aaaaa", "aaaaa,BBBBB", false},
	} {
		if got := isOneHashAppend(tc.prev, tc.next); got != tc.want {
			t.Errorf("isOneHashAppend(%q, %q) = %v, want %v", tc.prev, tc.next, got, tc.want)
		}
	}
}

func TestParseApprovalsAndRejections(t *testing.T) {
	as, err := ParseApprovals(`[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"r","generation":4},
		{"kind":"Pod","name":"*","mode":"always","extra":1},{"kind":"","name":"x"},{"kind":"Pod","name":"y","mode":"never"}]`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Approval{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "r", Generation: 4, Mode: ApprovalOnce}, {Kind: "Pod", Name: "*", Mode: ApprovalAlways}}
	if diff := cmp.Diff(want, as); diff != "" {
		t.Errorf("approvals (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"", "{}", `[{"kind":1}]`, `[{"generation":"3"}]`, "[", "null x"} {
		if _, err := ParseApprovals(bad); err == nil {
			t.Errorf("ParseApprovals(%q) succeeded", bad)
		}
		if _, err := ParseRejections(bad); err == nil {
			t.Errorf("ParseRejections(%q) succeeded", bad)
		}
	}
	rs, err := ParseRejections(`[{"kind":"Pod","name":"p","reason":"no"},{"name":"q"}]`)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Rejection{{Kind: "Pod", Name: "p", Reason: "no"}}, rs); diff != "" {
		t.Errorf("rejections (-want +got):\n%s", diff)
	}
}

func TestParseFreezeAndSnooze(t *testing.T) {
	for _, tc := range []struct {
		in         string
		wantFrozen bool
		wantText   string
	}{
		{"", false, ""},
		{"false", false, ""},
		{"true", true, "legacy"},
		{`{"user":"bob","message":"m","at":"t"}`, true, "frozen by bob at t: m"},
		{`{}`, true, "frozen by unknown user at unknown time: no reason given"},
		{"yes please", true, "unparsable"},
	} {
		f, frozen := ParseFreeze(tc.in)
		if frozen != tc.wantFrozen {
			t.Errorf("ParseFreeze(%q) frozen = %v, want %v", tc.in, frozen, tc.wantFrozen)
		}
		if frozen && !strings.Contains(f.String(), tc.wantText) {
			t.Errorf("ParseFreeze(%q) = %q, want it to contain %q", tc.in, f, tc.wantText)
		}
	}
	exp := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want Snooze
		ok   bool
	}{
		{"2026-03-02T00:00:00Z", Snooze{Expiry: exp}, true},
		{`{"expiry":"2026-03-02T00:00:00Z","user":"bob","message":"m"}`, Snooze{Expiry: exp, User: "bob", Message: "m"}, true},
		{`{"user":"bob"}`, Snooze{}, false},
		{"2026-03-02", Snooze{}, false},
		{"soon", Snooze{}, false},
	} {
		got, ok := ParseSnooze(tc.in)
		if ok != tc.ok || !got.Expiry.Equal(tc.want.Expiry) || got.User != tc.want.User || got.Message != tc.want.Message {
			t.Errorf("ParseSnooze(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestTraceBounded(t *testing.T) {
	var parent []json.RawMessage
	for i := range 40 {
		parent = append(parent, marshalHop(Hop{Kind: "K", Name: string(rune('a' + i%26)), Generation: int64(i)}))
	}
	got, err := ParseTrace(formatTrace(extendTrace(parent, Hop{Kind: "Child"})))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != maxTraceHops || got[0].Generation != 0 || got[len(got)-1].Kind != "Child" || got[len(got)-2].Generation != 39 {
		t.Errorf("trace of %d hops: first %+v, last two %+v", len(got), got[0], got[len(got)-2:])
	}
	if _, err := ParseTrace("{}"); err == nil {
		t.Error("ParseTrace of an object succeeded")
	}
}

func TestReportIDs(t *testing.T) {
	parent := ObjectRef{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "ns", Name: "d", UID: "u1", Generation: 3}
	child := ObjectRef{APIVersion: "apps/v1", Kind: "ReplicaSet", Namespace: "ns", Name: "r", UID: "u2"}
	oldSpec := map[string]any{"spec": map[string]any{"replicas": int64(1), "b": "x", "a": "y"}}
	newSpec := map[string]any{"spec": map[string]any{"a": "y", "b": "x", "replicas": int64(2)}}
	id := DetectedID(parent, child, oldSpec, newSpec)
	if len(id) != 16 {
		t.Fatalf("id %q is not 16 hex characters", id)
	}
	// Another replica sees the same drift at another version, resource
	// version and uid (the ids must not depend on them).
	p2, c2 := parent, child
	p2.APIVersion, p2.UID, p2.ResourceVersion, c2.APIVersion = "apps/v1beta2", "", "99", "apps/v1beta2"
	if got := DetectedID(p2, c2, oldSpec, newSpec); got != id {
		t.Errorf("DetectedID differs across replicas: %s vs %s", got, id)
	}
	if got := DetectedID(parent, child, oldSpec, map[string]any{"spec": map[string]any{"replicas": int64(3)}}); got == id {
		t.Error("another spec change has the same Detected id")
	}
	c3 := child
	c3.Name = "r2"
	if DetectedID(parent, c3, oldSpec, newSpec) == id || ResolvedID(parent, c3) == ResolvedID(parent, child) {
		t.Error("another child has the same ids")
	}
	if ResolvedID(parent, child) == id || ResolvedID(p2, c2) != ResolvedID(parent, child) {
		t.Error("Resolved id must depend on the pair only")
	}
}

// TestApprovedOccurrence: every approved drift has its own occurrence,
// but a retry of the same change (a conflict with a status update, another
// webhook's call with another uid) has the same one.
func TestApprovedOccurrence(t *testing.T) {
	p := steadyParent(ann("approvals", `[{"kind":"*","name":"*","mode":"always"}]`))
	occurrence := func(uid string, old *unstructured.Unstructured) string {
		t.Helper()
		nw := with(old, specField("replicas", int64(2)))
		req := request(admissionv1.Update, ctrlUser, old, nw)
		req.UID = types.UID(uid)
		d := Decide(Input{Request: req, Old: old, New: nw, Parent: p, Now: now, Config: enforce()})
		if len(d.Effects) != 1 || d.Effects[0].Resolution != ResolvedApproved || len(d.Effects[0].Occurrence) != 16 {
			t.Fatalf("effects %+v, want one approved Resolved with an occurrence", d.Effects)
		}
		return d.Effects[0].Occurrence
	}
	rv := func(v string) objOpt { return func(u *unstructured.Unstructured) { md(u)["resourceVersion"] = v } }
	base := occurrence("a", childOf(p))
	if got := occurrence("b", childOf(p, rv("8"))); got != base {
		t.Error("the same change after a status update (another resourceVersion, same generation) is another occurrence")
	}
	if got := occurrence("a", childOf(p, gen(6))); got == base {
		t.Error("the same change of a later generation is the same occurrence")
	}
	if got := occurrence("a", childOf(p, specField("replicas", int64(3)))); got == base {
		t.Error("another change is the same occurrence")
	}
	noGen := func(v string) *unstructured.Unstructured {
		return childOf(p, func(u *unstructured.Unstructured) { delete(md(u), "generation") }, rv(v))
	}
	if occurrence("a", noGen("7")) == occurrence("a", noGen("8")) {
		t.Error("a kind without generation: changes of two resourceVersions are one occurrence")
	}
}

// TestReport: Decide's drift effects become the DriftReport of docs/drift.md, stable
// over a JSON round trip (Raft).
func TestReport(t *testing.T) {
	p := steadyParent()
	old := childOf(p, func(u *unstructured.Unstructured) { md(u)["managedFields"] = []any{map[string]any{"manager": "x"}} })
	nw := with(old, specField("replicas", int64(2)))
	req := request(admissionv1.Update, ctrlUser, old, nw)
	d := Decide(Input{Request: req, Old: old, New: nw, Parent: p, Now: now, Config: enforce()})
	if len(d.Effects) != 1 || d.Effects[0].Kind != EffectDriftDetected {
		t.Fatalf("effects %v", effectKinds(d))
	}
	raw, err := json.Marshal(d.Effects)
	if err != nil {
		t.Fatal(err)
	}
	var back []Effect
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(d.Effects, back); diff != "" {
		t.Fatalf("effect changed over JSON (-before +after):\n%s", diff)
	}
	r := back[0].Report()
	b, _ := json.Marshal(r)
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	spec := got["spec"].(map[string]any)
	want := map[string]any{
		"apiVersion": "policyd.io/v1", "kind": "DriftReport",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if spec["phase"] != ReportDetected || spec["id"] != back[0].ID || len(spec["id"].(string)) != 16 {
		t.Errorf("phase/id = %v/%v", spec["phase"], spec["id"])
	}
	wantParent := map[string]any{"apiVersion": "example.com/v1", "kind": "Widget", "namespace": "ns", "name": "w",
		"generation": 3.0, "observedGeneration": 3.0, "lifecyclePhase": PhaseInitialized}
	if diff := cmp.Diff(wantParent, spec["parent"]); diff != "" {
		t.Errorf("parent (-want +got):\n%s", diff)
	}
	wantChild := map[string]any{"apiVersion": "example.com/v1", "kind": "Gadget", "namespace": "ns", "name": "g", "uid": "g-uid", "generation": 5.0}
	if diff := cmp.Diff(wantChild, spec["child"]); diff != "" {
		t.Errorf("child (-want +got):\n%s", diff)
	}
	wantReq := map[string]any{"user": ctrlUser, "groups": []any{"system:authenticated"}, "uid": "req-1", "operation": "UPDATE", "dryRun": false}
	if diff := cmp.Diff(wantReq, spec["request"]); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]any{"spec.replicas"}, spec["diff"]); diff != "" {
		t.Errorf("diff (-want +got):\n%s", diff)
	}
	newObject := spec["newObject"].(map[string]any)
	if _, ok := newObject["metadata"].(map[string]any)["managedFields"]; ok {
		t.Error("report keeps managedFields")
	}
	if newObject["spec"].(map[string]any)["replicas"] != 2.0 || spec["oldObject"].(map[string]any)["spec"].(map[string]any)["replicas"] != 1.0 {
		t.Errorf("objects not carried: %v / %v", newObject["spec"], spec["oldObject"])
	}

	approved := Decide(Input{Request: req, Old: old, New: nw, Parent: with(p, ann("approvals", `[{"kind":"Gadget","name":"g","mode":"always"}]`)), Now: now, Config: enforce()})
	if len(approved.Effects) != 1 || approved.Effects[0].Kind != EffectDriftResolved {
		t.Fatalf("approved effects %v", effectKinds(approved))
	}
	if e := approved.Effects[0]; e.ID != ResolvedID(back[0].Parent, *back[0].Child) || e.Resolution != ResolvedApproved ||
		e.Occurrence != ApprovedOccurrence(e.Parent, *e.Child, "generation 5", map[string]any{"spec": map[string]any{"replicas": int64(1)}}, map[string]any{"spec": map[string]any{"replicas": int64(2)}}) ||
		e.OldObject == nil || e.NewObject == nil || len(e.Diff) != 1 || e.Request == nil {
		t.Errorf("approved resolved effect %+v: want the pair's id, its occurrence, the request and the objects", e)
	}
	expected := Decide(Input{Request: req, Old: old, New: nw, Parent: with(p, gen(4)), Now: now, Config: enforce()})
	if e := expected.Effects[len(expected.Effects)-1]; e.Kind != EffectDriftResolved || e.Resolution != ResolvedParentChanged ||
		e.ID != ResolvedID(back[0].Parent, *back[0].Child) || e.Occurrence != "" || e.OldObject != nil || e.NewObject != nil || e.Request == nil {
		t.Errorf("parent-changed resolved effect %+v: want the pair's id, the request, no objects", e)
	}
	resolved := Effect{Kind: EffectDriftResolved, Parent: back[0].Parent, Child: back[0].Child}
	if rr := resolved.Report(); rr.Spec.Phase != ReportResolved || rr.Spec.ID != ResolvedID(back[0].Parent, *back[0].Child) {
		t.Errorf("resolved report %+v", rr.Spec)
	}
	if (Effect{Kind: EffectRecordPhase}).Report().Kind != "" {
		t.Error("a non-drift effect has a report")
	}
}

// TestAnnotate: the leader's patches for the annotation effects.
func TestAnnotate(t *testing.T) {
	approvals := `[{"kind":"Pod","name":"a","generation":3},{"kind":"Pod","name":"b","generation":2,"mode":"generation"},{"kind":"Pod","name":"c","mode":"always","note":"kept"}]`
	widget := steadyParent(ann("approvals", approvals), noAnn("phase"))
	deployment := newObj("apps/v1", "Deployment", "d", gen(3), ann("approvals", approvals))
	tests := []struct {
		name        string
		e           Effect
		obj         *unstructured.Unstructured
		wantChanged bool
		want        map[string]string // changed keys only
	}{
		{"record controller", Effect{Kind: EffectRecordController, UserHash: hOther}, widget, true,
			map[string]string{"controllers": hCtrl + "," + hOther}},
		{"record controller already there", Effect{Kind: EffectRecordController, UserHash: hCtrl}, widget, false, nil},
		{"record controller with a bad hash", Effect{Kind: EffectRecordController, UserHash: "../x"}, widget, false, nil},
		{"record phase", Effect{Kind: EffectRecordPhase, Phase: PhaseInitialized}, widget, true,
			map[string]string{"phase": PhaseInitialized}},
		{"record phase initializing is refused", Effect{Kind: EffectRecordPhase, Phase: PhaseInitializing}, widget, false, nil},
		{"consume once", Effect{Kind: EffectConsumeApproval, Approval: &Approval{Kind: "Pod", Name: "a", Generation: 3, Mode: ApprovalOnce}}, widget, true,
			map[string]string{"approvals": `[{"kind":"Pod","name":"b","generation":2,"mode":"generation"},{"kind":"Pod","name":"c","mode":"always","note":"kept"}]`}},
		{"consume an approval already gone", Effect{Kind: EffectConsumeApproval, Approval: &Approval{Kind: "Pod", Name: "z", Generation: 3, Mode: ApprovalOnce}}, widget, false, nil},
		{"prune", Effect{Kind: EffectPruneApprovals}, widget, true,
			map[string]string{"approvals": `[{"kind":"Pod","name":"a","generation":3},{"kind":"Pod","name":"c","mode":"always","note":"kept"}]`}},
		{"Deployment: approvals of the current generation move to the next", Effect{Kind: EffectConsumeApproval, Approval: &Approval{Kind: "Pod", Name: "b", Generation: 2, Mode: ApprovalGeneration}}, deployment, true,
			map[string]string{"approvals": `[{"generation":4,"kind":"Pod","name":"a"},{"kind":"Pod","mode":"always","name":"c","note":"kept"}]`}},
		{"Deployment: nothing to do, nothing moved", Effect{Kind: EffectRecordPhase, Phase: PhaseInitializing}, deployment, false, nil},
		{"not an annotation effect", Effect{Kind: EffectDriftDetected}, widget, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.obj.GetAnnotations()
			got, changed := tc.e.Annotate("policyd.io", tc.obj)
			if changed != tc.wantChanged {
				t.Fatalf("changed = %v, want %v (%v)", changed, tc.wantChanged, got)
			}
			want := map[string]string{}
			for k, v := range before {
				want[k] = v
			}
			for k, v := range tc.want {
				want[pfx+k] = v
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
			if !cmp.Equal(before, tc.obj.GetAnnotations()) {
				t.Error("Annotate modified the object")
			}
		})
	}
}
