package admission

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Outcomes label decisions in metrics, logs and the decision audit
// annotation. The set is closed so metric cardinality stays bounded.
const (
	OutcomeBadRequest     = "bad-request"
	OutcomeIgnored        = "ignored"
	OutcomeStatusRecorded = "status-recorded"
	OutcomeMetadataOnly   = "metadata-only"
	OutcomeNoOwner        = "no-owner"
	OutcomeParentGone     = "parent-not-found"
	OutcomeParentError    = "parent-error"
	OutcomeDeleting       = "parent-deleting"
	OutcomeInitializing   = "parent-initializing"
	OutcomeFrozen         = "frozen"
	OutcomeLenient        = "controller-unknown"
	OutcomeNewOrigin      = "new-origin"
	OutcomeExpected       = "expected"
	OutcomeRejected       = "rejected"
	OutcomeApproved       = "approved"
)

// Decide is the whole admission decision for one request. It is
// pure: everything it needs is in Input, and its side effects are returned
// as Effects for the leader.
func Decide(in Input) Decision {
	req := in.Request
	var out Decision
	if req == nil {
		out = denied(OutcomeBadRequest, http.StatusBadRequest, metav1.StatusReasonBadRequest, "admission review has no request")
	} else {
		d := &decider{in: in, cfg: in.Config.normalized(), req: req, hash: UserHash(req.UserInfo.Username)}
		out = d.decide()
	}
	if out.AuditAnnotations == nil {
		out.AuditAnnotations = map[string]string{}
	}
	out.AuditAnnotations["decision"] = out.Outcome
	if req != nil && req.DryRun != nil && *req.DryRun {
		out.Effects = nil
	}
	return out
}

func (c Config) normalized() Config {
	c.AnnotationPrefix = c.prefix()
	if c.Mode != ModeEnforce {
		c.Mode = ModeLog
	}
	return c
}

type decider struct {
	in   Input
	cfg  Config
	req  *admissionv1.AdmissionRequest
	hash string

	obj   *unstructured.Unstructured // New, or Old for DELETE
	child ObjectRef
}

func (d *decider) decide() Decision {
	switch d.req.Operation {
	case admissionv1.Create, admissionv1.Update, admissionv1.Delete:
	default:
		return allowed(OutcomeIgnored)
	}
	if d.req.SubResource == "status" {
		if d.req.Operation != admissionv1.Update || d.in.New == nil {
			return allowed(OutcomeIgnored)
		}
		return d.statusUpdate()
	}
	if d.req.SubResource != "" {
		return allowed(OutcomeIgnored) // scale, eviction, ...: not the object's own write
	}
	d.obj = d.in.New
	if d.req.Operation == admissionv1.Delete {
		d.obj = d.in.Old
	}
	if d.obj == nil && d.req.Operation == admissionv1.Delete {
		return allowed(OutcomeIgnored) // API servers before 1.15 send no oldObject: nothing to judge
	}
	if d.obj == nil {
		return denied(OutcomeBadRequest, http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("%s request has no object", d.req.Operation))
	}
	d.child = d.objectRef(d.obj)
	return d.childRequest()
}

// statusUpdate records the requester as one of the object's controllers:
// synchronously through the patch (which the API server may reset, as it
// resets metadata on most status updates) and as an Effect, the leader's
// backup. It also records the phase when the object just became
// initialized. Status updates are never drift.
func (d *decider) statusUpdate() Decision {
	out := allowed(OutcomeStatusRecorded)
	oldAnn := annotationsOf(d.in.Old)
	newAnn := d.in.New.GetAnnotations()
	want := d.cfg.computeAnnotationsForStatusUpdate(oldAnn, newAnn, d.hash)
	out.Patch = annotationPatch(d.in.New, want)
	self := d.objectRef(d.in.New)
	self.LifecyclePhase = d.cfg.Phase(d.in.New)
	if !slices.Contains(ParseHashes(oldAnn[d.cfg.key(annControllers)]), d.hash) {
		out.Effects = append(out.Effects, Effect{Kind: EffectRecordController, Parent: self, UserHash: d.hash, At: d.in.Now})
	}
	if self.LifecyclePhase == PhaseInitialized && oldAnn[d.cfg.key(annPhase)] != PhaseInitialized {
		out.Effects = append(out.Effects, Effect{Kind: EffectRecordPhase, Parent: self, Phase: PhaseInitialized, At: d.in.Now})
	}
	out.AuditAnnotations = map[string]string{"user-hash": d.hash}
	return out
}

