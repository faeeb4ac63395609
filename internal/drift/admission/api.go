package admission

// This file is the contract the server (internal/server/drift) builds on. Keep it
// stable: change it only by adding.
//
// Changes since first published: Effect.ID added (set by Decide for drift
// effects); Effect.Annotate takes the current object, not just its
// annotations; DetectedID takes the two specs; Effect.Resolution and
// Effect.Occurrence added, and an approved drift always yields a
// DriftResolved; InitOverride became initrule.Rule (Default added).

import (
	"context"
	"encoding/json"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/policyd/policyd/internal/drift/admission/initrule"
)

// Path is where every node serves the webhook on drift.addr.
const Path = "/admission/drift"

// Modes of the drift response, from drift.mode or the <prefix>/mode
// annotation on the object, its parent or the namespace.
const (
	ModeEnforce = "enforce"
	ModeLog     = "log"
)

// Lifecycle phases of a parent. Only PhaseInitialized is ever stored (the
// <prefix>/phase annotation); PhaseDeleting is derived from
// metadata.deletionTimestamp.
const (
	PhaseInitializing = "initializing"
	PhaseInitialized  = "initialized"
	PhaseDeleting     = "deleting"
)

// Config is what the decision depends on besides the request and the
// objects. Build it with ConfigFromDrift.
type Config struct {
	// AnnotationPrefix prefixes every annotation (default policyd.io; Kausality uses kausality.io).
	AnnotationPrefix string
	// Mode is the default response to drift: ModeEnforce or ModeLog.
	Mode string
	// Initialization holds per-kind initialization rules. A parent is
	// initialized when any rule of its group and kind holds; a kind with
	// rules here does not use its built-in one (Deployment, StatefulSet,
	// ReplicaSet), and a kind with no rule at all uses the default order.
	Initialization []InitOverride
}

// InitOverride is one drift.initialization rule (see package initrule for
// its text form): the default order, or all of its signals.
type InitOverride = initrule.Rule

// Objects reads the objects a decision needs. The server implements it with
// informers so the hot path makes no API call.
type Objects interface {
	// Parent returns the object ref points at, or nil, nil when it does not
	// exist. namespace is the child's; ignore it when ref's kind is
	// cluster-scoped.
	Parent(ctx context.Context, namespace string, ref metav1.OwnerReference) (*unstructured.Unstructured, error)
	// Namespace returns the Namespace object (for its <prefix>/mode
	// annotation), or nil, nil when it does not exist.
	Namespace(ctx context.Context, name string) (*unstructured.Unstructured, error)
}

// FreshObjects is implemented by an Objects whose reads may trail the API
// server (informers). Before a decision that rests on the parent being at
// rest (drift denied or logged, approved, rejected), the handler reads the
// parent again with FreshParent and decides on that copy: a controller
// acting on a spec change before the cache has seen it is not drift. Drift
// is rare, so the other decisions still make no API call.
type FreshObjects interface {
	// FreshParent is Objects.Parent read from the API server.
	FreshParent(ctx context.Context, namespace string, ref metav1.OwnerReference) (*unstructured.Unstructured, error)
}

// Sink receives the follow-up work of a decision; the server proposes it
// through Raft and the leader performs it. The handler calls Submit in the
// request goroutine after deciding, never for a dryRun request and never
// with an empty slice. An error is logged and counted; it does not change
// the admission response.
type Sink interface {
	Submit(ctx context.Context, effects []Effect) error
}

// EffectKind names one kind of leader follow-up.
type EffectKind string

// Effect kinds. The annotation-patching ones (RecordController, RecordPhase,
// ConsumeApproval, PruneApprovals) are applied to the object named by
// Effect.Parent with Effect.Annotate; the drift ones are sent with
// Effect.Report.
const (
	// EffectRecordController adds UserHash to the object's controllers
	// annotation: the async backup of the synchronous status-update patch
	// (the API server resets metadata on most status updates).
	EffectRecordController EffectKind = "RecordController"
	// EffectRecordPhase stores Phase (always PhaseInitialized) on the parent.
	EffectRecordPhase EffectKind = "RecordPhase"
	// EffectConsumeApproval removes Approval, a used once-approval, from the
	// parent's approvals annotation.
	EffectConsumeApproval EffectKind = "ConsumeApproval"
	// EffectPruneApprovals removes once and generation approvals whose
	// generation is not Parent.Generation.
	EffectPruneApprovals EffectKind = "PruneApprovals"
)

// How a DriftResolved effect ends a drift (Effect.Resolution).
const (
	// ResolvedApproved: an approval let the controller's change through.
	ResolvedApproved = "approved"
	// ResolvedParentChanged: the parent's spec changed, so the controller
	// is reconciling and any drift of the child is over.
	ResolvedParentChanged = "parent-changed"
	// ResolvedChildDeleted: the child is being deleted.
	ResolvedChildDeleted = "child-deleted"
)

