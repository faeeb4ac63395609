package admission

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/drift/admission/initrule"
)

// The EffectKinds that report a drift; the others are in api.go.
const (
	// EffectDriftDetected is a drift to report (phase Detected). Detected
	// reports are deduplicated by ID for 10 minutes cluster-wide.
	EffectDriftDetected EffectKind = "DriftDetected"
	// EffectDriftResolved ends a drift of Parent and Child (phase Resolved);
	// Resolution says how. An approved drift (ResolvedApproved) is always
	// reported, once per Occurrence. The other two are emitted whenever the
	// pair's drift would be over, as Decide has no memory: send those only
	// when a Detected report for the pair is outstanding
	// (ResolvedID(Parent, Child) identifies the pair).
	EffectDriftResolved EffectKind = "DriftResolved"
)

// DriftReport is the body POSTed to each drift.callbacks URL and listed by
// GET /v1/drift.
type DriftReport struct {
	APIVersion string          `json:"apiVersion"` // policyd.io/v1
	Kind       string          `json:"kind"`       // DriftReport
	Spec       DriftReportSpec `json:"spec"`
}

// DriftReportSpec is the content of a DriftReport.
type DriftReportSpec struct {
	// ID is the effect's ID: 16 hex characters, equal on every replica
	// that saw the same drift (DetectedID, ResolvedID).
	ID    string `json:"id"`
	Phase string `json:"phase"` // Detected or Resolved
	// Parent has no uid or resourceVersion in a report.
	Parent    ObjectRef       `json:"parent"`
	Child     ObjectRef       `json:"child"`
	OldObject json.RawMessage `json:"oldObject"`
	NewObject json.RawMessage `json:"newObject"`
	Request   RequestInfo     `json:"request"`
	// Diff summarizes the spec change: the changed paths, sorted.
	Diff []string `json:"diff,omitempty"`
}

// The outcomes of a change that is a drift, denied (enforce) or allowed
// with a warning (log); the rest of the closed set is in decide.go.
const (
	OutcomeDriftDenied = "drift-denied"
	OutcomeDriftLogged = "drift-logged"
)

// ConfigFromDrift builds the webhook's Config from the daemon configuration.
// It fails on an unknown mode or an unparsable initialization entry.
func ConfigFromDrift(d config.Drift) (Config, error) {
	cfg := Config{AnnotationPrefix: strings.TrimSpace(d.AnnotationPrefix), Mode: d.Mode}
	if cfg.AnnotationPrefix == "" {
		cfg.AnnotationPrefix = "policyd.io"
	}
	switch cfg.Mode {
	case "":
		cfg.Mode = ModeLog
	case ModeEnforce, ModeLog:
	default:
		return Config{}, fmt.Errorf("drift.mode %q: must be %s or %s", d.Mode, ModeEnforce, ModeLog)
	}
	for i, s := range d.Initialization {
		o, err := initrule.Parse(s)
		if err != nil {
			return Config{}, fmt.Errorf("drift.initialization[%d]: %w", i, err)
		}
		cfg.Initialization = append(cfg.Initialization, o)
	}
	return cfg, nil
}

// driftEffect is a Detected or Resolved effect for this child.
func (d *decider) driftEffect(kind EffectKind, parent ObjectRef, oldSpec, newSpec map[string]any) Effect {
	child := d.child
	e := Effect{
		Kind: kind, Parent: parent, Child: &child, At: d.in.Now,
		Request: &RequestInfo{
			User: d.req.UserInfo.Username, Groups: d.req.UserInfo.Groups, UID: string(d.req.UID),
			Operation: string(d.req.Operation), DryRun: d.req.DryRun != nil && *d.req.DryRun,
		},
	}
	if kind == EffectDriftDetected {
		e.ID = DetectedID(parent, child, oldSpec, newSpec)
	} else {
		e.ID = ResolvedID(parent, child)
	}
	return e
}
