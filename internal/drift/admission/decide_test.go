package admission

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// flowCase is one request through Decide and what must come out.
type flowCase struct {
	name      string
	cfg       Config
	op        admissionv1.Operation // UPDATE when empty
	user      string                // ctrlUser when empty
	parent    *unstructured.Unstructured
	old, new  *unstructured.Unstructured // defaults: childOf(parent) and a spec change of it
	namespace *unstructured.Unstructured
	dryRun    bool

	wantAllowed bool
	wantCode    int32
	wantOutcome string
	wantEffects []EffectKind
	wantMsg     []string // substrings of Message
	wantWarn    string   // substring of some warning
}

func runFlow(t *testing.T, tc flowCase) Decision {
	t.Helper()
	op := tc.op
	if op == "" {
		op = admissionv1.Update
	}
	user := tc.user
	if user == "" {
		user = ctrlUser
	}
	oldObj, newObj := tc.old, tc.new
	if oldObj == nil && op != admissionv1.Create && tc.parent != nil {
		oldObj = childOf(tc.parent)
	}
	if newObj == nil && op != admissionv1.Delete && oldObj != nil {
		newObj = with(oldObj, specField("replicas", int64(2)))
	}
	if op == admissionv1.Create {
		oldObj = nil
	}
	if op == admissionv1.Delete {
		newObj = nil
	}
	req := request(op, user, oldObj, newObj)
	if tc.dryRun {
		req.DryRun = new(true)
	}
	cfg := tc.cfg
	if cfg.AnnotationPrefix == "" {
		cfg = enforce()
	}
	return Decide(Input{Request: req, Old: oldObj, New: newObj, Parent: tc.parent, Namespace: tc.namespace, Now: now, Config: cfg})
}

func checkFlow(t *testing.T, tc flowCase, d Decision) {
	t.Helper()
	if d.Allowed != tc.wantAllowed || d.Code != tc.wantCode || d.Outcome != tc.wantOutcome {
		t.Errorf("allowed=%v code=%d outcome=%q, want allowed=%v code=%d outcome=%q (message %q)",
			d.Allowed, d.Code, d.Outcome, tc.wantAllowed, tc.wantCode, tc.wantOutcome, d.Message)
	}
	if diff := cmp.Diff(tc.wantEffects, effectKinds(d)); diff != "" {
		t.Errorf("effects (-want +got):\n%s", diff)
	}
	for _, m := range tc.wantMsg {
		if !strings.Contains(d.Message, m) {
			t.Errorf("message %q does not contain %q", d.Message, m)
		}
	}
	if tc.wantWarn != "" && !slices.ContainsFunc(d.Warnings, func(w string) bool { return strings.Contains(w, tc.wantWarn) }) {
		t.Errorf("warnings %q do not contain %q", d.Warnings, tc.wantWarn)
	}
	if !d.Allowed {
		if d.Patch != nil {
			t.Errorf("denial carries a patch %s", d.Patch)
		}
		wantReason := metav1.StatusReasonForbidden
		switch d.Code {
		case http.StatusInternalServerError:
			wantReason = metav1.StatusReasonInternalError
		case http.StatusBadRequest:
			wantReason = metav1.StatusReasonBadRequest
		}
		if d.Reason != wantReason {
			t.Errorf("reason %q, want %q", d.Reason, wantReason)
		}
	}
	if d.AuditAnnotations["decision"] != d.Outcome {
		t.Errorf("audit decision %q, want %q", d.AuditAnnotations["decision"], d.Outcome)
	}
}

const (
	eDetected = EffectDriftDetected
	eResolved = EffectDriftResolved
	eConsume  = EffectConsumeApproval
	ePhase    = EffectRecordPhase
	ePrune    = EffectPruneApprovals
	eCtrl     = EffectRecordController
)

func eff(k ...EffectKind) []EffectKind { return k }