// childRequest is a CREATE, UPDATE or DELETE of the object itself: judge
// it, then compute the object's annotations for an allowed CREATE/UPDATE.
func (d *decider) childRequest() Decision {
	op := d.req.Operation
	if op == admissionv1.Update && d.in.Old == nil {
		return denied(OutcomeBadRequest, http.StatusBadRequest, metav1.StatusReasonBadRequest, "UPDATE request has no oldObject")
	}
	oldSpec, newSpec := specOf(d.in.Old, d.in.New)
	specChanged := op != admissionv1.Update || !reflect.DeepEqual(oldSpec, newSpec)

	ref := controllerRef(d.obj)
	parent := d.in.Parent
	if ref == nil || (parent != nil && ref.UID != "" && parent.GetUID() != "" && parent.GetUID() != ref.UID) {
		parent = nil // no owner; or it was deleted and recreated, so this child is an orphan
	}
	// Who is acting: the controller (the user who updates both the parent's
	// status and this child's spec), someone else, or unknown.
	role := roleUser
	var parentAnn map[string]string
	if parent != nil {
		parentAnn = parent.GetAnnotations()
		role = d.identify(parentAnn)
	}

	var out judgement
	switch {
	case !specChanged:
		out.Decision = allowed(OutcomeMetadataOnly)
	case ref == nil:
		out.Decision = allowed(OutcomeNoOwner)
	case parent == nil:
		out.Decision = allowed(OutcomeParentGone)
	default:
		out = d.judge(parent, parentAnn, role, oldSpec, newSpec)
	}
	if op == admissionv1.Delete || !out.Allowed {
		return out.Decision // nothing to patch on a DELETE or a denial
	}

	annController := role == roleController
	hop := d.childHop()
	hop.Approval, hop.Drift = out.approval, out.Outcome == OutcomeDriftLogged
	var trace []json.RawMessage
	if annController {
		trace = parentTrace(d.cfg, parent)
	}
	oldAnn, newAnn := annotationsOf(d.in.Old), annotationsOf(d.in.New)
	want := d.annotations(op, oldAnn, newAnn, parentAnn, annController, specChanged)
	if op == admissionv1.Create || specChanged {
		// The object's own hop: its labels are the trace-<key> annotations
		// it will hold, so a controller's copies of its parent's are not
		// inherited (the compute functions dropped them).
		var ignored []string
		hop.Labels, ignored = d.cfg.traceLabels(want)
		want[d.cfg.key(annTrace)] = formatTrace(extendTrace(trace, hop))
		out.Warnings = append(out.Warnings, ignored...)
	}
	out.Patch = annotationPatch(d.in.New, want)
	return out.Decision
}

// judgement is a Decision plus the approval mode that allowed a drift.
type judgement struct {
	Decision
	approval string
}

