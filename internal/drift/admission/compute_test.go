package admission

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// hopAt is the trace hop a request at `now` produces.
func hopAt(apiVersion, kind, name string, gen int64, user string) Hop {
	return Hop{APIVersion: apiVersion, Kind: kind, Name: name, Generation: gen, User: user, Timestamp: "2026-03-01T12:00:00Z"}
}

// TestComputeAnnotations covers the compute-function tables: UPDATE
// and CREATE, controller and user, spec and no spec change, the child that
// is also a parent, and status updates.
func TestComputeAnnotations(t *testing.T) {
	parentTraceHops := []Hop{{APIVersion: "example.com/v1", Kind: "Widget", Name: "w", Generation: 4, User: human, Timestamp: "2026-03-01T11:00:00Z"}}
	reconciling := steadyParent(gen(4), ann("trace", hopsJSON(parentTraceHops)),
		ann("approvals", `[{"kind":"Gadget","name":"g","mode":"always"}]`), ann("freeze", "false"))
	// The child as it is stored: also a parent (it has its own controllers),
	// with a user approval for its own children.
	oldTrace := hopsJSON([]Hop{hopAt("example.com/v1", "Widget", "w", 3, human), hopAt("example.com/v1", "Gadget", "g", 5, ctrlUser)})
	stored := childOf(reconciling,
		ann("trace", oldTrace),
		ann("controllers", hOther), ann("phase", PhaseInitialized),
		ann("approvals", `[{"kind":"Pod","name":"*","mode":"always"}]`),
		ann("example.com/keep", "yes"))
	// What a controller syncing annotations from the parent sends.
	clobbered := func(u *unstructured.Unstructured) {
		for k, v := range reconciling.GetAnnotations() {
			ann(k, v)(u)
		}
	}
	storedOurs := ours(stored)

	tests := []struct {
		name   string
		op     admissionv1.Operation
		user   string
		parent *unstructured.Unstructured
		old    *unstructured.Unstructured
		new    *unstructured.Unstructured
		want   map[string]string // our annotations after the patch
	}{
		{
			name: "UPDATE, controller, no spec change: everything from old",
			op:   admissionv1.Update, user: ctrlUser, parent: reconciling,
			old: stored, new: with(stored, clobbered),
			want: storedOurs,
		},
		{
			name: "UPDATE, controller, spec change: trace and updaters recomputed, controllers/phase and user annotations from old",
			op:   admissionv1.Update, user: ctrlUser, parent: reconciling,
			old: stored, new: with(stored, clobbered, specField("replicas", int64(3))),
			want: map[string]string{
				"trace":       hopsJSON(append(parentTraceHops, hopAt("example.com/v1", "Gadget", "g", 6, ctrlUser))),
				"updaters":    hCtrl,
				"controllers": hOther,
				"phase":       PhaseInitialized,
				"approvals":   `[{"kind":"Pod","name":"*","mode":"always"}]`,
			},
		},
		{
			name: "UPDATE, user, spec change: new origin, user annotations as sent",
			op:   admissionv1.Update, user: human, parent: reconciling,
			old: stored, new: with(stored, specField("replicas", int64(3)), ann("snooze", "2026-03-02T00:00:00Z"), ann("trace", "forged"), ann("controllers", "zzzzz")),
			want: map[string]string{
				"trace":       hopsJSON([]Hop{hopAt("example.com/v1", "Gadget", "g", 6, human)}),
				"updaters":    hCtrl + "," + hHuman,
				"controllers": hOther,
				"phase":       PhaseInitialized,
				"approvals":   `[{"kind":"Pod","name":"*","mode":"always"}]`,
				"snooze":      "2026-03-02T00:00:00Z",
			},
		},
		{
			name: "UPDATE, user, no spec change: system from old, user may edit approvals and freeze",
			op:   admissionv1.Update, user: human, parent: reconciling,
			old: stored, new: with(stored, ann("trace", "forged"), ann("updaters", hHuman), ann("freeze", `{"user":"alice"}`), noAnn("approvals")),
			want: map[string]string{
				"trace":       oldTrace,
				"updaters":    hCtrl,
				"controllers": hOther,
				"phase":       PhaseInitialized,
				"freeze":      `{"user":"alice"}`,
			},
		},
		{
			name: "UPDATE, user (the leader), no spec change: one controllers hash appended and phase raised pass",
			op:   admissionv1.Update, user: otherUser,
			old: with(stored, noAnn("phase")), new: with(stored, ann("controllers", hOther+","+hCtrl), ann("phase", PhaseInitialized)),
			want: ours(with(stored, ann("controllers", hOther+","+hCtrl))),
		},
		{
			name: "UPDATE, user, no spec change: controllers rewritten and phase lowered are refused",
			op:   admissionv1.Update, user: human,
			old: stored, new: with(stored, ann("controllers", hHuman), ann("phase", PhaseInitializing)),
			want: storedOurs,
		},
		{
			name: "UPDATE, user, spec change of an object with approvals for its own children: stale ones pruned",
			op:   admissionv1.Update, user: human,
			old: with(stored, ann("approvals", `[{"kind":"Pod","name":"a","generation":5},{"kind":"Pod","name":"b","generation":6,"mode":"generation"},{"kind":"Pod","name":"c","mode":"always"}]`)),
			new: with(stored, specField("replicas", int64(3)), ann("approvals", `[{"kind":"Pod","name":"a","generation":5},{"kind":"Pod","name":"b","generation":6,"mode":"generation"},{"kind":"Pod","name":"c","mode":"always"}]`)),
			want: map[string]string{
				"trace":       hopsJSON([]Hop{hopAt("example.com/v1", "Gadget", "g", 6, human)}),
				"updaters":    hCtrl + "," + hHuman,
				"controllers": hOther,
				"phase":       PhaseInitialized,
				"approvals":   `[{"kind":"Pod","name":"b","generation":6,"mode":"generation"},{"kind":"Pod","name":"c","mode":"always"}]`,
			},
		},
		{
			name: "UPDATE, lenient (no controllers record, two updaters): copies of the parent's user annotations undone",
			op:   admissionv1.Update, user: ctrlUser, parent: with(reconciling, noAnn("controllers")),
			old: with(stored, ann("updaters", hOther+","+hHuman)), new: with(stored, ann("updaters", hOther+","+hHuman), clobbered, ann("snooze", "2026-03-02T00:00:00Z")),
			want: map[string]string{
				"trace":       oldTrace,
				"updaters":    hOther + "," + hHuman,
				"controllers": hOther,
				"phase":       PhaseInitialized,
				"approvals":   `[{"kind":"Pod","name":"*","mode":"always"}]`,
				"snooze":      "2026-03-02T00:00:00Z",
			},
		},
		{
			name: "CREATE, controller copying the parent's annotations: all wiped, fresh trace and updaters",
			op:   admissionv1.Create, user: ctrlUser, parent: reconciling,
			new: childOf(reconciling, clobbered, ann("controllers", hCtrl), ann("phase", PhaseInitialized), ann("trace-ticket", "T-1"), gen(0)),
			want: map[string]string{
				"trace":    hopsJSON(append(parentTraceHops, hopAt("example.com/v1", "Gadget", "g", 1, ctrlUser))),
				"updaters": hCtrl,
			},
		},
		{
			name: "CREATE, user: copies of the parent's user annotations dropped, own ones kept",
			op:   admissionv1.Create, user: human, parent: reconciling,
			new: childOf(reconciling, clobbered, ann("freeze", `{"user":"alice"}`), ann("updaters", hOther), gen(0)),
			want: map[string]string{
				"trace":    hopsJSON([]Hop{hopAt("example.com/v1", "Gadget", "g", 1, human)}),
				"updaters": hHuman,
				"freeze":   `{"user":"alice"}`,
			},
		},
		{
			name: "CREATE of a root object: one-hop trace",
			op:   admissionv1.Create, user: human,
			new: newObj("apps/v1", "Deployment", "d"),
			want: map[string]string{
				"trace":    hopsJSON([]Hop{hopAt("apps/v1", "Deployment", "d", 1, human)}),
				"updaters": hHuman,
			},
		},
		{
			name: "CREATE by the controller of a parent without a trace: the parent becomes the origin",
			op:   admissionv1.Create, user: ctrlUser, parent: steadyParent(gen(4)),
			new: childOf(reconciling, noAnn("updaters"), gen(0)),
			want: map[string]string{
				"trace":    hopsJSON([]Hop{{APIVersion: "example.com/v1", Kind: "Widget", Name: "w", Generation: 4}, hopAt("example.com/v1", "Gadget", "g", 1, ctrlUser)}),
				"updaters": hCtrl,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := request(tc.op, tc.user, tc.old, tc.new)
			d := Decide(Input{Request: req, Old: tc.old, New: tc.new, Parent: tc.parent, Now: now, Config: enforce()})
			if !d.Allowed {
				t.Fatalf("denied: %s %s", d.Outcome, d.Message)
			}
			got := ours(applied(t, tc.new, d))
			want := tc.want
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("annotations (-want +got):\n%s\npatch: %s", diff, d.Patch)
			}
			if a := applied(t, tc.new, d).GetAnnotations(); tc.new.GetAnnotations()["example.com/keep"] != a["example.com/keep"] {
				t.Errorf("foreign annotation changed: %v", a)
			}
		})
	}
}

