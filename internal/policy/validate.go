package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/cel-go/cel"

	"github.com/policyd/policyd/api/celenv"
)

// ErrInvalid is wrapped by every validation and decoding error, so callers
// can map them all to a 400 with errors.Is(err, ErrInvalid).
var ErrInvalid = errors.New("invalid")

// FieldError is one problem with a request, at a JSON field path such as
// "spec.conditions.patterns[2]", "scope.team" or `labels["tier"]`. Field is
// empty when the problem is with the body as a whole (a syntax error).
type FieldError struct {
	Field  string
	Reason string
}

// Error renders "field: reason", or only the reason when Field is empty.
func (e FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// ValidationError lists every problem found in one request, so that a client
// can fix them all in one round trip. It wraps ErrInvalid.
type ValidationError []FieldError

// Error renders "field: reason; field: reason".
func (v ValidationError) Error() string {
	if len(v) == 0 {
		return ErrInvalid.Error()
	}
	parts := make([]string, len(v))
	for i, fe := range v {
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "; ")
}

// Unwrap returns ErrInvalid.
func (v ValidationError) Unwrap() error { return ErrInvalid }

// err returns v as an error, or a nil error (not a nil ValidationError in a
// non-nil interface) when v is empty.
func (v ValidationError) err() error {
	if len(v) == 0 {
		return nil
	}
	return v
}

func (v *ValidationError) add(field, format string, args ...any) {
	*v = append(*v, FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// addPrefixed adds the field errors of err, which came from decoding or
// checking a nested document, under prefix.
func (v *ValidationError) addPrefixed(prefix string, err error) {
	var ve ValidationError
	if !errors.As(err, &ve) {
		v.add(prefix, "%v", err)
		return
	}
	for _, fe := range ve {
		f := prefix
		switch {
		case fe.Field == "":
		case strings.HasPrefix(fe.Field, "["):
			f += fe.Field
		default:
			f += "." + fe.Field
		}
		*v = append(*v, FieldError{Field: f, Reason: fe.Reason})
	}
}

// Limits on what a policy or employee may hold. They bound the size of what
// every replica stores and every sidecar receives, and the time a sidecar
// spends compiling patterns.
const (
	maxNameLen       = 253
	maxNameLabelLen  = 63
	maxLabels        = 64
	maxLabelKeyLen   = 63
	maxLabelValueLen = 256
	maxPatterns      = 64
	maxPatternLen    = 1024
	maxValidations   = 64
	maxConditions    = 16
	maxExpressionLen = celenv.MaxExpressionLen
	maxEmployeeIDLen = 253
)

// ToolPolicy actions.
const (
	ActionDeny  = "deny"
	ActionAudit = "audit"
	ActionAllow = "allow"
)

// ToolPolicySpec is the spec of a ToolPolicy: what a sidecar does
// when an agent calls tool ToolName with an input matching one of
// Conditions.Patterns (or any input, without conditions).
type ToolPolicySpec struct {
	ToolName   string          `json:"tool_name"`
	Action     string          `json:"action"`
	Reason     string          `json:"reason,omitempty"`
	Conditions *ToolConditions `json:"conditions,omitempty"`
}

// ToolConditions narrows a ToolPolicy to inputs that match one of Patterns,
// each an RE2 regular expression.
type ToolConditions struct {
	Patterns []string `json:"patterns,omitempty"`
}

// ValidatingPolicySpec is the spec of a ValidatingPolicy
// (Kyverno-style): every validation's CEL expression must hold, for the
// requests on which every match condition holds.
type ValidatingPolicySpec struct {
	MatchConditions []MatchCondition `json:"matchConditions,omitempty"`
	Validations     []Validation     `json:"validations"`
}

// MatchCondition narrows a ValidatingPolicy, as in a Kubernetes admission
// policy: the policy applies to a request only when Expression, a CEL
// expression giving a bool, is true. Name identifies it in decisions: a
// Kubernetes qualified name without prefix (1 to 63 letters, digits, '-',
// '_' or '.', starting and ending with a letter or digit), unique within
// the policy.
type MatchCondition struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
}

// Validation is one CEL check. Expression must evaluate to a bool; Message
// says what failed, and Reason optionally classifies it.
type Validation struct {
	Expression string `json:"expression"`
	Message    string `json:"message"`
	Reason     string `json:"reason,omitempty"`
}

// NewCELEnv returns the CEL environment ValidatingPolicy expressions are
// compiled in, shared with the sidecar SDK through package celenv so that an
// expression accepted here compiles there too.
func NewCELEnv() (*cel.Env, error) {
	return celenv.New()
}

// Validator checks policies and employees before they are proposed to Raft.
// It is safe for concurrent use.
type Validator struct {
	kinds    map[string]bool // accepted kinds, built-in and extra
	accepted string          // the accepted kinds, for error messages
	env      *cel.Env
}

var (
	kindRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,62}$`)

	defaultValidator = sync.OnceValues(func() (*Validator, error) { return NewValidator(nil) })
)

// NewValidator returns a Validator that accepts the built-in kinds plus
// extraKinds, whose spec may be any JSON object. An extra kind must look like
// a Kubernetes kind (an upper-case letter, then letters and digits, at most 63
// characters) and must not be a built-in kind.
func NewValidator(extraKinds []string) (*Validator, error) {
	v := &Validator{kinds: map[string]bool{KindToolPolicy: true, KindValidatingPolicy: true}}
	extra := make([]string, 0, len(extraKinds))
	for _, k := range extraKinds {
		switch {
		case k == KindToolPolicy || k == KindValidatingPolicy:
			return nil, fmt.Errorf("extra kind %q: is a built-in kind", k)
		case !kindRE.MatchString(k):
			return nil, fmt.Errorf("extra kind %q: must be an upper-case letter followed by up to 62 letters or digits", k)
		case v.kinds[k]:
			continue // listed twice: harmless
		}
		v.kinds[k] = true
		extra = append(extra, k)
	}
	slices.Sort(extra)
	v.accepted = strings.Join(append([]string{KindToolPolicy, KindValidatingPolicy}, extra...), ", ")

	env, err := NewCELEnv()
	if err != nil {
		return nil, err
	}
	v.env = env
	return v, nil
}

// validator lets a nil *Validator mean "built-in kinds only".
func (v *Validator) validator() *Validator {
	if v != nil {
		return v
	}
	d, err := defaultValidator()
	if err != nil {
		// The environment is fixed at build time; failing here is a bug.
		panic(err)
	}
	return d
}

// Policy checks p and returns nil or a ValidationError listing every
// problem found. It checks the fields a client sets; it ignores Revision,
// CreatedAt and UpdatedAt, which the cluster manages.
func (v *Validator) Policy(p *Policy) error {
	v = v.validator()
	errs, spec := v.shape(p)
	switch {
	case spec == nil:
	case p.Kind == KindToolPolicy:
		checkToolPolicy(&errs, spec)
	case p.Kind == KindValidatingPolicy:
		v.checkValidatingPolicy(&errs, spec)
	}
	return errs.err()
}

// Shape checks what Policy checks except the kind's own rules for its spec,
// which need the spec decoded: the name, kind, scope and labels, and that
// the spec is a well-formed JSON object. The leader checks a typed command
// forwarded by a peer this way; the node that took the write ran Policy.
func (v *Validator) Shape(p *Policy) error {
	errs, _ := v.validator().shape(p)
	return errs.err()
}

// shape is Shape, returning the spec trimmed when it is a JSON object.
func (v *Validator) shape(p *Policy) (ValidationError, []byte) {
	var errs ValidationError
	if err := checkPolicyName(p.Name); err != "" {
		errs.add("name", "%s", err)
	}
	switch {
	case p.Kind == "":
		errs.add("kind", "required")
	case !v.kinds[p.Kind]:
		errs.add("kind", "unknown kind %q (accepted: %s)", p.Kind, v.accepted)
	}
	checkScope(&errs, p.Scope)
	checkLabels(&errs, p.Labels)
	switch p.Enforcement {
	case "", EnforcementEnforce, EnforcementShadow:
	default:
		errs.add("enforcement", "must be %s or %s, got %q", EnforcementEnforce, EnforcementShadow, p.Enforcement)
	}

	spec := bytes.TrimSpace(p.Spec)
	switch {
	case len(spec) == 0 || string(spec) == "null":
		errs.add("spec", "required")
	case spec[0] != '{' || !jsontext.Value(spec).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)):
		errs.add("spec", "must be a JSON object")
	default:
		return errs, spec
	}
	return errs, nil
}

// Employee checks e and returns nil or a ValidationError listing every
// problem found. Status must be set: DecodeEmployee defaults it.
func (v *Validator) Employee(e *Employee) error {
	var errs ValidationError
	if err := checkEmployeeID(e.ID); err != "" {
		errs.add("id", "%s", err)
	}
	if e.Org == "" {
		errs.add("org", "required")
	} else if err := checkOrgOrTeam(e.Org); err != "" {
		errs.add("org", "%s", err)
	}
	if e.Team != "" {
		if err := checkOrgOrTeam(e.Team); err != "" {
			errs.add("team", "%s", err)
		}
	}
	switch e.Status {
	case StatusActive, StatusInactive:
	case "":
		errs.add("status", "required")
	default:
		errs.add("status", "must be %s or %s, got %q", StatusActive, StatusInactive, e.Status)
	}
	return errs.err()
}

// ValidPolicyName checks a policy name, for example from a URL path. The
// error is a ValidationError on field "name".
func ValidPolicyName(name string) error {
	if err := checkPolicyName(name); err != "" {
		return ValidationError{{Field: "name", Reason: err}}
	}
	return nil
}

// ValidEmployeeID checks an employee id, for example from a URL path. The
// error is a ValidationError on field "id".
func ValidEmployeeID(id string) error {
	if err := checkEmployeeID(id); err != "" {
		return ValidationError{{Field: "id", Reason: err}}
	}
	return nil
}

// ValidOrg checks an org name (the rule for teams is the same), for example
// from a query parameter. The error is a ValidationError on field "org".
func ValidOrg(org string) error {
	if err := checkOrgOrTeam(org); err != "" {
		return ValidationError{{Field: "org", Reason: err}}
	}
	return nil
}

// ValidTeam checks a team name, for example from a query parameter. The
// error is a ValidationError on field "team".
func ValidTeam(team string) error {
	if err := checkOrgOrTeam(team); err != "" {
		return ValidationError{{Field: "team", Reason: err}}
	}
	return nil
}

var (
	nameLabelRE  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	orgTeamRE    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?$`)
	employeeIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,252}$`)
	labelKeyRE   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$`)
	// conditionRE is the name part of a Kubernetes qualified name, which
	// is what Kubernetes requires of a match condition's name.
	conditionRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
)