// judge runs the admission flow for a spec change of a child whose
// parent is known: short-circuits, freeze, actor, generation, then the drift
// case's rejections, approvals, snooze and mode.
func (d *decider) judge(parent *unstructured.Unstructured, parentAnn map[string]string, role role, oldSpec, newSpec map[string]any) judgement {
	op := d.req.Operation
	pref := d.objectRef(parent)
	pref.LifecyclePhase = d.cfg.Phase(parent)
	gen, obsGen := pref.Generation, pref.ObservedGeneration
	audit := map[string]string{
		"parent":    fmt.Sprintf("%s/%s/%s", parent.GetKind(), parent.GetNamespace(), parent.GetName()),
		"actor":     role.String(),
		"user-hash": d.hash,
		"phase":     pref.LifecyclePhase,
	}
	snoozed := d.snoozed(parentAnn)
	var effects []Effect
	resolved := func(how string) {
		if !snoozed {
			e := d.driftEffect(EffectDriftResolved, pref, oldSpec, newSpec)
			e.Resolution = how
			if how == ResolvedApproved {
				e = d.withObjects(e, oldSpec, newSpec)
				e.Occurrence = ApprovedOccurrence(pref, d.child, specVersion(d.in.Old), oldSpec, newSpec)
			}
			effects = append(effects, e)
		}
	}
	// The lazy phase record: the phase is computed anyway, so ask the
	// leader to store it the first time it is initialized.
	if pref.LifecyclePhase == PhaseInitialized && parentAnn[d.cfg.key(annPhase)] != PhaseInitialized {
		effects = append(effects, Effect{Kind: EffectRecordPhase, Parent: pref, Phase: PhaseInitialized, At: d.in.Now})
	}
	if hasStaleApprovals(parentAnn[d.cfg.key(annApprovals)], gen) {
		effects = append(effects, Effect{Kind: EffectPruneApprovals, Parent: pref, At: d.in.Now})
	}
	result := func(dec Decision, warnings []string) judgement {
		dec.Warnings = append(warnings, dec.Warnings...)
		dec.AuditAnnotations = audit
		dec.Effects = effects
		return judgement{Decision: dec}
	}
	allow := func(outcome string) judgement {
		if op == admissionv1.Delete {
			resolved(ResolvedChildDeleted) // a deleted child has no drift left
		}
		return result(allowed(outcome), nil)
	}

	switch pref.LifecyclePhase {
	case PhaseDeleting:
		return allow(OutcomeDeleting)
	case PhaseInitializing:
		return allow(OutcomeInitializing)
	}
	if v, ok := parentAnn[d.cfg.key(annFreeze)]; ok {
		if f, frozen := ParseFreeze(v); frozen {
			return result(denied(OutcomeFrozen, http.StatusForbidden, metav1.StatusReasonForbidden,
				fmt.Sprintf("%s %s is %s", parent.GetKind(), parent.GetName(), f)), nil)
		}
	}
	switch role {
	case roleUnknown:
		return allow(OutcomeLenient)
	case roleUser:
		return allow(OutcomeNewOrigin)
	}
	if gen != obsGen {
		// The parent's spec changed and its controller is reconciling: any
		// drift of this child is over.
		if op != admissionv1.Delete {
			resolved(ResolvedParentChanged)
		}
		return allow(OutcomeExpected)
	}

	// Drift: the controller changes the child while the parent is unchanged.
	mode := d.mode(annotationsOf(d.in.Old), parentAnn)
	audit["mode"] = mode
	var warnings []string
	if v, ok := parentAnn[d.cfg.key(annRejections)]; ok {
		rs, err := ParseRejections(v)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("ignoring %s on %s %s: %v", d.cfg.key(annRejections), parent.GetKind(), parent.GetName(), err))
		}
		for _, r := range rs {
			if r.validAt(gen) && matchesChild(r.APIVersion, r.Kind, r.Name, d.child) {
				reason := r.Reason
				if reason == "" {
					reason = "no reason given"
				}
				return result(denied(OutcomeRejected, http.StatusForbidden, metav1.StatusReasonForbidden,
					fmt.Sprintf("drift of %s %s rejected by %s %s: %s", d.child.Kind, d.child.Name, parent.GetKind(), parent.GetName(), reason)), warnings)
			}
		}
	}
	if v, ok := parentAnn[d.cfg.key(annApprovals)]; ok {
		as, err := ParseApprovals(v)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("ignoring %s on %s %s: %v", d.cfg.key(annApprovals), parent.GetKind(), parent.GetName(), err))
		}
		for _, a := range as {
			if !a.validAt(gen) || !matchesChild(a.APIVersion, a.Kind, a.Name, d.child) {
				continue
			}
			if a.Mode == ApprovalOnce {
				child := d.child
				effects = append(effects, Effect{Kind: EffectConsumeApproval, Parent: pref, Child: &child, Approval: &a, At: d.in.Now})
			}
			resolved(ResolvedApproved)
			audit["approval"] = a.Mode
			j := result(allowed(OutcomeApproved), warnings)
			j.approval = a.Mode
			return j
		}
	}
	if !snoozed {
		effects = append(effects, d.withObjects(d.driftEffect(EffectDriftDetected, pref, oldSpec, newSpec), oldSpec, newSpec))
	}
	msg := fmt.Sprintf("drift: %s %s %s %s/%s while %s %s is unchanged (generation %d == observedGeneration); approve it with the %s annotation on the %s",
		d.req.UserInfo.Username, strings.ToLower(string(op)), d.child.Kind, d.child.Namespace, d.child.Name,
		parent.GetKind(), parent.GetName(), gen, d.cfg.key(annApprovals), parent.GetKind())
	if mode == ModeEnforce {
		return result(denied(OutcomeDriftDenied, http.StatusForbidden, metav1.StatusReasonForbidden, msg), warnings)
	}
	dec := allowed(OutcomeDriftLogged)
	dec.Warnings = []string{msg}
	return result(dec, warnings)
}