// TestDetection covers the actor × parent state table and the
// controller identification (requester counted among updaters; single
// updater only without a controllers record; intersection; lenient).
func TestDetection(t *testing.T) {
	p := steadyParent()
	tests := []flowCase{
		// Actor × parent state.
		{name: "controller, gen != obsGen: expected", parent: steadyParent(gen(4)),
			wantAllowed: true, wantOutcome: OutcomeExpected, wantEffects: eff(eResolved)},
		{name: "controller, gen == obsGen: drift denied in enforce", parent: p,
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected),
			wantMsg: []string{ctrlUser, "Gadget ns/g", "Widget w", "generation 3", pfx + "approvals"}},
		{name: "controller, gen == obsGen: drift allowed with warning in log", parent: p, cfg: logMode(),
			wantAllowed: true, wantOutcome: OutcomeDriftLogged, wantEffects: eff(eDetected), wantWarn: "drift: " + ctrlUser},
		{name: "different actor (human), parent at rest: new origin", parent: p, user: human,
			wantAllowed: true, wantOutcome: OutcomeNewOrigin},
		{name: "different actor (HPA), parent reconciling: new origin", parent: steadyParent(gen(9)), user: hpaUser,
			wantAllowed: true, wantOutcome: OutcomeNewOrigin},

		// Identification.
		{name: "one updater, no controllers record: that updater is the controller",
			parent:   steadyParent(noAnn("controllers")),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "no updaters, no record: the requester alone is the single updater (late installation)",
			parent: steadyParent(noAnn("controllers")), user: human,
			old:      childOf(steadyParent(), noAnn("updaters")),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "two updaters, no record: lenient",
			parent:      steadyParent(noAnn("controllers")),
			old:         childOf(p, ann("updaters", hOther+","+hHuman)),
			wantAllowed: true, wantOutcome: OutcomeLenient},
		{name: "requester joins one other updater, no record: lenient",
			parent: steadyParent(noAnn("controllers")), user: human,
			wantAllowed: true, wantOutcome: OutcomeLenient},
		{name: "record present, single updater who is not a controller: intersection empty, new origin",
			parent: p, user: human, old: childOf(p, ann("updaters", hHuman)),
			wantAllowed: true, wantOutcome: OutcomeNewOrigin},
		{name: "record present, requester in it though the child lists others: intersection decides",
			parent:   steadyParent(ann("controllers", hOther+","+hCtrl)),
			old:      childOf(p, ann("updaters", hHuman+","+hOther)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "record present without the requester: new origin",
			parent:      steadyParent(ann("controllers", hOther)),
			wantAllowed: true, wantOutcome: OutcomeNewOrigin},
		{name: "garbage controllers record counts as none",
			parent:   steadyParent(ann("controllers", "NOT A HASH,,x")),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkFlow(t, tc, runFlow(t, tc)) })
	}
}

