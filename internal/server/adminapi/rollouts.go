package adminapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/policyd/policyd/internal/command"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/rollout"
	"github.com/policyd/policyd/internal/store"
)

// Staged rollouts (docs/rollouts.md): POST /v1/rollouts starts one, the
// leader's driver moves it, and the operator actions propose transitions
// from the state this node reads after a consistent read; the FSM's
// compare-and-set refuses one that lost a race with 409.

// RolloutRequest is the body of POST /v1/rollouts.
type RolloutRequest struct {
	Changes      []RolloutChangeRequest `json:"changes"`
	Stages       []RolloutStageRequest  `json:"stages"`
	MaxNackRatio float64                `json:"max_nack_ratio"`
	// MinAckCoverage defaults to 1 when absent.
	MinAckCoverage *float64 `json:"min_ack_coverage"`
	// OnHalt defaults to rollback.
	OnHalt string `json:"on_halt"`
	// MaxImpactRatio, when set, runs an impact replay of the changes over
	// the decisions logged since ImpactSince (default 24h) first, and
	// refuses the rollout with 409 and the report when its allow-to-deny
	// ratio is above it (docs/decisions.md#gating-a-rollout).
	MaxImpactRatio *float64 `json:"max_impact_ratio,omitempty"`
	ImpactSince    string   `json:"impact_since,omitempty"`
}

// RolloutChangeRequest is a put (op "put", policy the whole policy as for
// PUT /v1/policies/{name}) or a delete (op "delete", name).
type RolloutChangeRequest struct {
	Op     string          `json:"op"`
	Policy json.RawMessage `json:"policy,omitempty"`
	Name   string          `json:"name,omitempty"`
}

// RolloutStageRequest is one stage: percent 1..100, bake a Go duration.
type RolloutStageRequest struct {
	Percent int    `json:"percent"`
	Bake    string `json:"bake"`
}