type role int

const (
	roleUser role = iota
	roleController
	roleUnknown
)

func (r role) String() string {
	switch r {
	case roleController:
		return "controller"
	case roleUnknown:
		return "unknown"
	}
	return "user"
}

// identify is the controller identification of docs/drift.md. The requester is
// counted among the child's updaters first; with a controllers record on
// the parent the intersection decides; without one a single updater is the
// controller (late installation); otherwise we cannot tell.
func (d *decider) identify(parentAnn map[string]string) role {
	var updaters []string
	if d.req.Operation != admissionv1.Create { // a CREATE's copied updaters are wiped
		updaters = ParseHashes(annotationsOf(d.in.Old)[d.cfg.key(annUpdaters)])
	}
	updaters = AddHash(updaters, d.hash)
	if controllers := ParseHashes(parentAnn[d.cfg.key(annControllers)]); len(controllers) > 0 {
		if slices.Contains(controllers, d.hash) { // the intersection, as the requester is in updaters
			return roleController
		}
		return roleUser
	}
	if len(updaters) == 1 {
		return roleController
	}
	return roleUnknown
}

// annotations computes the child's new annotations with the compute
// function for the request; the caller adds the trace when it is
// recomputed (CREATE, spec change).
func (d *decider) annotations(op admissionv1.Operation, oldAnn, newAnn, parentAnn map[string]string, controller, specChanged bool) map[string]string {
	c := d.cfg
	if op == admissionv1.Create {
		return c.computeAnnotationsForCreate(newAnn, parentAnn, controller, []string{d.hash})
	}
	updaters := AddHash(ParseHashes(oldAnn[c.key(annUpdaters)]), d.hash)
	var out map[string]string
	if controller {
		out = c.computeAnnotationsForController(oldAnn, newAnn, specChanged, updaters)
	} else {
		out = c.computeAnnotationsForUser(oldAnn, newAnn, parentAnn, specChanged, updaters)
	}
	// The object's own spec changed, so its generation moves on: approvals
	// it carries for its children that name another generation are stale.
	if v, ok := out[c.key(annApprovals)]; ok && specChanged {
		if pruned, changed := pruneApprovals(v, generation(d.in.Old)+1); changed {
			out[c.key(annApprovals)] = pruned
		}
	}
	return out
}

// mode is the drift mode: the object's own annotation as stored (objAnn,
// the old object's), else the parent's, else the namespace's, else the
// configured default. Invalid values are ignored.
func (d *decider) mode(objAnn, parentAnn map[string]string) string {
	for _, ann := range []map[string]string{objAnn, parentAnn, annotationsOf(d.in.Namespace)} {
		if m := ann[d.cfg.key(annMode)]; m == ModeEnforce || m == ModeLog {
			return m
		}
	}
	return d.cfg.Mode
}

func (d *decider) snoozed(parentAnn map[string]string) bool {
	v, ok := parentAnn[d.cfg.key(annSnooze)]
	if !ok {
		return false
	}
	s, ok := ParseSnooze(v)
	return ok && d.in.Now.Before(s.Expiry)
}

// childHop is this request's step in the trace.
func (d *decider) childHop() Hop {
	gen := int64(1)
	if d.req.Operation != admissionv1.Create {
		// Mutating admission runs before the API server bumps generation.
		gen = generation(d.in.Old) + 1
	}
	name := d.obj.GetName()
	if name == "" {
		name = d.obj.GetGenerateName()
	}
	return Hop{
		APIVersion: d.child.APIVersion, Kind: d.child.Kind, Name: name, Generation: gen,
		User: d.req.UserInfo.Username, Timestamp: d.in.Now.UTC().Format(time.RFC3339),
	}
}

