package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// Tool policy actions.
const (
	ActionDeny  = "deny"
	ActionAudit = "audit"
	ActionAllow = "allow"
)

// WildcardTool as a tool_name matches every tool.
const WildcardTool = "*"

// maxInputDepth bounds the walk through a tool input. Deeper input is
// treated as matching every pattern (fail closed), so nesting cannot be used
// to hide a string from a deny policy.
const maxInputDepth = 64

// toolSpec is the spec of a ToolPolicy.
type toolSpec struct {
	ToolName   string `json:"tool_name"`
	Action     string `json:"action"`
	Reason     string `json:"reason"`
	Conditions struct {
		Patterns []string `json:"patterns"`
	} `json:"conditions"`
}

// rule is one compiled ToolPolicy.
type rule struct {
	name     string
	spec     json.RawMessage // what it was compiled from, for reuse
	tool     string
	action   string
	reason   string
	patterns []*regexp.Regexp
}

// toolRules are the rules that can apply to one tool, in name order.
// allow rules are left out: they never change the decision.
type toolRules struct {
	deny, audit []*rule
}

// ruleSet is the compiled, immutable form of a policy set.
type ruleSet struct {
	byTool   map[string]*toolRules // tool-specific rules merged with the wildcard ones
	wildcard toolRules             // for tools no policy names
	// rules is every ToolPolicy's rule, allow rules included, in the set's
	// order (by name): the next compile reuses them by walking both sets
	// side by side, without a map to build or hash into on every update.
	rules []*rule
}

var emptyRules = &ruleSet{byTool: map[string]*toolRules{}}

// compileRules compiles the ToolPolicies of set (sorted by name), reusing
// the compiled form from prev for policies whose spec has not changed. When
// nothing changed it returns prev itself. A set out of order is still
// compiled right; it only reuses less.
func compileRules(set []Policy, prev *ruleSet) (*ruleSet, error) {
	var old []*rule
	if prev != nil {
		old = prev.rules
	}
	same := prev != nil
	rules := make([]*rule, 0, len(set))
	for _, p := range set {
		if p.Kind != KindToolPolicy {
			continue
		}
		// Equality first: names are usually the same, and often the
		// same string, which compares without reading it.
		for len(old) > 0 && old[0].name != p.Name && old[0].name < p.Name {
			old, same = old[1:], false // a policy that went
		}
		if len(old) > 0 && old[0].name == p.Name && bytes.Equal(old[0].spec, p.Spec) {
			rules = append(rules, old[0])
			old = old[1:]
			continue
		}
		r, err := compileRule(p)
		if err != nil {
			return nil, err
		}
		rules, same = append(rules, r), false
	}
	if same && len(old) == 0 {
		return prev, nil
	}
	rs := &ruleSet{byTool: map[string]*toolRules{}, rules: rules}
	var specific []*rule
	for _, r := range rules {
		if r.action == ActionAllow {
			continue
		}
		if r.tool == WildcardTool {
			rs.wildcard.add(r)
		} else {
			specific = append(specific, r)
		}
	}
	for _, r := range specific {
		if rs.byTool[r.tool] == nil {
			rs.byTool[r.tool] = &toolRules{}
		}
		rs.byTool[r.tool].add(r)
	}
	for _, tr := range rs.byTool {
		tr.deny = mergeByName(tr.deny, rs.wildcard.deny)
		tr.audit = mergeByName(tr.audit, rs.wildcard.audit)
	}
	return rs, nil
}

func (tr *toolRules) add(r *rule) {
	if r.action == ActionDeny {
		tr.deny = append(tr.deny, r)
	} else {
		tr.audit = append(tr.audit, r)
	}
}

func mergeByName(a, b []*rule) []*rule {
	if len(b) == 0 {
		return a
	}
	out := append(slices.Clip(a), b...)
	slices.SortStableFunc(out, func(x, y *rule) int { return strings.Compare(x.name, y.name) })
	return out
}