// TestResponseCodes has one case per row of the response-code table,
// plus the decisions on freeze, rejections and modes.
func TestResponseCodes(t *testing.T) {
	p := steadyParent()
	freeze := `{"user":"bob","message":"incident 42","at":"2026-03-01T10:00:00Z"}`
	tests := []flowCase{
		{name: "parent deleting (even frozen)", parent: steadyParent(deleting(), ann("freeze", freeze)),
			wantAllowed: true, wantOutcome: OutcomeDeleting},
		{name: "parent initializing (even frozen)", parent: initializingParent(ann("freeze", freeze)),
			wantAllowed: true, wantOutcome: OutcomeInitializing},
		{name: "parent frozen: 403 with user, reason and time", parent: steadyParent(ann("freeze", freeze)),
			wantCode: 403, wantOutcome: OutcomeFrozen, wantMsg: []string{"bob", "incident 42", "2026-03-01T10:00:00Z", "Widget w"}},
		{name: "parent frozen blocks a human too, in log mode", parent: steadyParent(ann("freeze", freeze)), user: human, cfg: logMode(),
			wantCode: 403, wantOutcome: OutcomeFrozen},
		{name: "parent frozen blocks an expected change", parent: steadyParent(gen(4), ann("freeze", freeze)),
			wantCode: 403, wantOutcome: OutcomeFrozen},
		{name: "legacy freeze true", parent: steadyParent(ann("freeze", "true")),
			wantCode: 403, wantOutcome: OutcomeFrozen, wantMsg: []string{"legacy"}},
		{name: "unparsable freeze is frozen", parent: steadyParent(ann("freeze", "{oops")),
			wantCode: 403, wantOutcome: OutcomeFrozen, wantMsg: []string{"unparsable"}},
		{name: "freeze false is not frozen", parent: steadyParent(ann("freeze", "false")),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "expected change (gen != obsGen)", parent: steadyParent(gen(4)),
			wantAllowed: true, wantOutcome: OutcomeExpected, wantEffects: eff(eResolved)},
		{name: "drift with valid approval", parent: steadyParent(ann("approvals", `[{"apiVersion":"example.com/v1","kind":"Gadget","name":"g","generation":3}]`)),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eConsume, eResolved)},
		{name: "drift rejected: 403 with reason", parent: steadyParent(ann("rejections", `[{"kind":"Gadget","name":"g","reason":"hands off"}]`)),
			wantCode: 403, wantOutcome: OutcomeRejected, wantMsg: []string{"hands off"}},
		{name: "drift rejected in log mode too", parent: steadyParent(ann("rejections", `[{"kind":"Gadget","name":"g","reason":"hands off"}]`)), cfg: logMode(),
			wantCode: 403, wantOutcome: OutcomeRejected},
		{name: "drift snoozed: callbacks suppressed, mutation still denied", parent: steadyParent(ann("snooze", `{"expiry":"2026-03-01T13:00:00Z","user":"bob"}`)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied},
		{name: "drift without approval in enforce", parent: p,
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "drift without approval in log", parent: p, cfg: logMode(),
			wantAllowed: true, wantOutcome: OutcomeDriftLogged, wantEffects: eff(eDetected), wantWarn: "drift"},
		{name: "no controller ownerReference", parent: p, old: childOf(p, ownedBy(p, false)),
			wantAllowed: true, wantOutcome: OutcomeNoOwner},
		{name: "no ownerReference at all", old: newObj("example.com/v1", "Gadget", "g", gen(1)),
			wantAllowed: true, wantOutcome: OutcomeNoOwner},
		{name: "parent not found", old: childOf(p),
			wantAllowed: true, wantOutcome: OutcomeParentGone},
		{name: "owner recreated with another uid is not the parent", parent: steadyParent(uid("other-uid")), old: childOf(p),
			wantAllowed: true, wantOutcome: OutcomeParentGone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkFlow(t, tc, runFlow(t, tc)) })
	}
}

