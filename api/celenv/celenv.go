// Package celenv holds the one definition of the CEL environment that
// ValidatingPolicy expressions are compiled in. It lives under api/ because
// it is part of the contract between the server, which checks expressions at
// write time (package policy), and the sidecar SDK, which evaluates them
// (package client); the SDK may import only api, so this is the one place
// both can share it.
package celenv

import (
	"fmt"

	"github.com/google/cel-go/cel"
)

// MaxExpressionLen is the longest expression accepted, in code points.
const MaxExpressionLen = 4096

// variables are the variables an expression may use, all of type dyn:
// object and oldObject (a Kubernetes-style resource and its previous
// version), request (the request's attributes, e.g. method, path, headers),
// params (policy parameters), tool and input (an agent's tool call).
var variables = []string{"object", "oldObject", "request", "params", "tool", "input"}

// New returns the environment: the standard library plus variables, with the
// parser's expression size limit at MaxExpressionLen. extra options are
// appended, for a caller that needs more (a test forcing a mismatch).
func New(extra ...cel.EnvOption) (*cel.Env, error) {
	opts := make([]cel.EnvOption, 0, len(variables)+1+len(extra))
	for _, name := range variables {
		opts = append(opts, cel.Variable(name, cel.DynType))
	}
	// The parser counts code points; matching the validator's own limit
	// means an over-long expression gets its clearer message first.
	opts = append(opts, cel.ParserExpressionSizeLimit(MaxExpressionLen))
	opts = append(opts, extra...)
	env, err := cel.NewEnv(opts...)
	if err != nil {
		return nil, fmt.Errorf("create CEL environment: %w", err)
	}
	return env, nil
}
