package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/interpreter"

	"github.com/policyd/policyd/api/celenv"
)

// KindValidatingPolicy is the kind whose CEL validations Evaluate runs.
const KindValidatingPolicy = "ValidatingPolicy"

// validatingSpec is the spec of a ValidatingPolicy.
type validatingSpec struct {
	MatchConditions []struct {
		Name       string `json:"name"`
		Expression string `json:"expression"`
	} `json:"matchConditions"`
	Validations []struct {
		Expression string `json:"expression"`
		Message    string `json:"message"`
		Reason     string `json:"reason"`
	} `json:"validations"`
}

// check is one compiled validation.
type check struct {
	prog    *program
	message string
	reason  string
}

// condition is one compiled match condition.
type condition struct {
	prog *program
	name string
}

// validator is one compiled ValidatingPolicy.
type validator struct {
	name       string
	spec       json.RawMessage // what it was compiled from, for reuse
	conditions []condition
	checks     []check
}

// celCompiler compiles ValidatingPolicies in the environment the server
// validates them with (package celenv), plus the client's own options.
type celCompiler struct {
	env       *cel.Env
	costLimit uint64
}

func newCELCompiler(costLimit uint64, extra ...cel.EnvOption) (*celCompiler, error) {
	env, err := celenv.New(extra...)
	if err != nil {
		return nil, err
	}
	return &celCompiler{env: env, costLimit: costLimit}, nil
}

// compileEnforced compiles the enforced policies of a set (sorted by name),
// reusing from prevRules and prevValidators what has not changed: what a
// Client installs and an Evaluator holds.
func (cc *celCompiler) compileEnforced(enforced []Policy, prevRules *ruleSet, prevValidators []*validator) (*ruleSet, []*validator, error) {
	rules, err := compileRules(enforced, prevRules)
	if err != nil {
		return nil, nil, err
	}
	validators, err := cc.compileValidators(enforced, prevValidators)
	if err != nil {
		return nil, nil, err
	}
	return rules, validators, nil
}