// TestApprovalsAndRejections covers matching, modes, generations, order
// and hostile values.
func TestApprovalsAndRejections(t *testing.T) {
	withApprovals := func(v string, opts ...objOpt) *unstructured.Unstructured {
		return steadyParent(append([]objOpt{ann("approvals", v)}, opts...)...)
	}
	tests := []flowCase{
		{name: "rejection wins over a matching approval",
			parent:   withApprovals(`[{"kind":"Gadget","name":"g","mode":"always"}]`, ann("rejections", `[{"kind":"Gadget","name":"g","reason":"no"}]`)),
			wantCode: 403, wantOutcome: OutcomeRejected},
		{name: "rejection for another generation does not apply",
			parent:   steadyParent(ann("rejections", `[{"kind":"Gadget","name":"g","generation":2,"reason":"old"}]`)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "rejection for this generation applies",
			parent:   steadyParent(ann("rejections", `[{"kind":"Gadget","name":"g","generation":3,"reason":"now"}]`)),
			wantCode: 403, wantOutcome: OutcomeRejected, wantMsg: []string{"now"}},
		{name: "rejection with * name", parent: steadyParent(ann("rejections", `[{"kind":"Gadget","name":"*","reason":"all"}]`)),
			wantCode: 403, wantOutcome: OutcomeRejected},
		{name: "rejection without reason", parent: steadyParent(ann("rejections", `[{"kind":"Gadget","name":"g"}]`)),
			wantCode: 403, wantOutcome: OutcomeRejected, wantMsg: []string{"no reason given"}},
		{name: "rejections do not apply to a new origin", user: human,
			parent:      steadyParent(ann("rejections", `[{"kind":"Gadget","name":"g","reason":"no"}]`)),
			wantAllowed: true, wantOutcome: OutcomeNewOrigin},
		{name: "unparsable rejections are ignored with a warning", parent: steadyParent(ann("rejections", `nope`)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected), wantWarn: "ignoring " + pfx + "rejections"},
		{name: "once approval at the parent's generation is consumed",
			parent:      withApprovals(`[{"apiVersion":"example.com/v1","kind":"Gadget","name":"g","generation":3,"mode":"once"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eConsume, eResolved)},
		{name: "once approval for another generation is stale: drift, and pruned",
			parent:   withApprovals(`[{"kind":"Gadget","name":"g","generation":2}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(ePrune, eDetected)},
		{name: "once approval without a generation never matches",
			parent:   withApprovals(`[{"kind":"Gadget","name":"g"}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(ePrune, eDetected)},
		{name: "generation approval is not consumed",
			parent:      withApprovals(`[{"kind":"Gadget","name":"g","generation":3,"mode":"generation"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "generation approval for an older generation: drift, and pruned",
			parent:   withApprovals(`[{"kind":"Gadget","name":"g","generation":1,"mode":"generation"}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(ePrune, eDetected)},
		{name: "always approval ignores generations",
			parent:      withApprovals(`[{"kind":"Gadget","name":"g","generation":1,"mode":"always"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "* matches any name",
			parent:      withApprovals(`[{"kind":"Gadget","name":"*","mode":"always"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "* matches any kind",
			parent:      withApprovals(`[{"kind":"*","name":"g","mode":"always"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "* matches any apiVersion",
			parent:      withApprovals(`[{"apiVersion":"*","kind":"Gadget","name":"g","mode":"always"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "* in all three fields matches any child",
			parent:      withApprovals(`[{"apiVersion":"*","kind":"*","name":"*","mode":"always"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "a partial wildcard is a literal name",
			parent:   withApprovals(`[{"kind":"Gadget","name":"g*","mode":"always"},{"kind":"Gad*","name":"g","mode":"always"},{"kind":" *","name":"g","mode":"always"}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "rejection with * kind and apiVersion",
			parent:   withApprovals(`[{"kind":"Gadget","name":"g","mode":"always"}]`, ann("rejections", `[{"apiVersion":"*","kind":"*","name":"g","reason":"all kinds"}]`)),
			wantCode: 403, wantOutcome: OutcomeRejected, wantMsg: []string{"all kinds"}},
		{name: "rejection with a partial wildcard does not match",
			parent:   steadyParent(ann("rejections", `[{"kind":"*get","name":"*","reason":"no"}]`)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "another kind does not match",
			parent:   withApprovals(`[{"kind":"Gizmo","name":"*","mode":"always"}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "another name does not match",
			parent:   withApprovals(`[{"kind":"Gadget","name":"h","mode":"always"}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "another group does not match",
			parent:   withApprovals(`[{"apiVersion":"other.io/v1","kind":"Gadget","name":"g","mode":"always"}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "another version of the same group matches",
			parent:      withApprovals(`[{"apiVersion":"example.com/v2","kind":"Gadget","name":"g","mode":"always"}]`),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "unknown mode is ignored",
			parent:   withApprovals(`[{"kind":"Gadget","name":"g","generation":3,"mode":"forever"}]`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "unparsable approvals are ignored with a warning",
			parent:   withApprovals(`{"kind":"Gadget"}`),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected), wantWarn: "ignoring " + pfx + "approvals"},
		{name: "approved in log mode has no drift warning",
			parent: withApprovals(`[{"kind":"Gadget","name":"g","mode":"always"}]`), cfg: logMode(),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := runFlow(t, tc)
			checkFlow(t, tc, d)
			if d.Outcome == OutcomeApproved && len(d.Warnings) != 0 {
				t.Errorf("approved with warnings %q", d.Warnings)
			}
		})
	}

	t.Run("consumed approval names the entry and the child", func(t *testing.T) {
		d := runFlow(t, flowCase{parent: withApprovals(`[{"kind":"Gadget","name":"g","generation":3}]`)})
		want := Approval{Kind: "Gadget", Name: "g", Generation: 3, Mode: ApprovalOnce}
		e := d.Effects[0]
		if e.Kind != EffectConsumeApproval || e.Approval == nil || *e.Approval != want || e.Child == nil || e.Child.Name != "g" || e.Parent.Name != "w" {
			t.Fatalf("consume effect = %+v, want approval %+v for child g of w", e, want)
		}
	})
}

// TestSnooze: callbacks (both phases) are suppressed until expiry; the
// mutation follows the normal rules.
func TestSnooze(t *testing.T) {
	tests := []flowCase{
		{name: "active JSON snooze suppresses Detected", parent: steadyParent(ann("snooze", `{"expiry":"2026-03-01T12:00:01Z"}`)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied},
		{name: "active bare RFC 3339 snooze", parent: steadyParent(ann("snooze", "2026-03-02T00:00:00Z")), cfg: logMode(),
			wantAllowed: true, wantOutcome: OutcomeDriftLogged, wantWarn: "drift"},
		{name: "expired snooze", parent: steadyParent(ann("snooze", `{"expiry":"2026-03-01T12:00:00Z"}`)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "unparsable snooze is not a snooze", parent: steadyParent(ann("snooze", "tomorrow")),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "active snooze suppresses Resolved of an approval",
			parent:      steadyParent(ann("snooze", "2026-03-02T00:00:00Z"), ann("approvals", `[{"kind":"Gadget","name":"g","mode":"always"}]`)),
			wantAllowed: true, wantOutcome: OutcomeApproved},
		{name: "active snooze suppresses Resolved of an expected change",
			parent:      steadyParent(gen(4), ann("snooze", "2026-03-02T00:00:00Z")),
			wantAllowed: true, wantOutcome: OutcomeExpected},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkFlow(t, tc, runFlow(t, tc)) })
	}
}

// TestMode: drift.mode, overridden by the namespace, overridden by the
// parent.
func TestMode(t *testing.T) {
	ns := func(mode string) *unstructured.Unstructured {
		u := newObj("v1", "Namespace", "ns")
		delete(md(u), "namespace")
		return with(u, ann("mode", mode))
	}
	denied := func(name string, cfg Config, nsObj, parent *unstructured.Unstructured) flowCase {
		return flowCase{name: name, cfg: cfg, namespace: nsObj, parent: parent, wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)}
	}
	logged := func(name string, cfg Config, nsObj, parent *unstructured.Unstructured) flowCase {
		return flowCase{name: name, cfg: cfg, namespace: nsObj, parent: parent, wantAllowed: true, wantOutcome: OutcomeDriftLogged, wantEffects: eff(eDetected), wantWarn: "drift"}
	}
	tests := []flowCase{
		logged("config log", logMode(), nil, steadyParent()),
		denied("config enforce", enforce(), nil, steadyParent()),
		logged("empty config mode is log", Config{AnnotationPrefix: "policyd.io"}, nil, steadyParent()),
		denied("namespace enforce over config log", logMode(), ns("enforce"), steadyParent()),
		logged("namespace log over config enforce", enforce(), ns("log"), steadyParent()),
		logged("parent log over namespace enforce", enforce(), ns("enforce"), steadyParent(ann("mode", "log"))),
		denied("parent enforce over namespace log", logMode(), ns("log"), steadyParent(ann("mode", "enforce"))),
		denied("invalid parent mode falls back to the namespace", logMode(), ns("enforce"), steadyParent(ann("mode", "strict"))),
		logged("invalid namespace mode falls back to config", logMode(), ns("ENFORCE"), steadyParent()),
	}
	// The object's own annotation (as stored: the old object's) comes first.
	child := func(mode string) *unstructured.Unstructured { return childOf(steadyParent(), ann("mode", mode)) }
	for _, tc := range []struct {
		name  string
		cfg   Config
		ns    *unstructured.Unstructured
		p     *unstructured.Unstructured
		child *unstructured.Unstructured
		log   bool
	}{
		{"object log over namespace enforce", logMode(), ns("enforce"), steadyParent(), child("log"), true},
		{"object enforce over namespace log", logMode(), ns("log"), steadyParent(), child("enforce"), false},
		{"object log over parent enforce", enforce(), nil, steadyParent(ann("mode", "enforce")), child("log"), true},
		{"object enforce over parent log and config log", logMode(), nil, steadyParent(ann("mode", "log")), child("enforce"), false},
		{"invalid object mode falls back to the parent", logMode(), nil, steadyParent(ann("mode", "enforce")), child("off"), false},
	} {
		c := denied(tc.name, tc.cfg, tc.ns, tc.p)
		if tc.log {
			c = logged(tc.name, tc.cfg, tc.ns, tc.p)
		}
		c.old = tc.child
		tests = append(tests, c)
	}
	// A controller's new object may carry another mode (a copy of its
	// parent's): the stored one decides.
	tests = append(tests, flowCase{name: "the new object's mode is not read", cfg: enforce(), parent: steadyParent(),
		new:      with(childOf(steadyParent()), ann("mode", "log"), specField("replicas", int64(2))),
		wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := runFlow(t, tc)
			checkFlow(t, tc, d)
			want := ModeEnforce
			if tc.wantAllowed {
				want = ModeLog
			}
			if d.AuditAnnotations["mode"] != want {
				t.Errorf("audit mode %q, want %q", d.AuditAnnotations["mode"], want)
			}
		})
	}
}

// TestOperations is the operations-by-type table against the
// lifecycle phases.
func TestOperations(t *testing.T) {
	initializing := initializingParent()
	p := steadyParent()
	newChild := func(parent *unstructured.Unstructured) *unstructured.Unstructured {
		return childOf(parent, noAnn("updaters"), gen(0))
	}
	tests := []flowCase{
		{name: "CREATE while initializing", op: admissionv1.Create, parent: initializing, new: newChild(initializing),
			wantAllowed: true, wantOutcome: OutcomeInitializing},
		{name: "CREATE during drift", op: admissionv1.Create, parent: p, new: newChild(p),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "CREATE while reconciling", op: admissionv1.Create, parent: steadyParent(gen(4)), new: newChild(p),
			wantAllowed: true, wantOutcome: OutcomeExpected, wantEffects: eff(eResolved)},
		{name: "CREATE by the controller when the record does not list it", op: admissionv1.Create,
			parent: steadyParent(ann("controllers", hOther)), new: newChild(p),
			wantAllowed: true, wantOutcome: OutcomeNewOrigin},
		{name: "CREATE with copied updaters still identifies by the requester", op: admissionv1.Create,
			parent: steadyParent(noAnn("controllers")), new: childOf(p, ann("updaters", hOther+","+hHuman)),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "UPDATE during drift", parent: p,
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "UPDATE while initializing", parent: initializing,
			wantAllowed: true, wantOutcome: OutcomeInitializing},
		{name: "UPDATE while deleting", parent: steadyParent(deleting()),
			wantAllowed: true, wantOutcome: OutcomeDeleting},
		{name: "DELETE during drift", op: admissionv1.Delete, parent: p,
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)},
		{name: "DELETE during drift, approved", op: admissionv1.Delete, parent: steadyParent(ann("approvals", `[{"kind":"Gadget","name":"g","mode":"always"}]`)),
			wantAllowed: true, wantOutcome: OutcomeApproved, wantEffects: eff(eResolved)},
		{name: "DELETE while reconciling resolves", op: admissionv1.Delete, parent: steadyParent(gen(4)),
			wantAllowed: true, wantOutcome: OutcomeExpected, wantEffects: eff(eResolved)},
		{name: "DELETE by a human resolves", op: admissionv1.Delete, parent: p, user: human,
			wantAllowed: true, wantOutcome: OutcomeNewOrigin, wantEffects: eff(eResolved)},
		{name: "DELETE while the parent is deleting (garbage collection)", op: admissionv1.Delete, parent: steadyParent(deleting()),
			wantAllowed: true, wantOutcome: OutcomeDeleting, wantEffects: eff(eResolved)},
		{name: "DELETE while initializing", op: admissionv1.Delete, parent: initializing,
			wantAllowed: true, wantOutcome: OutcomeInitializing, wantEffects: eff(eResolved)},
		{name: "CONNECT is ignored", op: admissionv1.Connect, parent: p,
			wantAllowed: true, wantOutcome: OutcomeIgnored},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := runFlow(t, tc)
			checkFlow(t, tc, d)
			if tc.op == admissionv1.Delete && d.Patch != nil {
				t.Errorf("DELETE carries a patch %s", d.Patch)
			}
		})
	}
}

// TestSpecOnly: metadata-only changes skip detection; status updates only
// record the controller; other subresources are not examined; dry runs
// decide the same with no effects.
func TestSpecOnly(t *testing.T) {
	p := steadyParent()
	child := childOf(p)
	t.Run("metadata-only change by the controller during drift", func(t *testing.T) {
		tc := flowCase{parent: p, old: child, new: with(child, ann("example.com/label", "x")),
			wantAllowed: true, wantOutcome: OutcomeMetadataOnly}
		d := runFlow(t, tc)
		checkFlow(t, tc, d)
		got := applied(t, tc.new, d)
		if diff := cmp.Diff(ours(child), ours(got)); diff != "" {
			t.Errorf("our annotations changed (-old +got):\n%s", diff)
		}
		if got.GetAnnotations()["example.com/label"] != "x" {
			t.Errorf("the change itself was lost: %v", got.GetAnnotations())
		}
	})
	t.Run("a status change alone is not a spec change", func(t *testing.T) {
		tc := flowCase{parent: p, old: child, new: with(child, statusField("x", int64(1))),
			wantAllowed: true, wantOutcome: OutcomeMetadataOnly}
		checkFlow(t, tc, runFlow(t, tc))
	})
	t.Run("spec-less kind: data change is a spec change", func(t *testing.T) {
		cm := newObj("v1", "ConfigMap", "cm", ownedBy(p, true), ann("updaters", hCtrl), func(u *unstructured.Unstructured) { u.Object["data"] = map[string]any{"k": "v"} })
		tc := flowCase{parent: p, old: cm, new: with(cm, func(u *unstructured.Unstructured) { u.Object["data"] = map[string]any{"k": "w"} }),
			wantCode: 403, wantOutcome: OutcomeDriftDenied, wantEffects: eff(eDetected)}
		d := runFlow(t, tc)
		checkFlow(t, tc, d)
		if got := d.Effects[0].Diff; !slices.Equal(got, []string{"data.k"}) {
			t.Errorf("diff %q, want [data.k]", got)
		}
	})
	t.Run("status update records the controller", func(t *testing.T) {
		oldP := steadyParent(noAnn("controllers"))
		newP := with(oldP, statusField("observedGeneration", int64(3)), ann("trace", "clobbered"))
		req := request(admissionv1.Update, otherUser, oldP, newP)
		req.SubResource = "status"
		d := Decide(Input{Request: req, Old: oldP, New: newP, Now: now, Config: enforce()})
		checkFlow(t, flowCase{wantAllowed: true, wantOutcome: OutcomeStatusRecorded, wantEffects: eff(eCtrl)}, d)
		got := ours(applied(t, newP, d))
		if got["controllers"] != hOther {
			t.Errorf("controllers = %q, want %q", got["controllers"], hOther)
		}
		if _, ok := got["trace"]; ok {
			t.Errorf("status update changed trace: %q", got["trace"])
		}
		if e := d.Effects[0]; e.UserHash != hOther || e.Parent.Name != "w" || e.Parent.UID != "w-uid" {
			t.Errorf("effect %+v, want hash %s on w", e, hOther)
		}
	})
	t.Run("status update by a recorded controller records nothing new but the phase", func(t *testing.T) {
		oldP := initializingParent()
		newP := steadyParent(noAnn("phase"))
		req := request(admissionv1.Update, ctrlUser, oldP, newP)
		req.SubResource = "status"
		d := Decide(Input{Request: req, Old: oldP, New: newP, Now: now, Config: enforce()})
		checkFlow(t, flowCase{wantAllowed: true, wantOutcome: OutcomeStatusRecorded, wantEffects: eff(ePhase)}, d)
		if d.Effects[0].Phase != PhaseInitialized {
			t.Errorf("phase effect %+v", d.Effects[0])
		}
	})
	t.Run("status update keeps at most 5 controllers, oldest dropped", func(t *testing.T) {
		five := "aaaaa,bbbbb,ccccc,ddddd,eeeee"
		oldP := steadyParent(ann("controllers", five), ann("phase", PhaseInitialized))
		req := request(admissionv1.Update, ctrlUser, oldP, oldP)
		req.SubResource = "status"
		d := Decide(Input{Request: req, Old: oldP, New: oldP, Now: now, Config: enforce()})
		if got, want := ours(applied(t, oldP, d))["controllers"], "bbbbb,ccccc,ddddd,eeeee,"+hCtrl; got != want {
			t.Errorf("controllers = %q, want %q", got, want)
		}
	})
	t.Run("scale subresource is not examined", func(t *testing.T) {
		req := request(admissionv1.Update, hpaUser, child, with(child, specField("replicas", int64(9))))
		req.SubResource = "scale"
		d := Decide(Input{Request: req, Old: child, New: child, Parent: p, Now: now, Config: enforce()})
		checkFlow(t, flowCase{wantAllowed: true, wantOutcome: OutcomeIgnored}, d)
	})
	t.Run("dry run: same decision, no effects", func(t *testing.T) {
		for _, tc := range []flowCase{
			{parent: p, dryRun: true, wantCode: 403, wantOutcome: OutcomeDriftDenied},
			{parent: steadyParent(ann("approvals", `[{"kind":"Gadget","name":"g","generation":3}]`)), dryRun: true, wantAllowed: true, wantOutcome: OutcomeApproved},
		} {
			checkFlow(t, tc, runFlow(t, tc))
		}
	})
	t.Run("no request", func(t *testing.T) {
		d := Decide(Input{})
		checkFlow(t, flowCase{wantCode: 400, wantOutcome: OutcomeBadRequest}, d)
	})
	t.Run("UPDATE without oldObject", func(t *testing.T) {
		req := request(admissionv1.Update, ctrlUser, nil, child)
		d := Decide(Input{Request: req, New: child, Parent: p, Now: now, Config: enforce()})
		checkFlow(t, flowCase{wantCode: 400, wantOutcome: OutcomeBadRequest}, d)
	})
	t.Run("DELETE without oldObject is not examined", func(t *testing.T) {
		req := request(admissionv1.Delete, ctrlUser, child, nil)
		d := Decide(Input{Request: req, Parent: p, Now: now, Config: enforce()})
		checkFlow(t, flowCase{wantAllowed: true, wantOutcome: OutcomeIgnored}, d)
	})
	t.Run("CREATE without object", func(t *testing.T) {
		req := request(admissionv1.Create, ctrlUser, child, nil)
		d := Decide(Input{Request: req, Parent: p, Now: now, Config: enforce()})
		checkFlow(t, flowCase{wantCode: 400, wantOutcome: OutcomeBadRequest}, d)
	})
}

// TestLazyPhaseRecord: a child request that finds the parent initialized
// without the annotation asks the leader to store it, once it is there it
// stops asking.
func TestLazyPhaseRecord(t *testing.T) {
	tc := flowCase{parent: steadyParent(gen(4), noAnn("phase")), wantAllowed: true, wantOutcome: OutcomeExpected, wantEffects: eff(ePhase, eResolved)}
	d := runFlow(t, tc)
	checkFlow(t, tc, d)
	if e := d.Effects[0]; e.Phase != PhaseInitialized || e.Parent.Name != "w" || e.Parent.LifecyclePhase != PhaseInitialized {
		t.Errorf("phase effect %+v", e)
	}
	tc.parent = steadyParent(gen(4))
	tc.wantEffects = eff(eResolved)
	checkFlow(t, tc, runFlow(t, tc))
}