// The check functions return a reason, or "" when the value is valid. They
// return strings rather than errors because each caller attaches its own
// field path.

func checkPolicyName(name string) string {
	if name == "" {
		return "required"
	}
	if len(name) > maxNameLen {
		return fmt.Sprintf("must be at most %d characters, got %d", maxNameLen, len(name))
	}
	for label := range strings.SplitSeq(name, ".") {
		if !nameLabelRE.MatchString(label) {
			return "must be a lowercase DNS-1123 subdomain: dot-separated labels of lowercase letters, digits and '-', each starting and ending with a letter or digit"
		}
		if len(label) > maxNameLabelLen {
			return fmt.Sprintf("each dot-separated label must be at most %d characters", maxNameLabelLen)
		}
	}
	return ""
}

func checkOrgOrTeam(s string) string {
	if !orgTeamRE.MatchString(s) {
		return "must be 1 to 63 lowercase letters, digits, '-', '.' or '_', starting and ending with a letter or digit"
	}
	return ""
}

func checkEmployeeID(id string) string {
	if id == "" {
		return "required"
	}
	if !employeeIDRE.MatchString(id) {
		return fmt.Sprintf("must be 1 to %d letters, digits, '.', '_', '@', '+' or '-', starting with a letter or digit", maxEmployeeIDLen)
	}
	return ""
}

