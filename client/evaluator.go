package client

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
)

// Evaluator decides requests against a fixed set of policies, offline,
// with the code Client.Evaluate runs: for checking a set before it is
// written, and for replaying logged decisions under another set (impact
// analysis). It has no connection state, so it never blocks everything
// the way a connecting or revoked Client does. Safe for concurrent use.
type Evaluator struct {
	v    *view
	errs atomic.Uint64
}

// defaultCompiler is the compiler of a Client with the default Config,
// shared by every Evaluator: the CEL environment is costly to build and
// safe to share.
var defaultCompiler = sync.OnceValues(func() (*celCompiler, error) {
	return newCELCompiler(DefaultCELCostLimit)
})

// NewEvaluator compiles policies as a Client with the default Config would
// compile the set: in name order (a later policy of the same name replaces
// an earlier one), ToolPolicies and ValidatingPolicies, other kinds
// ignored. Shadow policies are left out: they never decide. A policy that
// does not compile is an error, as it makes a Client reject the set.
func NewEvaluator(policies []Policy) (*Evaluator, error) {
	cc, err := defaultCompiler()
	if err != nil {
		return nil, err
	}
	set := sortByName(slices.Clone(policies))
	enforced, _ := splitShadow(set)
	rules, validators, err := cc.compileEnforced(enforced, nil, nil)
	if err != nil {
		return nil, err
	}
	return &Evaluator{v: &view{state: StateReady, rules: rules, validators: validators}}, nil
}

// discard is the Evaluator's logger: an audit rule that matches a replayed
// request is no event.
var discard = slog.New(slog.DiscardHandler)

// Evaluate decides req as Client.Evaluate does in state ready, without
// shadow policies or the decision log.
func (e *Evaluator) Evaluate(ctx context.Context, req Request) Decision {
	return evaluate(ctx, e.v, &celInput{req: &req}, discard, &e.errs)
}

// EvalErrors counts the evaluations that Evaluate denied because an
// expression failed, as Client.EvalErrors does.
func (e *Evaluator) EvalErrors() uint64 { return e.errs.Load() }
