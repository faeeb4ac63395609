package client

import (
	"math"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/interpreter"
)

// sizeSteps are the input sizes at which an expression's worst-case cost
// is estimated when it is compiled; the largest at which the estimate is
// within the cost limit lets Evaluate skip run-time cost tracking for
// inputs up to it.
var sizeSteps = [...]uint64{64, 1 << 10, 16 << 10, 256 << 10, 4 << 20}

// maxWalkDepth bounds how deep inputSize follows nested values; deeper
// input is treated as unbounded and gets the tracked program.
const maxWalkDepth = 64

// program is one expression compiled twice. cel-go's cost tracker
// observes every step and costs about as much as the evaluation itself
// (bench/FINDINGS.md), so when the checker proves that the expression's
// worst case on inputs no larger than fastUpTo is within the cost limit,
// such inputs run the untracked program; anything larger runs the tracked
// one, which stops at the limit.
type program struct {
	tracked  cel.Program
	fast     cel.Program // nil when no size step is provably within the limit
	fastUpTo uint64
}

// pick returns the program for an input whose largest string, list or map
// has size n.
func (p *program) pick(n uint64) cel.Program {
	if p.fast != nil && n <= p.fastUpTo {
		return p.fast
	}
	return p.tracked
}

// newProgram plans ast: the tracked program always, and the fast one for
// the largest size step whose estimated worst case is within limit.
func newProgram(env *cel.Env, ast *cel.Ast, limit uint64) (*program, error) {
	tracked, err := env.Program(ast, cel.CostLimit(limit), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, err
	}
	p := &program{tracked: tracked}
	for _, n := range sizeSteps {
		est, err := env.EstimateCost(ast, sizeBound(n))
		if err != nil || est.Max > limit {
			break
		}
		p.fastUpTo = n
	}
	if p.fastUpTo > 0 {
		if p.fast, err = env.Program(ast, cel.EvalOptions(cel.OptOptimize)); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// sizeBound tells the cost checker that every value whose size it cannot
// see (everything read from the variables) has at most that many
// elements, characters or bytes.
type sizeBound uint64

func (b sizeBound) EstimateSize(checker.AstNode) *checker.SizeEstimate {
	return &checker.SizeEstimate{Min: 0, Max: uint64(b)}
}

func (sizeBound) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// inputSize is the size of the largest string, byte slice, list or map in
// req, as CEL's size() counts it or more (bytes for strings), or
// math.MaxUint64 for a value it does not know how to measure.
func inputSize(req *Request) uint64 {
	n := uint64(len(req.Tool))
	for _, v := range [...]any{req.Request, req.Object, req.OldObject, req.Params, req.Input} {
		n = max(n, valueSize(v, 0))
	}
	return n
}

func valueSize(v any, depth int) uint64 {
	if depth > maxWalkDepth {
		return math.MaxUint64
	}
	switch v := v.(type) {
	case nil, bool, int, int32, int64, uint, uint32, uint64, float32, float64:
		return 0
	case string:
		return uint64(len(v))
	case []byte:
		return uint64(len(v))
	case map[string]any:
		n := uint64(len(v))
		for k, e := range v {
			n = max(n, uint64(len(k)), valueSize(e, depth+1))
		}
		return n
	case []any:
		n := uint64(len(v))
		for _, e := range v {
			n = max(n, valueSize(e, depth+1))
		}
		return n
	case map[string]string:
		n := uint64(len(v))
		for k, e := range v {
			n = max(n, uint64(len(k)), uint64(len(e)))
		}
		return n
	case []string:
		n := uint64(len(v))
		for _, e := range v {
			n = max(n, uint64(len(e)))
		}
		return n
	default:
		return math.MaxUint64
	}
}

// evalBool runs prog; a result that is not a bool is an error.
func evalBool(p *program, n uint64, vars interpreter.Activation) (bool, error) {
	out, _, err := p.pick(n).Eval(vars)
	if err != nil {
		return false, err
	}
	ok, isBool := out.Value().(bool)
	if !isBool {
		return false, errNotBool(out.Type().TypeName())
	}
	return ok, nil
}