func checkScope(errs *ValidationError, s Scope) {
	if s.Org == "" && (s.Team != "" || s.Employee != "") {
		// A team or employee name is only unique within its org.
		errs.add("scope.org", "required when scope.team or scope.employee is set")
	}
	if s.Org != "" {
		if err := checkOrgOrTeam(s.Org); err != "" {
			errs.add("scope.org", "%s", err)
		}
	}
	if s.Team != "" {
		if err := checkOrgOrTeam(s.Team); err != "" {
			errs.add("scope.team", "%s", err)
		}
	}
	if s.Employee != "" {
		if err := checkEmployeeID(s.Employee); err != "" {
			errs.add("scope.employee", "%s", err)
		}
	}
}

func checkLabels(errs *ValidationError, labels map[string]string) {
	if len(labels) > maxLabels {
		errs.add("labels", "at most %d labels, got %d", maxLabels, len(labels))
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys) // errors in a stable order
	for _, k := range keys {
		field := fmt.Sprintf("labels[%q]", k)
		switch {
		case len(k) > maxLabelKeyLen:
			errs.add(field, "key must be at most %d characters", maxLabelKeyLen)
		case !labelKeyRE.MatchString(k):
			errs.add(field, "key must be letters, digits, '-', '_', '.' or '/', starting and ending with a letter or digit")
		}
		if n := utf8.RuneCountInString(labels[k]); n > maxLabelValueLen {
			errs.add(field, "value must be at most %d characters, got %d", maxLabelValueLen, n)
		}
	}
}