// Effect is one piece of follow-up work. It is JSON so it can travel in a
// Raft command.
type Effect struct {
	Kind EffectKind `json:"kind"`
	// ID is the report id of a drift effect (see ReportID).
	ID string `json:"id,omitempty"`
	// Parent is the object to patch, or the drifting child's parent. For a
	// status update's RecordController it is the updated object itself.
	Parent ObjectRef `json:"parent"`
	// Child is the child of a drift (DriftDetected, DriftResolved) or the
	// child an approval was used for (ConsumeApproval).
	Child *ObjectRef `json:"child,omitempty"`
	// UserHash is the hash to record (RecordController).
	UserHash string `json:"userHash,omitempty"`
	// Phase is the lifecycle phase to record (RecordPhase).
	Phase string `json:"phase,omitempty"`
	// Approval is the once-approval to remove (ConsumeApproval).
	Approval *Approval `json:"approval,omitempty"`
	// Resolution is how a DriftResolved effect ends the drift.
	Resolution string `json:"resolution,omitempty"`
	// Occurrence identifies one approved drift (ResolvedApproved): the same
	// request seen by several webhooks has one occurrence, each approved
	// change its own (see ApprovedOccurrence).
	Occurrence string `json:"occurrence,omitempty"`
	// Request describes the request behind a drift effect. Diff, OldObject
	// and NewObject (managedFields removed) come with DriftDetected and an
	// approved DriftResolved.
	Request   *RequestInfo    `json:"request,omitempty"`
	Diff      []string        `json:"diff,omitempty"`
	OldObject json.RawMessage `json:"oldObject,omitempty"`
	NewObject json.RawMessage `json:"newObject,omitempty"`
	// At is the decision time.
	At time.Time `json:"at"`
}

// ObjectRef names an object and the state the decision saw.
type ObjectRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	UID        string `json:"uid,omitempty"`
	// ResourceVersion is the version the decision saw; use it as a patch
	// precondition only if a conflict should abort the patch.
	ResourceVersion    string `json:"resourceVersion,omitempty"`
	Generation         int64  `json:"generation,omitempty"`
	ObservedGeneration int64  `json:"observedGeneration,omitempty"`
	// LifecyclePhase is the phase computed for a parent.
	LifecyclePhase string `json:"lifecyclePhase,omitempty"`
}

// RequestInfo is the part of the admission request a report carries.
type RequestInfo struct {
	User      string   `json:"user"`
	Groups    []string `json:"groups,omitempty"`
	UID       string   `json:"uid"`
	Operation string   `json:"operation"`
	DryRun    bool     `json:"dryRun"`
}

// Approval is one entry of the <prefix>/approvals annotation (a JSON array).
// Mode is once (the default), generation or always; "*" (Wildcard) in
// APIVersion, Kind or Name matches any. A once or generation entry is valid
// only while Generation equals the parent's generation.
type Approval struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Generation int64  `json:"generation,omitempty"`
	Mode       string `json:"mode,omitempty"`
}

// Rejection is one entry of the <prefix>/rejections annotation (a JSON
// array), matched like an Approval. A missing or 0 Generation means always.
type Rejection struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Generation int64  `json:"generation,omitempty"`
	Reason     string `json:"reason"`
}

// Approval modes.
const (
	ApprovalOnce       = "once"
	ApprovalGeneration = "generation"
	ApprovalAlways     = "always"
)

// Report phases.
const (
	ReportDetected = "Detected"
	ReportResolved = "Resolved"
)

// Input is everything Decide looks at. Old and New are the request's
// oldObject and object (nil when absent); Parent is the object of the
// controller ownerReference (nil: none, or not found); Namespace is the
// request namespace's Namespace object (nil: none or cluster-scoped).
type Input struct {
	Request   *admissionv1.AdmissionRequest
	Old, New  *unstructured.Unstructured
	Parent    *unstructured.Unstructured
	Namespace *unstructured.Unstructured
	Now       time.Time
	Config    Config
}

// Decision is the admission outcome and its follow-up work.
type Decision struct {
	Allowed bool
	// Code is the HTTP status of a denial (403, 500); 0 when allowed.
	Code             int32
	Reason           metav1.StatusReason
	Message          string
	Warnings         []string
	Patch            []byte // a JSONPatch (RFC 6902) of the object, or nil
	AuditAnnotations map[string]string
	// Effects are for the Sink; empty for a dryRun request.
	Effects []Effect
	// Outcome labels the decision for metrics and logs, e.g. "drift-denied".
	Outcome string
}