// compileValidators compiles the ValidatingPolicies of set (sorted by name),
// reusing from prev the ones whose spec has not changed, so an update costs
// the compile of what changed only.
func (cc *celCompiler) compileValidators(set []Policy, prev []*validator) ([]*validator, error) {
	var out []*validator
	for _, p := range set {
		if p.Kind != KindValidatingPolicy {
			continue
		}
		for len(prev) > 0 && prev[0].name < p.Name {
			prev = prev[1:]
		}
		if len(prev) > 0 && prev[0].name == p.Name && bytes.Equal(prev[0].spec, p.Spec) {
			out = append(out, prev[0])
			prev = prev[1:]
			continue
		}
		v, err := cc.compile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func (cc *celCompiler) compile(p Policy) (*validator, error) {
	var s validatingSpec
	if err := json.Unmarshal(p.Spec, &s); err != nil {
		return nil, fmt.Errorf("policy %s: ValidatingPolicy spec: %w", p.Name, err)
	}
	if len(s.Validations) == 0 {
		return nil, fmt.Errorf("policy %s: spec.validations is required", p.Name)
	}
	v := &validator{name: p.Name, spec: p.Spec, checks: make([]check, 0, len(s.Validations))}
	if len(s.MatchConditions) > 0 {
		v.conditions = make([]condition, 0, len(s.MatchConditions))
	}
	for i, mc := range s.MatchConditions {
		prog, err := cc.program(mc.Expression)
		if err != nil {
			return nil, fmt.Errorf("policy %s: spec.matchConditions[%d].expression: %w", p.Name, i, err)
		}
		v.conditions = append(v.conditions, condition{prog: prog, name: mc.Name})
	}
	for i, val := range s.Validations {
		prog, err := cc.program(val.Expression)
		if err != nil {
			return nil, fmt.Errorf("policy %s: spec.validations[%d].expression: %w", p.Name, i, err)
		}
		v.checks = append(v.checks, check{prog: prog, message: val.Message, reason: val.Reason})
	}
	return v, nil
}

// program compiles one expression that must give a bool (or dyn, checked
// when it runs).
func (cc *celCompiler) program(expr string) (*program, error) {
	ast, iss := cc.env.Compile(expr)
	if iss.Err() != nil {
		return nil, fmt.Errorf("compile: %w", iss.Err())
	}
	if out := ast.OutputType(); !out.IsExactType(cel.BoolType) && !out.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("must evaluate to bool, got %s", out)
	}
	prog, err := newProgram(cc.env, ast, cc.costLimit)
	if err != nil {
		return nil, fmt.Errorf("program: %w", err)
	}
	return prog, nil
}

// Request is what Evaluate decides on. Its fields are the CEL variables of
// package celenv; one not set is CEL null (an empty map for Request and
// Input, an empty string for Tool). Tool and Input are also what
// ToolPolicies match.
type Request struct {
	// Request holds the request's attributes (the CEL variable request),
	// for example method, path, headers, host and principals for a proxy.
	Request map[string]any
	// Object and OldObject are a resource and its previous version (CEL
	// object and oldObject), as in a Kubernetes admission request.
	Object, OldObject any
	// Params are policy parameters (CEL params).
	Params any
	// Tool is the name of the tool an agent calls (CEL tool). Empty: not a
	// tool call, and ToolPolicies do not apply.
	Tool string
	// Input is the tool call's input (CEL input).
	Input map[string]any
}

// Decision is Evaluate's answer.
type Decision struct {
	// Allowed is true when nothing denied the request.
	Allowed bool
	// Policy names the policy that denied it; empty when the state of the
	// client denied it (connecting, revoked, disconnected past grace).
	Policy string
	// Message says why it was denied.
	Message string
	// Reason is the failed validation's reason, when its spec has one.
	Reason string
	// Err is the evaluation error that denied the request (fail closed):
	// an expression that failed at run time, went over the cost limit or
	// did not give a bool, or ctx ended (checked between policies).
	Err error
}

// Evaluate decides req against the set in force: a ToolPolicy that denies
// the call (when req.Tool is set) wins, then every ValidatingPolicy whose
// match conditions all hold, in name order, must have all its validations
// hold; the first that does not denies with its message and reason. A
// policy with a false match condition is skipped; one whose match
// conditions are not false but include one that fails denies. An
// evaluation error that denies is counted in EvalErrors. In the states
// where IsBlocked blocks everything, Evaluate denies everything.
//
// Shadow policies never decide: each one that applies is evaluated alone
// after the enforced decision, and counted (Stats.Shadow).
//
// With Config.DecisionLog set, the decision is then recorded (decisionlog.go).
func (c *Client) Evaluate(ctx context.Context, req Request) Decision {
	if c.dlog != nil {
		return c.evaluateRecorded(ctx, &req)
	}
	v := c.view.Load()
	in := &celInput{req: &req}
	d := evaluate(ctx, v, in, c.logger, &c.evalErrors)
	if v.shadow != nil && v.block == "" {
		c.shadowEvaluate(ctx, v.shadow, in, d.Allowed, nil)
	}
	return d
}

// evaluateRecorded is Evaluate with the decision log on: the decision is
// timed, sampled, and recorded with the shadow policies that disagreed.
func (c *Client) evaluateRecorded(ctx context.Context, req *Request) Decision {
	start := time.Now()
	v := c.view.Load()
	in := &celInput{req: req}
	d := evaluate(ctx, v, in, c.logger, &c.evalErrors)
	keep := c.dlog.keep(d.Allowed)
	var now time.Time
	if keep {
		now = c.cfg.Clock.Now()
		keep = c.dlog.admit(now)
	}
	var disagree []string
	if v.shadow != nil && v.block == "" {
		var names *[]string
		if keep {
			names = &disagree
		}
		c.shadowEvaluate(ctx, v.shadow, in, d.Allowed, names)
	}
	if keep {
		c.dlog.record(c, v, req, &d, now, time.Since(start), disagree)
	}
	return d
}

// celInput is a request as CEL reads it, built once for the enforced and
// the shadow policies of one Evaluate, and only if a ValidatingPolicy runs.
type celInput struct {
	req  *Request
	vars interpreter.Activation
	size uint64 // inputSize, which picks each expression's program
	err  error
}

func (in *celInput) activation() (interpreter.Activation, error) {
	if in.vars == nil && in.err == nil {
		// One activation for every program. The cost limit, not ctx,
		// bounds each evaluation: ContextEval would cost a cancellable
		// context per expression, a fifth of the time of a small one.
		in.vars, in.err = interpreter.NewActivation(map[string]any{
			"object":    in.req.Object,
			"oldObject": in.req.OldObject,
			"request":   in.req.Request,
			"params":    in.req.Params,
			"tool":      in.req.Tool,
			"input":     in.req.Input,
		})
		in.size = inputSize(in.req)
	}
	return in.vars, in.err
}

// evaluate is the decision of the enforced policies of v, for Client.Evaluate
// and Evaluator alike: logger gets the audit rules that match, errs counts
// the evaluation errors that deny.
func evaluate(ctx context.Context, v *view, in *celInput, logger *slog.Logger, errs *atomic.Uint64) Decision {
	if v.block != "" {
		return Decision{Message: v.block}
	}
	req := in.req
	if req.Tool != "" {
		if r := toolDeny(logger, v.rules, req.Tool, req.Input); r != nil {
			return Decision{Policy: r.name, Message: r.denial()}
		}
	}
	if len(v.validators) == 0 {
		return Decision{Allowed: true}
	}
	vars, err := in.activation()
	if err != nil {
		errs.Add(1)
		return Decision{Message: "evaluation failed", Err: fmt.Errorf("CEL activation: %w", err)}
	}
	for _, val := range v.validators {
		if err := ctx.Err(); err != nil {
			errs.Add(1)
			return Decision{Message: "evaluation cancelled", Err: err}
		}
		if _, d := val.decide(in.size, vars); d != nil {
			if d.Err != nil {
				errs.Add(1)
			}
			return *d
		}
	}
	return Decision{Allowed: true}
}

// decide runs one ValidatingPolicy: applies is false when a match
// condition is false; d is its denial, nil when it is skipped or holds.
// Match conditions go the way Kubernetes does: any false one skips the
// policy, whatever the others gave; else the first that failed denies
// (fail closed). Evaluating them all makes the answer independent of their
// order. Then the first validation that does not hold denies with its
// message and reason.
func (val *validator) decide(size uint64, vars interpreter.Activation) (applies bool, d *Decision) {
	var failed *condition
	var failure error
	for i := range val.conditions {
		mc := &val.conditions[i]
		ok, err := evalBool(mc.prog, size, vars)
		switch {
		case err == nil && !ok:
			return false, nil
		case err != nil && failed == nil:
			failed, failure = mc, err
		}
	}
	if failed != nil {
		return true, &Decision{
			Policy:  val.name,
			Message: "match condition " + failed.name + " failed",
			Err:     fmt.Errorf("policy %s: match condition %s: %w", val.name, failed.name, failure),
		}
	}
	for i := range val.checks {
		ch := &val.checks[i]
		ok, err := evalBool(ch.prog, size, vars)
		if ok {
			continue
		}
		d := &Decision{Policy: val.name, Message: ch.message, Reason: ch.reason}
		if err != nil {
			d.Err = fmt.Errorf("policy %s: %w", val.name, err)
		}
		return true, d
	}
	return true, nil
}

// errNotBool is the error of an expression that gave a type other than bool.
func errNotBool(typ string) error { return fmt.Errorf("expression gave %s, not a bool", typ) }

// EvalErrors counts evaluations that Evaluate denied because an expression
// failed (run-time error, cost limit, non-bool result, context ended).
func (c *Client) EvalErrors() uint64 { return c.evalErrors.Load() }