// decodeSpec strictly decodes spec into v and returns the decoding errors
// under "spec". When there are some, it still fills v leniently so that the
// caller can report the spec's other problems in the same response.
func decodeSpec(spec []byte, v any) ValidationError {
	err := DecodeStrict(spec, v)
	if err == nil {
		return nil
	}
	var errs ValidationError
	errs.addPrefixed("spec", err)
	_ = json.Unmarshal(spec, v) // best effort; its errors are the ones reported above
	return errs
}

// addSpecErrors adds a spec's decoding errors, then its semantic problems
// except those at or under a field that failed to decode: the lenient decode
// left that field empty, and "required" would only repeat the type error.
func addSpecErrors(errs *ValidationError, decodeErrs, problems ValidationError) {
	*errs = append(*errs, decodeErrs...)
	for _, fe := range problems {
		if !slices.ContainsFunc(decodeErrs, func(de FieldError) bool {
			return fe.Field == de.Field || strings.HasPrefix(fe.Field, de.Field+".") || strings.HasPrefix(fe.Field, de.Field+"[")
		}) {
			*errs = append(*errs, fe)
		}
	}
}

func checkToolPolicy(errs *ValidationError, spec []byte) {
	var s ToolPolicySpec
	decodeErrs := decodeSpec(spec, &s)
	addSpecErrors(errs, decodeErrs, toolPolicyProblems(&s))
}