// parentTrace is the parent's trace, its hops copied whole, or a one-hop
// origin for the parent when it has none that parses (it predates the
// webhook, or it is not intercepted).
func parentTrace(c Config, parent *unstructured.Unstructured) []json.RawMessage {
	if parent == nil {
		return nil
	}
	if hops, err := rawTrace(parent.GetAnnotations()[c.key(annTrace)]); err == nil && len(hops) > 0 {
		return hops
	}
	return []json.RawMessage{marshalHop(Hop{APIVersion: parent.GetAPIVersion(), Kind: parent.GetKind(), Name: parent.GetName(), Generation: generation(parent)})}
}

func (d *decider) objectRef(o *unstructured.Unstructured) ObjectRef {
	ref := ObjectRef{
		APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Namespace: o.GetNamespace(), Name: o.GetName(),
		UID: string(o.GetUID()), ResourceVersion: o.GetResourceVersion(),
		Generation: generation(o), ObservedGeneration: observedGeneration(o),
	}
	if o == d.obj {
		// The request is authoritative for the child: a CREATE may carry
		// no namespace or name (generateName) in the object.
		if ref.APIVersion == "" {
			ref.APIVersion = metav1.GroupVersion{Group: d.req.Kind.Group, Version: d.req.Kind.Version}.String()
		}
		if ref.Kind == "" {
			ref.Kind = d.req.Kind.Kind
		}
		if ref.Namespace == "" {
			ref.Namespace = d.req.Namespace
		}
		if ref.Name == "" {
			ref.Name = d.req.Name
		}
	}
	return ref
}

// withObjects adds what a receiver needs to judge the change: both objects
// and the diff. Detected and approved Resolved reports carry them; the
// other Resolved candidates come with every expected change, and most are
// dropped by the server.
func (d *decider) withObjects(e Effect, oldSpec, newSpec map[string]any) Effect {
	e.OldObject, e.NewObject = reportObject(d.in.Old), reportObject(d.in.New)
	e.Diff = diffPaths(oldSpec, newSpec)
	return e
}

// reportObject is an object as a report carries it: without managedFields,
// which are large and say nothing about the drift.
func reportObject(o *unstructured.Unstructured) json.RawMessage {
	if o == nil {
		return nil
	}
	// Shallow copies suffice to drop one key without touching the request.
	obj := maps.Clone(o.Object)
	if md, ok := obj["metadata"].(map[string]any); ok {
		md = maps.Clone(md)
		delete(md, "managedFields")
		obj["metadata"] = md
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil
	}
	return b
}

func hasStaleApprovals(value string, gen int64) bool {
	if value == "" {
		return false
	}
	_, changed := pruneApprovals(value, gen)
	return changed
}

// controllerRef is the ownerReference with controller: true, if any.
func controllerRef(o *unstructured.Unstructured) *metav1.OwnerReference {
	for _, r := range o.GetOwnerReferences() {
		if r.Controller != nil && *r.Controller {
			return &r
		}
	}
	return nil
}

func annotationsOf(o *unstructured.Unstructured) map[string]string {
	if o == nil {
		return nil
	}
	return o.GetAnnotations()
}

// specVersion names the version of an object's spec: its generation, or
// its resourceVersion for kinds without one ("" when there is no object).
func specVersion(o *unstructured.Unstructured) string {
	if o == nil {
		return ""
	}
	if g := generation(o); g != 0 {
		return "generation " + strconv.FormatInt(g, 10)
	}
	return "resourceVersion " + o.GetResourceVersion()
}

func generation(o *unstructured.Unstructured) int64 {
	if o == nil {
		return 0
	}
	v, _ := nestedInt(o.Object, "metadata", "generation")
	return v
}

func allowed(outcome string) Decision {
	return Decision{Allowed: true, Outcome: outcome}
}

func denied(outcome string, code int32, reason metav1.StatusReason, msg string) Decision {
	return Decision{Allowed: false, Code: code, Reason: reason, Message: msg, Outcome: outcome}
}