// TestTraceMarks: an approved drift and a logged drift are marked on the
// child's hop.
func TestTraceMarks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		parent *unstructured.Unstructured
		want   Hop
	}{
		{"approved", enforce(), steadyParent(ann("approvals", `[{"kind":"Gadget","name":"g","mode":"generation","generation":3}]`)),
			Hop{APIVersion: "example.com/v1", Kind: "Gadget", Name: "g", Generation: 6, User: ctrlUser, Timestamp: "2026-03-01T12:00:00Z", Approval: ApprovalGeneration}},
		{"logged", logMode(), steadyParent(),
			Hop{APIVersion: "example.com/v1", Kind: "Gadget", Name: "g", Generation: 6, User: ctrlUser, Timestamp: "2026-03-01T12:00:00Z", Drift: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := childOf(tc.parent)
			nw := with(old, specField("replicas", int64(7)))
			d := Decide(Input{Request: request(admissionv1.Update, ctrlUser, old, nw), Old: old, New: nw, Parent: tc.parent, Now: now, Config: tc.cfg})
			hops, err := ParseTrace(ours(applied(t, nw, d))["trace"])
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, hops[len(hops)-1]); diff != "" {
				t.Errorf("last hop (-want +got):\n%s", diff)
			}
			if hops[0].Kind != "Widget" {
				t.Errorf("trace does not start at the parent: %+v", hops)
			}
		})
	}
}

