package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/apierror"
)

// Impact replays' bounds (docs/decisions.md#impact-analysis).
const (
	defaultImpactSince   = 24 * time.Hour
	defaultImpactTimeout = time.Minute
	maxImpactTimeout     = 10 * time.Minute
)

// impactRunner is the part of Backend that replays logged decisions.
type impactRunner interface {
	// Impact replays, on every member, the decisions req selects under
	// the identities' sets with and without req's changes, until deadline,
	// and sums the answers; maskIdentities hides the examples' employees
	// and client addresses.
	Impact(ctx context.Context, req *clusterv1.LocalImpactRequest, deadline time.Time, maskIdentities bool) (*decisionsv1.ImpactReport, error)
}

// ImpactRequest is the body of POST /v1/impact: a change set in the form
// staged rollouts take, and which decisions to replay.
type ImpactRequest struct {
	Changes []RolloutChangeRequest `json:"changes"`
	// Since is an RFC 3339 time or a duration back from now; default 24h.
	Since string `json:"since"`
	// Org and Team keep only that org's (and team's) decisions.
	Org  string `json:"org"`
	Team string `json:"team"`
	// MaxExamples per org and team and per flip: default 20, 1 to 100.
	MaxExamples *int `json:"max_examples"`
	// Timeout bounds the replay (default 1m, at most 10m); nodes that
	// run out of it answer what they counted and are named in cut_off.
	Timeout string `json:"timeout"`
}

func (a *API) routeImpact() {
	a.route("POST /v1/impact", auth.RoleAdmin, a.postImpact)
}

// postImpact is POST /v1/impact. It writes nothing but costs minutes of
// CPU on every node, so it takes the admin role, as every POST does; the
// node runs one replay at a time (503 to the next meanwhile).
func (a *API) postImpact(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	req, deadline, err := decodeImpactRequest(body, a.b.Validator(), time.Now())
	if err != nil {
		return err
	}
	rep, err := a.runImpact(r, req, deadline)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// runImpact runs one replay at a time on this node.
func (a *API) runImpact(r *http.Request, req *clusterv1.LocalImpactRequest, deadline time.Time) (*decisionsv1.ImpactReport, error) {
	select {
	case a.impactSlot <- struct{}{}:
		defer func() { <-a.impactSlot }()
	default:
		return nil, &apiError{status: http.StatusServiceUnavailable, code: apierror.CodeUnavailable,
			msg: "an impact replay is already running on this node; retry when it is done"}
	}
	role, _ := r.Context().Value(ctxRole).(auth.Role)
	return a.b.Impact(r.Context(), req, deadline, role < auth.RoleAdmin && a.b.DecisionsMasked())
}

// decodeImpactRequest decodes and validates a POST /v1/impact body: the
// changes as POST /v1/rollouts checks them (400 with the field path), and
// the window.
func decodeImpactRequest(body []byte, v *policy.Validator, now time.Time) (*clusterv1.LocalImpactRequest, time.Time, error) {
	var req ImpactRequest
	if err := policy.DecodeStrict(body, &req); err != nil {
		return nil, time.Time{}, err
	}
	changes, errs := decodeChanges(req.Changes, v)
	if err := command.CheckChanges(changes); err != nil {
		errs = appendUnreported(errs, err)
	}
	out := &clusterv1.LocalImpactRequest{Changes: changes, Org: req.Org, Team: req.Team, SinceUnixNano: now.Add(-defaultImpactSince).UnixNano()}
	if req.Team != "" && req.Org == "" {
		errs = append(errs, policy.FieldError{Field: "team", Reason: "needs org: team names are only unique within an org"})
	}
	if req.Since != "" {
		t, err := parseWhen(req.Since, now)
		if err != nil {
			errs = append(errs, policy.FieldError{Field: "since", Reason: err.Error()})
		}
		out.SinceUnixNano = t.UnixNano()
	}
	if m := req.MaxExamples; m != nil {
		if *m < 1 || *m > 100 {
			errs = append(errs, policy.FieldError{Field: "max_examples", Reason: fmt.Sprintf("%d is not within 1..100", *m)})
		} else {
			out.MaxExamples = uint32(*m) //nolint:gosec // within 1..100
		}
	}
	timeout := defaultImpactTimeout
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d <= 0 || d > maxImpactTimeout {
			errs = append(errs, policy.FieldError{Field: "timeout", Reason: fmt.Sprintf("%q is not a duration above 0 and at most %v", req.Timeout, maxImpactTimeout)})
		}
		timeout = d
	}
	if len(errs) > 0 {
		return nil, time.Time{}, errs
	}
	return out, now.Add(timeout), nil
}

// appendUnreported adds a validation error's fields that errs does not
// already name.
func appendUnreported(errs policy.ValidationError, err error) policy.ValidationError {
	var ve policy.ValidationError
	if !errors.As(err, &ve) {
		return append(errs, policy.FieldError{Field: "changes", Reason: err.Error()})
	}
	reported := map[string]bool{}
	for _, fe := range errs {
		reported[fe.Field] = true
	}
	for _, fe := range ve {
		if !reported[fe.Field] {
			errs = append(errs, fe)
		}
	}
	return errs
}

// impactRefusal is the 409 of a rollout whose impact is over its limit:
// the error envelope and the report.
type impactRefusal struct {
	apierror.Envelope
	Impact *decisionsv1.ImpactReport `json:"impact"`
}

// gateOnImpact runs the impact replay a rollout's max_impact_ratio asks
// for, and answers 409 with the report when it is over the limit
// (refused true: the response is written).
func (a *API) gateOnImpact(w http.ResponseWriter, r *http.Request, body []byte, changes []*commandv1.RolloutChange) (refused bool, err error) {
	var gate struct {
		MaxImpactRatio *float64 `json:"max_impact_ratio"`
		ImpactSince    string   `json:"impact_since"`
	}
	if err := json.Unmarshal(body, &gate); err != nil || gate.MaxImpactRatio == nil {
		return false, nil // DecodeRolloutRequest has read the body strictly
	}
	now := time.Now()
	req := &clusterv1.LocalImpactRequest{Changes: changes, SinceUnixNano: now.Add(-defaultImpactSince).UnixNano()}
	if gate.ImpactSince != "" {
		t, _ := parseWhen(gate.ImpactSince, now) // checked by DecodeRolloutRequest
		req.SinceUnixNano = t.UnixNano()
	}
	rep, err := a.runImpact(r, req, now.Add(defaultImpactTimeout))
	if err != nil {
		return false, fmt.Errorf("impact replay before the rollout: %w", err)
	}
	if rep.AllowToDenyRatio <= *gate.MaxImpactRatio {
		return false, nil
	}
	msg := fmt.Sprintf("the changes turn %d of %d logged allowed decisions into denials (%.4f), over max_impact_ratio %v",
		rep.Totals.AllowToDeny, rep.Totals.Evaluated, rep.AllowToDenyRatio, *gate.MaxImpactRatio)
	env := impactRefusal{Envelope: apierror.New(apierror.CodeConflict, msg), Impact: rep}
	env.Error.Reason = "impact"
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusConflict, env)
	return true, nil
}