// DecodeRolloutRequest decodes and validates a POST /v1/rollouts body into
// the rollout a RolloutStart carries. Every problem is reported with its
// field path (policy.ValidationError, a 400): each put's policy is decoded
// and validated as PUT /v1/policies does (field paths under
// changes[i].policy), then the rollout's shape is checked
// (command.CheckRollout).
func DecodeRolloutRequest(body []byte, v *policy.Validator) (*commandv1.Rollout, error) {
	var req RolloutRequest
	if err := policy.DecodeStrict(body, &req); err != nil {
		return nil, err
	}
	changes, errs := decodeChanges(req.Changes, v)
	r := &commandv1.Rollout{
		Changes: changes, MaxNackRatio: req.MaxNackRatio, MinAckCoverage: 1, OnHalt: req.OnHalt,
	}
	if req.MinAckCoverage != nil {
		r.MinAckCoverage = *req.MinAckCoverage
	}
	if r.OnHalt == "" {
		r.OnHalt = store.OnHaltRollback
	}
	if m := req.MaxImpactRatio; m != nil && (math.IsNaN(*m) || *m < 0 || *m > 1) {
		errs = append(errs, policy.FieldError{Field: "max_impact_ratio", Reason: fmt.Sprintf("%v is not within 0..1", *m)})
	}
	if req.ImpactSince != "" {
		if _, err := parseWhen(req.ImpactSince, time.Now()); err != nil {
			errs = append(errs, policy.FieldError{Field: "impact_since", Reason: err.Error()})
		}
	}
	for i, s := range req.Stages {
		field := fmt.Sprintf("stages[%d]", i)
		st := &commandv1.RolloutStage{}
		if s.Percent < 1 || s.Percent > 100 {
			errs = append(errs, policy.FieldError{Field: field + ".percent", Reason: fmt.Sprintf("%d is not within 1..100", s.Percent)})
		} else {
			st.Percent = uint32(s.Percent)
		}
		d, err := time.ParseDuration(s.Bake)
		if err != nil {
			errs = append(errs, policy.FieldError{Field: field + ".bake", Reason: fmt.Sprintf("%q is not a duration such as 2m or 30s", s.Bake)})
		} else {
			st.BakeMs = d.Milliseconds()
			if d > 0 && st.BakeMs == 0 {
				st.BakeMs = -1 // under a millisecond: below the minimum, not 0
			}
		}
		r.Stages = append(r.Stages, st)
	}
	// The rollout's own checks, but for fields already reported (a stage
	// whose percent or bake did not parse).
	reported := map[string]bool{}
	for _, fe := range errs {
		reported[fe.Field] = true
	}
	if err := command.CheckRollout(r); err != nil {
		var ve policy.ValidationError
		if !errors.As(err, &ve) {
			return nil, err
		}
		for _, fe := range ve {
			if !reported[fe.Field] {
				errs = append(errs, fe)
			}
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return r, nil
}

// decodeChanges decodes and validates a change set's puts as PUT
// /v1/policies does, each problem with its field path under changes[i].
// A put in error stands in as a policy of a unique name, so that the
// shape checks that follow (command.CheckChanges) still see the change.
func decodeChanges(req []RolloutChangeRequest, v *policy.Validator) ([]*commandv1.RolloutChange, policy.ValidationError) {
	var errs policy.ValidationError
	add := func(field string, err error) {
		var ve policy.ValidationError
		if errors.As(err, &ve) {
			for _, fe := range ve {
				f := field
				if fe.Field != "" {
					f += "." + fe.Field
				}
				errs = append(errs, policy.FieldError{Field: f, Reason: fe.Reason})
			}
			return
		}
		errs = append(errs, policy.FieldError{Field: field, Reason: err.Error()})
	}
	var out []*commandv1.RolloutChange
	for i, c := range req {
		field := fmt.Sprintf("changes[%d]", i)
		rc := &commandv1.RolloutChange{Op: c.Op, Name: c.Name}
		out = append(out, rc)
		if c.Op == store.OpPut && len(c.Policy) > 0 {
			rc.Policy = &commandv1.Policy{Name: fmt.Sprintf("\x00invalid %d", i)}
			p, err := policy.DecodePolicy(c.Policy)
			if err != nil {
				add(field+".policy", err)
				continue
			}
			if p.Name == "" {
				errs = append(errs, policy.FieldError{Field: field + ".policy.name", Reason: "required"})
				continue
			}
			if err := v.Policy(p); err != nil {
				add(field+".policy", err)
				continue
			}
			pb, err := command.PolicyMessage(p)
			if err != nil {
				add(field+".policy", err)
				continue
			}
			rc.Policy = pb
		} else if len(c.Policy) > 0 {
			// CheckChanges names the misplaced field; any policy will do.
			rc.Policy = &commandv1.Policy{}
		}
	}
	return out, errs
}

// RolloutList is GET /v1/rollouts.
type RolloutList struct {
	Rollouts     []*store.RolloutDoc `json:"rollouts"`
	AppliedIndex uint64              `json:"applied_index"`
}

// RolloutView is GET /v1/rollouts/{id}: the rollout and its status.
type RolloutView struct {
	*store.RolloutDoc
	Status RolloutStatus `json:"status"`
}

// RolloutStatus is what the cluster's sidecars report of a rollout.
type RolloutStatus struct {
	// Cohort counts the sidecars holding the candidate of the current
	// stage, cluster-wide.
	Cohort rollout.Cohort       `json:"cohort"`
	Stages []RolloutStageStatus `json:"stages"`
	// Shadow holds the shadow counts of the policies the rollout puts, as
	// GET /v1/policies/{name}/shadow gives them; those with no counts are
	// left out.
	Shadow []ShadowView `json:"shadow"`
	// Unreachable lists members whose sidecars are missing from Cohort.
	Unreachable []string `json:"unreachable_nodes,omitempty"`
}

// RolloutStageStatus is one stage: passed, current or pending.
type RolloutStageStatus struct {
	Percent uint32 `json:"percent"`
	Bake    string `json:"bake"`
	State   string `json:"state"`
}

func (a *API) routeRollouts() {
	a.route("POST /v1/rollouts", auth.RoleAdmin, a.startRollout)
	a.route("GET /v1/rollouts", auth.RoleRead, a.listRollouts)
	a.route("GET /v1/rollouts/{id}", auth.RoleRead, a.getRollout)
	for _, action := range []string{"pause", "resume", "promote", "abort"} {
		a.route("POST /v1/rollouts/{id}/"+action, auth.RoleAdmin, a.rolloutAction(action))
	}
}

func (a *API) startRollout(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	ro, err := DecodeRolloutRequest(body, a.b.Validator())
	if err != nil {
		return err
	}
	if refused, err := a.gateOnImpact(w, r, body, ro.GetChanges()); refused || err != nil {
		return err
	}
	// A delete of a policy that does not exist is a 400 here, read after a
	// consistent read; one deleted meanwhile is the FSM's conflict.
	read := false
	for i, c := range ro.GetChanges() {
		if c.GetOp() != store.OpDelete {
			continue
		}
		if !read {
			if err := a.b.ConsistentRead(r.Context()); err != nil {
				return err
			}
			read = true
		}
		if _, err := a.b.Store().GetPolicy(c.GetName()); err != nil {
			return policy.ValidationError{{Field: fmt.Sprintf("changes[%d].name", i), Reason: fmt.Sprintf("policy %q does not exist: %v", c.GetName(), err)}}
		}
	}
	cmd, err := command.RolloutStart(ro)
	if err != nil {
		return err
	}
	res, err := a.commit(r, cmd)
	if err != nil {
		return err
	}
	writeRawJSON(w, http.StatusCreated, res.GetValue())
	return nil
}

func (a *API) listRollouts(w http.ResponseWriter, r *http.Request) error {
	want := r.URL.Query().Get("state")
	switch want {
	case "", "all", "active", store.RolloutRunning, store.RolloutPaused, store.RolloutHalted,
		store.RolloutRolledBack, store.RolloutCompleted, store.RolloutAborted:
	default:
		return badRequest(fmt.Sprintf("state: %q is not active, all or a rollout state", want))
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	all, idx, err := a.b.Store().Rollouts()
	if err != nil {
		return err
	}
	out := RolloutList{Rollouts: []*store.RolloutDoc{}, AppliedIndex: idx}
	for _, ro := range all {
		switch {
		case want == "active" && !store.RolloutActive(ro.GetState()):
			continue
		case want != "" && want != "all" && want != "active" && ro.GetState() != want:
			continue
		}
		d, err := store.RolloutDocOf(ro)
		if err != nil {
			return err
		}
		out.Rollouts = append(out.Rollouts, d)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) getRollout(w http.ResponseWriter, r *http.Request) error {
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	ro, err := a.b.Store().Rollout(r.PathValue("id"))
	if err != nil {
		return err
	}
	d, err := store.RolloutDocOf(ro)
	if err != nil {
		return err
	}
	var puts []string
	for _, ch := range ro.GetChanges() {
		if p := ch.GetPolicy(); ch.GetOp() == store.OpPut && p != nil {
			puts = append(puts, p.GetName())
		}
	}
	// The shadow counts are gathered beside the clients, both asking every
	// member: one slow member costs the wait once.
	type shadowAnswer struct {
		views []ShadowView
		err   error
		// panicked is a panic of the gathering goroutine, raised again
		// on the request's own, where route recovers it as a 500: a
		// panic left on the other goroutine would end the process.
		panicked any
	}
	shadowCh := make(chan shadowAnswer, 1)
	if len(puts) > 0 {
		go func() {
			defer func() {
				if p := recover(); p != nil {
					shadowCh <- shadowAnswer{panicked: p}
				}
			}()
			views, err := a.shadowViews(r.Context(), puts)
			shadowCh <- shadowAnswer{views: views, err: err}
		}()
	} else {
		shadowCh <- shadowAnswer{}
	}
	clients, unreachable, err := a.b.Clients(r.Context())
	sa := <-shadowCh
	if sa.panicked != nil {
		panic(sa.panicked)
	}
	if err != nil {
		return err
	}
	if sa.err != nil {
		return sa.err
	}
	view := RolloutView{RolloutDoc: d, Status: RolloutStatus{
		Cohort: rollout.CohortOf(ro, clients), Stages: []RolloutStageStatus{}, Shadow: []ShadowView{},
		Unreachable: unreachable,
	}}
	for _, v := range sa.views {
		if v.Totals != (ShadowTotals{}) {
			v.Unreachable = nil // the status names them once
			view.Status.Shadow = append(view.Status.Shadow, v)
		}
	}
	for i, s := range d.Stages {
		st := "pending"
		switch {
		case uint32(i) < ro.GetStage() || ro.GetState() == store.RolloutCompleted:
			st = "passed"
		case uint32(i) == ro.GetStage():
			st = "current"
		}
		view.Status.Stages = append(view.Status.Stages, RolloutStageStatus{Percent: s.Percent, Bake: s.Bake, State: st})
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

// rolloutAction is POST /v1/rollouts/{id}/{action}: pause, resume, promote
// or abort, from the state a consistent read finds; 409 from a state the
// action does not apply to, or when the rollout moved meanwhile.
func (a *API) rolloutAction(action string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := a.b.ConsistentRead(r.Context()); err != nil {
			return err
		}
		ro, err := a.b.Store().Rollout(r.PathValue("id"))
		if err != nil {
			return err
		}
		t, err := ActionTransition(ro, action, actor(r), time.Now())
		if err != nil {
			return err
		}
		cmd, err := command.RolloutTransition(t)
		if err != nil {
			return err
		}
		res, err := a.commit(r, cmd)
		if err != nil {
			return err
		}
		writeRawJSON(w, http.StatusOK, res.GetValue())
		return nil
	}
}

// ActionTransition is the transition an operator action asks of ro at
// now; a store.ErrConflict naming the state when the action does not
// apply to it.
func ActionTransition(ro *commandv1.Rollout, action, who string, now time.Time) (*commandv1.RolloutTransition, error) {
	t := &commandv1.RolloutTransition{
		Id: ro.GetId(), ExpectState: ro.GetState(), ExpectStage: ro.GetStage(),
		Stage: ro.GetStage(), AtUnixMs: now.UnixMilli(),
	}
	from := ro.GetState()
	var ok bool
	switch action {
	case "pause":
		ok, t.State = from == store.RolloutRunning, store.RolloutPaused
	case "resume":
		ok, t.State = from == store.RolloutPaused || from == store.RolloutHalted, store.RolloutRunning
	case "promote":
		ok, t.State = store.RolloutActive(from), store.RolloutCompleted
	case "abort":
		ok, t.State = store.RolloutActive(from), store.RolloutAborted
		t.Reason = "aborted by " + who
	default:
		return nil, badRequest(fmt.Sprintf("unknown rollout action %q", action))
	}
	if !ok {
		return nil, fmt.Errorf("rollout %s is %s: cannot %s it: %w", ro.GetId(), from, action, store.ErrConflict)
	}
	return t, nil
}