func TestPatchShape(t *testing.T) {
	t.Run("object without annotations gets the map added", func(t *testing.T) {
		o := newObj("v1", "ConfigMap", "c")
		p := annotationPatch(o, map[string]string{"a/b": "1"})
		if got, want := string(p), `[{"op":"add","path":"/metadata/annotations","value":{"a/b":"1"}}]`; got != want {
			t.Errorf("patch %s, want %s", got, want)
		}
	})
	t.Run("keys are escaped and only changes are sent", func(t *testing.T) {
		o := newObj("v1", "ConfigMap", "c", ann("x~y/z", "old"), ann("keep", "k"), ann("gone", "g"))
		p := annotationPatch(o, map[string]string{"x~y/z": "new", pfx + "keep": "k"})
		want := `[{"op":"remove","path":"/metadata/annotations/policyd.io~1gone"},{"op":"add","path":"/metadata/annotations/x~0y~1z","value":"new"}]`
		if string(p) != want {
			t.Errorf("patch %s, want %s", p, want)
		}
	})
	t.Run("no change, no patch", func(t *testing.T) {
		o := newObj("v1", "ConfigMap", "c", ann("keep", "k"))
		if p := annotationPatch(o, o.GetAnnotations()); p != nil {
			t.Errorf("patch %s, want none", p)
		}
	})
}