func toolPolicyProblems(s *ToolPolicySpec) ValidationError {
	var errs ValidationError
	if s.ToolName == "" {
		errs.add("spec.tool_name", "required")
	}
	switch s.Action {
	case ActionDeny, ActionAudit, ActionAllow:
	case "":
		errs.add("spec.action", "required")
	default:
		errs.add("spec.action", "must be one of %s, %s, %s, got %q", ActionDeny, ActionAudit, ActionAllow, s.Action)
	}
	if s.Conditions == nil {
		return errs
	}
	if n := len(s.Conditions.Patterns); n > maxPatterns {
		// Compiling thousands of patterns only to reject them would waste
		// the node's time.
		errs.add("spec.conditions.patterns", "at most %d patterns, got %d", maxPatterns, n)
		return errs
	}
	for i, p := range s.Conditions.Patterns {
		field := fmt.Sprintf("spec.conditions.patterns[%d]", i)
		if n := utf8.RuneCountInString(p); n > maxPatternLen {
			errs.add(field, "must be at most %d characters, got %d", maxPatternLen, n)
			continue
		}
		if _, err := regexp.Compile(p); err != nil {
			errs.add(field, "invalid regexp: %s", strings.TrimPrefix(err.Error(), "error parsing regexp: "))
		}
	}
	return errs
}

func (v *Validator) checkValidatingPolicy(errs *ValidationError, spec []byte) {
	var s ValidatingPolicySpec
	decodeErrs := decodeSpec(spec, &s)
	addSpecErrors(errs, decodeErrs, v.validatingPolicyProblems(&s))
}

func (v *Validator) validatingPolicyProblems(s *ValidatingPolicySpec) ValidationError {
	var errs ValidationError
	v.matchConditionProblems(&errs, s.MatchConditions)
	switch n := len(s.Validations); {
	case n == 0:
		errs.add("spec.validations", "required: 1 to %d validations", maxValidations)
		return errs
	case n > maxValidations:
		errs.add("spec.validations", "at most %d validations, got %d", maxValidations, n)
		return errs
	}
	for i, val := range s.Validations {
		field := fmt.Sprintf("spec.validations[%d]", i)
		if reason := v.checkExpression(val.Expression); reason != "" {
			errs.add(field+".expression", "%s", reason)
		}
		if val.Message == "" {
			errs.add(field+".message", "required")
		}
	}
	return errs
}

func (v *Validator) matchConditionProblems(errs *ValidationError, conds []MatchCondition) {
	if n := len(conds); n > maxConditions {
		// As for patterns: no point compiling what is rejected anyway.
		errs.add("spec.matchConditions", "at most %d match conditions, got %d", maxConditions, n)
		return
	}
	seen := make(map[string]int, len(conds))
	for i, mc := range conds {
		field := fmt.Sprintf("spec.matchConditions[%d]", i)
		switch first, dup := seen[mc.Name]; {
		case mc.Name == "":
			errs.add(field+".name", "required")
		case !conditionRE.MatchString(mc.Name):
			errs.add(field+".name", "must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
		case dup:
			errs.add(field+".name", "duplicate name %q (also spec.matchConditions[%d])", mc.Name, first)
		default:
			seen[mc.Name] = i
		}
		if reason := v.checkExpression(mc.Expression); reason != "" {
			errs.add(field+".expression", "%s", reason)
		}
	}
}

// checkExpression compiles a CEL expression and returns why it is not
// acceptable, or "".
func (v *Validator) checkExpression(expr string) string {
	if strings.TrimSpace(expr) == "" {
		return "required"
	}
	if n := utf8.RuneCountInString(expr); n > maxExpressionLen {
		return fmt.Sprintf("must be at most %d characters, got %d", maxExpressionLen, n)
	}
	ast, iss := v.env.Compile(expr)
	if iss.Err() != nil {
		// cel-go's own rendering spans several lines with a source snippet;
		// an API error wants one line per problem.
		msgs := make([]string, 0, len(iss.Errors()))
		for _, e := range iss.Errors() {
			msgs = append(msgs, fmt.Sprintf("%d:%d: %s", e.Location.Line(), e.Location.Column()+1, e.Message))
		}
		return "compile error: " + strings.Join(msgs, ", ")
	}
	if out := ast.OutputType(); !out.IsExactType(cel.BoolType) && !out.IsExactType(cel.DynType) {
		return fmt.Sprintf("must evaluate to bool, got %s", out)
	}
	return ""
}