func compileRule(p Policy) (*rule, error) {
	var s toolSpec
	if err := json.Unmarshal(p.Spec, &s); err != nil {
		return nil, fmt.Errorf("policy %s: ToolPolicy spec: %w", p.Name, err)
	}
	if s.ToolName == "" {
		return nil, fmt.Errorf("policy %s: spec.tool_name is required", p.Name)
	}
	switch s.Action {
	case ActionDeny, ActionAudit, ActionAllow:
	default:
		return nil, fmt.Errorf("policy %s: spec.action %q: want deny, audit or allow", p.Name, s.Action)
	}
	r := &rule{name: p.Name, spec: p.Spec, tool: s.ToolName, action: s.Action, reason: s.Reason}
	for i, pat := range s.Conditions.Patterns {
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, fmt.Errorf("policy %s: spec.conditions.patterns[%d]: %w", p.Name, i, err)
		}
		r.patterns = append(r.patterns, re)
	}
	return r, nil
}

func (rs *ruleSet) rulesFor(tool string) *toolRules {
	if tr := rs.byTool[tool]; tr != nil {
		return tr
	}
	return &rs.wildcard
}

// callInput is a tool call's input with its string leaves collected on
// first use.
type callInput struct {
	v       map[string]any
	done    bool
	tooDeep bool
	leaves  []string
	buf     [8]string // leaves of small inputs, without allocating
}

func (in *callInput) stringLeaves() ([]string, bool) {
	if !in.done {
		in.done = true
		in.leaves, in.tooDeep = appendLeaves(in.buf[:0], reflect.Value{}, in.v, 0)
	}
	return in.leaves, in.tooDeep
}

// matches reports whether r applies to the call.
func (r *rule) matches(in *callInput) bool {
	if len(r.patterns) == 0 {
		return true
	}
	leaves, tooDeep := in.stringLeaves()
	if tooDeep {
		return true
	}
	for _, re := range r.patterns {
		for _, s := range leaves {
			if re.MatchString(s) {
				return true
			}
		}
	}
	return false
}

// appendLeaves appends the string leaves of v (or of rv, when rv is valid)
// and reports whether the walk went deeper than maxInputDepth.
func appendLeaves(dst []string, rv reflect.Value, v any, depth int) ([]string, bool) {
	if depth > maxInputDepth {
		return dst, true
	}
	deep, d := false, false
	if !rv.IsValid() {
		switch x := v.(type) {
		case nil, bool, float64, float32, int, int64, int32, uint, uint64, uint32, json.Number, []byte:
			return dst, false
		case string:
			return append(dst, x), false
		case []string:
			return append(dst, x...), false
		case map[string]string:
			for _, s := range x {
				dst = append(dst, s)
			}
			return dst, false
		case map[string]any:
			for _, e := range x {
				dst, d = appendLeaves(dst, reflect.Value{}, e, depth+1)
				deep = deep || d
			}
			return dst, deep
		case []any:
			for _, e := range x {
				dst, d = appendLeaves(dst, reflect.Value{}, e, depth+1)
				deep = deep || d
			}
			return dst, deep
		}
		rv = reflect.ValueOf(v)
	}
	switch rv.Kind() {
	case reflect.String:
		dst = append(dst, rv.String())
	case reflect.Pointer, reflect.Interface:
		if !rv.IsNil() {
			dst, deep = appendLeaves(dst, rv.Elem(), nil, depth+1)
		}
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			break // bytes are not text
		}
		for i := range rv.Len() {
			dst, d = appendLeaves(dst, rv.Index(i), nil, depth+1)
			deep = deep || d
		}
	case reflect.Map:
		it := rv.MapRange()
		for it.Next() {
			dst, d = appendLeaves(dst, it.Value(), nil, depth+1)
			deep = deep || d
		}
	default:
	}
	return dst, deep
}
