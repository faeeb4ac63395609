package adminclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// StagedRollout is a staged rollout (docs/rollouts.md), as POST
// /v1/rollouts and the actions answer; GET /v1/rollouts/{id} adds Status.
type StagedRollout struct {
	ID             string               `json:"id"`
	Changes        []StagedChange       `json:"changes"`
	Stages         []StagedRolloutStage `json:"stages"`
	MaxNackRatio   float64              `json:"max_nack_ratio"`
	MinAckCoverage float64              `json:"min_ack_coverage"`
	OnHalt         string               `json:"on_halt"`
	State          string               `json:"state"`
	Stage          uint32               `json:"stage"`
	StageStartedAt time.Time            `json:"stage_started_at"`
	HaltReason     string               `json:"halt_reason,omitempty"`
	Actor          string               `json:"actor,omitempty"`
	RequestID      string               `json:"request_id,omitempty"`
	CreatedAt      time.Time            `json:"created_at"`
	UpdatedAt      time.Time            `json:"updated_at"`
	// Source is the policy source that started it (spec.rollout); omitted:
	// the API.
	Source string               `json:"source,omitempty"`
	Status *StagedRolloutStatus `json:"status,omitempty"`
}

// StagedRolloutStage is one stage; Bake is a Go duration.
type StagedRolloutStage struct {
	Percent uint32 `json:"percent"`
	Bake    string `json:"bake"`
}

// StagedRolloutStatus is what the sidecars report of a rollout.
type StagedRolloutStatus struct {
	Cohort      RolloutCohort        `json:"cohort"`
	Stages      []RolloutStageStatus `json:"stages"`
	Shadow      []ShadowView         `json:"shadow"`
	Unreachable []string             `json:"unreachable_nodes,omitempty"`
}

// RolloutCohort counts the sidecars holding the current stage's candidate:
// discovery clients by answer, feed clients in SizeWS.
type RolloutCohort struct {
	Size    int `json:"size"`
	SizeWS  int `json:"size_ws"`
	Acked   int `json:"acked"`
	Nacked  int `json:"nacked"`
	Pending int `json:"pending"`
}

// RolloutStageStatus is one stage: passed, current or pending.
type RolloutStageStatus struct {
	Percent uint32 `json:"percent"`
	Bake    string `json:"bake"`
	State   string `json:"state"`
}

// StagedRolloutList is GET /v1/rollouts.
type StagedRolloutList struct {
	Rollouts     []StagedRollout `json:"rollouts"`
	AppliedIndex uint64          `json:"applied_index"`
}

// StartRollout is the body of POST /v1/rollouts.
type StartRollout struct {
	Changes      []StartChange `json:"changes"`
	Stages       []StartStage  `json:"stages"`
	MaxNackRatio float64       `json:"max_nack_ratio"`
	// MinAckCoverage: nil means the server's default, 1.
	MinAckCoverage *float64 `json:"min_ack_coverage,omitempty"`
	// OnHalt: "rollback" (the default) or "stay".
	OnHalt string `json:"on_halt,omitempty"`
	// MaxImpactRatio, when set, makes the server replay the changes over
	// the decisions logged since ImpactSince (default 24h) first and
	// refuse with 409 and the report when more than this share of them
	// flips from allow to deny.
	MaxImpactRatio *float64 `json:"max_impact_ratio,omitempty"`
	ImpactSince    string   `json:"impact_since,omitempty"`
}

// Staged rollout actions (POST /v1/rollouts/{id}/ACTION).
const (
	RolloutPause   = "pause"
	RolloutResume  = "resume"
	RolloutPromote = "promote"
	RolloutAbort   = "abort"
)

// StartRollout starts a staged rollout.
func (c *Client) StartRollout(ctx context.Context, req StartRollout) (*StagedRollout, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode rollout: %w", err)
	}
	var out StagedRollout
	return &out, c.Do(ctx, http.MethodPost, "/v1/rollouts", nil, body, &out)
}

// StagedRollouts lists staged rollouts; state is "active", "all" (or "")
// or one state.
func (c *Client) StagedRollouts(ctx context.Context, state string) (*StagedRolloutList, error) {
	q := url.Values{}
	setNonEmpty(q, "state", state)
	var out StagedRolloutList
	return &out, c.Do(ctx, http.MethodGet, withQuery("/v1/rollouts", q), nil, nil, &out)
}

// StagedRollout reads one staged rollout with its status.
func (c *Client) StagedRollout(ctx context.Context, id string) (*StagedRollout, error) {
	var out StagedRollout
	return &out, c.Do(ctx, http.MethodGet, "/v1/rollouts/"+url.PathEscape(id), nil, nil, &out)
}

// RolloutAction pauses, resumes, promotes or aborts a staged rollout
// (RolloutPause and the others).
func (c *Client) RolloutAction(ctx context.Context, id, action string) (*StagedRollout, error) {
	var out StagedRollout
	return &out, c.Do(ctx, http.MethodPost, "/v1/rollouts/"+url.PathEscape(id)+"/"+url.PathEscape(action), nil, nil, &out)
}