// TestTraceLabels: an object's trace-<key> annotations label its own hop,
// are not inherited, and the parent's hops are copied whole. Bad labels
// are left out with a warning.
func TestTraceLabels(t *testing.T) {
	// The parent's trace as another version or tool might write it: labels
	// and a field this version does not know.
	parentTrace := `[{"apiVersion":"example.com/v1","kind":"Widget","name":"w","generation":4,"user":"alice","labels":{"ticket":"JIRA-1"},"requestUID":"r-1"}]`
	reconciling := steadyParent(gen(4), ann("trace", parentTrace), ann("trace-ticket", "JIRA-1"))
	withTicket := func(v string) objOpt { return ann("trace-ticket", v) }
	tests := []struct {
		name       string
		op         admissionv1.Operation
		user       string
		parent     *unstructured.Unstructured
		old, new   *unstructured.Unstructured
		wantTrace  string // the whole trace annotation
		wantWarned []string
	}{
		{
			name: "a user's spec change labels the new origin",
			op:   admissionv1.Update, user: human, parent: steadyParent(),
			old: childOf(steadyParent()), new: with(childOf(steadyParent()), specField("replicas", int64(2)), withTicket("OPS-7"), ann("trace-pr", "567")),
			wantTrace: `[{"apiVersion":"example.com/v1","kind":"Gadget","name":"g","generation":6,"user":"alice","timestamp":"2026-03-01T12:00:00Z","labels":{"pr":"567","ticket":"OPS-7"}}]`,
		},
		{
			name: "the controller's hop: parent hops copied whole, its own labels from the stored child, the parent's copy not inherited",
			op:   admissionv1.Update, user: ctrlUser, parent: reconciling,
			old: childOf(reconciling, withTicket("OPS-7")), new: with(childOf(reconciling, withTicket("JIRA-1")), specField("replicas", int64(2))),
			wantTrace: `[{"apiVersion":"example.com/v1","kind":"Widget","name":"w","generation":4,"user":"alice","labels":{"ticket":"JIRA-1"},"requestUID":"r-1"},` +
				`{"apiVersion":"example.com/v1","kind":"Gadget","name":"g","generation":6,"user":"` + ctrlUser + `","timestamp":"2026-03-01T12:00:00Z","labels":{"ticket":"OPS-7"}}]`,
		},
		{
			name: "a controller's CREATE copying the parent's labels: none on the child's hop",
			op:   admissionv1.Create, user: ctrlUser, parent: reconciling,
			new: childOf(reconciling, noAnn("updaters"), gen(0), withTicket("JIRA-1")),
			wantTrace: `[{"apiVersion":"example.com/v1","kind":"Widget","name":"w","generation":4,"user":"alice","labels":{"ticket":"JIRA-1"},"requestUID":"r-1"},` +
				`{"apiVersion":"example.com/v1","kind":"Gadget","name":"g","generation":1,"user":"` + ctrlUser + `","timestamp":"2026-03-01T12:00:00Z"}]`,
		},
		{
			name: "an invalid key and an oversize value are left out, with warnings",
			op:   admissionv1.Update, user: human, parent: steadyParent(),
			old: childOf(steadyParent()),
			new: with(childOf(steadyParent()), specField("replicas", int64(2)), ann("trace--bad", "x"), ann("trace-", "empty"),
				ann("trace-big", strings.Repeat("x", maxTraceLabel+1)), ann("trace-fits", strings.Repeat("y", maxTraceLabel))),
			wantTrace: `[{"apiVersion":"example.com/v1","kind":"Gadget","name":"g","generation":6,"user":"alice","timestamp":"2026-03-01T12:00:00Z","labels":{"fits":"` + strings.Repeat("y", maxTraceLabel) + `"}}]`,
			wantWarned: []string{
				"ignoring " + pfx + "trace--bad: \"-bad\" is not a valid label key",
				"ignoring " + pfx + "trace-: \"\" is not a valid label key",
				"ignoring " + pfx + "trace-big: its value is 1025 bytes, more than 1024",
			},
		},
		{
			name: "a metadata-only change keeps the trace as it is",
			op:   admissionv1.Update, user: human, parent: steadyParent(),
			old:       childOf(steadyParent(), ann("trace", `[{"apiVersion":"v1","kind":"K","name":"k"}]`)),
			new:       with(childOf(steadyParent(), ann("trace", `[{"apiVersion":"v1","kind":"K","name":"k"}]`)), withTicket("OPS-8")),
			wantTrace: `[{"apiVersion":"v1","kind":"K","name":"k"}]`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(Input{Request: request(tc.op, tc.user, tc.old, tc.new), Old: tc.old, New: tc.new, Parent: tc.parent, Now: now, Config: logMode()})
			if !d.Allowed {
				t.Fatalf("denied: %s", d.Message)
			}
			if got := ours(applied(t, tc.new, d))["trace"]; got != tc.wantTrace {
				t.Errorf("trace\n got %s\nwant %s", got, tc.wantTrace)
			}
			var warned []string
			for _, w := range d.Warnings {
				if strings.Contains(w, "trace-") {
					warned = append(warned, w)
				}
			}
			for i := range warned {
				if i < len(tc.wantWarned) && !strings.HasPrefix(warned[i], tc.wantWarned[i]) {
					t.Errorf("warning %d = %q, want prefix %q", i, warned[i], tc.wantWarned[i])
				}
			}
			if len(warned) != len(tc.wantWarned) {
				t.Errorf("warnings %q, want %d about trace labels", warned, len(tc.wantWarned))
			}
		})
	}
}
