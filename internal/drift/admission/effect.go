package admission

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// DetectedID is the id of a Detected report: SHA-256 of the parent ref, the
// child ref and the spec change (both specs, canonical JSON), cut to 16 hex
// characters. Every replica that sees the same drift computes the same id,
// and a controller retrying the same change repeats it, which is what the
// cluster-wide deduplication needs.
func DetectedID(parent, child ObjectRef, oldSpec, newSpec map[string]any) string {
	return shortHash(refKey(parent), refKey(child), canonical(oldSpec), canonical(newSpec))
}

// ResolvedID is the id of a Resolved report for a parent and child; it also
// identifies the pair whose Detected report a Resolved one ends.
func ResolvedID(parent, child ObjectRef) string {
	return shortHash(refKey(parent), refKey(child))
}

// ApprovedOccurrence identifies one approved drift: SHA-256 of the pair,
// the child's version before the change and both specs, cut to 16 hex
// characters. The version is metadata.generation, which moves with every
// spec change and only then (the resourceVersion for kinds without one; 0
// for a CREATE). The API server calls each webhook of a request with its
// own uid, and a controller whose approved write loses a conflict to a
// status update retries the same change on a new resourceVersion: neither
// is a second approved drift.
func ApprovedOccurrence(parent, child ObjectRef, oldVersion string, oldSpec, newSpec map[string]any) string {
	return shortHash(ResolvedApproved, refKey(parent), refKey(child), oldVersion, canonical(oldSpec), canonical(newSpec))
}

// refKey names an object independently of the version it was read at.
func refKey(r ObjectRef) string {
	return strings.Join([]string{groupOf(r.APIVersion), r.Kind, r.Namespace, r.Name}, "/")
}

func canonical(v map[string]any) string {
	if len(v) == 0 {
		return "{}"
	}
	b, err := json.Marshal(v) // map keys are sorted, so equal specs give equal bytes
	if err != nil {
		return "unmarshallable"
	}
	return string(b)
}

func shortHash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// ReportID is the id of a drift effect's report: ID when Decide set it,
// else the Resolved id of its parent and child (the Detected id needs the
// specs, which only Decide had).
func (e Effect) ReportID() string {
	if e.ID != "" {
		return e.ID
	}
	if e.Child == nil {
		return ""
	}
	return ResolvedID(e.Parent, *e.Child)
}

// Report is the DriftReport of a DriftDetected or DriftResolved effect, as
// docs/drift.md defines it. For other kinds it is the zero report.
func (e Effect) Report() DriftReport {
	var phase string
	switch e.Kind {
	case EffectDriftDetected:
		phase = ReportDetected
	case EffectDriftResolved:
		phase = ReportResolved
	default:
		return DriftReport{}
	}
	parent := e.Parent
	parent.UID, parent.ResourceVersion = "", ""
	var child ObjectRef
	if e.Child != nil {
		child = *e.Child
		child.ResourceVersion, child.ObservedGeneration, child.LifecyclePhase = "", 0, ""
	}
	var req RequestInfo
	if e.Request != nil {
		req = *e.Request
	}
	return DriftReport{
		APIVersion: "policyd.io/v1",
		Kind:       "DriftReport",
		Spec: DriftReportSpec{
			ID: e.ReportID(), Phase: phase, Parent: parent, Child: child,
			OldObject: e.OldObject, NewObject: e.NewObject, Request: req, Diff: e.Diff,
		},
	}
}

// Annotate computes the annotations the leader writes on current (the
// object named by e.Parent, freshly read) for an annotation effect:
// RecordController, RecordPhase, ConsumeApproval or PruneApprovals. It
// returns the complete new annotation map and whether anything changed;
// nothing changed means there is nothing to patch (already done, or not an
// annotation effect). prefix is Config.AnnotationPrefix.
//
// An apps/v1 Deployment bumps its generation on any annotation change, which
// would invalidate the once and generation approvals naming the current
// generation; Annotate moves those to the next generation in the same write.
func (e Effect) Annotate(prefix string, current *unstructured.Unstructured) (map[string]string, bool) {
	c := Config{AnnotationPrefix: prefix}.normalized()
	ann := maps.Clone(current.GetAnnotations())
	if ann == nil {
		ann = map[string]string{}
	}
	gen := generation(current)
	changed := false
	set := func(k, v string) {
		if old, ok := ann[k]; !ok || old != v {
			ann[k] = v
			changed = true
		}
	}
	switch e.Kind {
	case EffectRecordController:
		if validHash(e.UserHash) {
			set(c.key(annControllers), FormatHashes(AddHash(ParseHashes(ann[c.key(annControllers)]), e.UserHash)))
		}
	case EffectRecordPhase:
		if e.Phase == PhaseInitialized {
			set(c.key(annPhase), PhaseInitialized)
		}
	case EffectConsumeApproval:
		if e.Approval != nil {
			if v, ok := removeApproval(ann[c.key(annApprovals)], *e.Approval); ok {
				set(c.key(annApprovals), v)
			}
		}
	case EffectPruneApprovals:
		if v, ok := pruneApprovals(ann[c.key(annApprovals)], gen); ok {
			set(c.key(annApprovals), v)
		}
	}
	if changed && bumpsGenerationOnAnnotations(current) {
		if v, ok := moveApprovals(ann[c.key(annApprovals)], gen, gen+1); ok {
			ann[c.key(annApprovals)] = v
		}
	}
	return ann, changed
}

func bumpsGenerationOnAnnotations(o *unstructured.Unstructured) bool {
	return groupOf(o.GetAPIVersion()) == "apps" && o.GetKind() == "Deployment"
}

// moveApprovals rewrites once and generation approvals naming generation
// from to name generation to, keeping unknown fields.
func moveApprovals(value string, from, to int64) (string, bool) {
	var raw []map[string]any
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return value, false
	}
	changed := false
	for _, m := range raw {
		mode, _ := m["mode"].(string)
		g, _ := m["generation"].(float64)
		if mode != ApprovalAlways && int64(g) == from && g == float64(int64(g)) {
			m["generation"] = to
			changed = true
		}
	}
	if !changed {
		return value, false
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return value, false
	}
	return string(b), true
}
