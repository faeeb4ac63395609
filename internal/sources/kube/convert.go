package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/sources"
)

// object is what conversion needs of a resource, whether it comes from an
// informer's cache or from an admission review.
type object struct {
	Kind       string
	Name       string
	Generation int64
	Adopt      bool
	Spec       json.RawMessage // the resource's spec, camelCase
}

// objectName names a resource for operators: "ToolPolicy acme.deny-shell".
func objectName(kind, name string) string { return kind + " " + name }

// convert turns a resource into the policy it declares. Its error is a
// policy.ValidationError whose fields use the resource's camelCase paths.
func convert(o object) (sources.Declared, error) {
	d := sources.Declared{Object: objectName(o.Kind, o.Name), Adopt: o.Adopt, Generation: o.Generation}
	var (
		common  v1alpha1.PolicySpec
		spec    any
		decoded error
	)
	switch o.Kind {
	case policy.KindToolPolicy:
		var s v1alpha1.ToolPolicySpec
		decoded = decodeSpec(o.Spec, &s)
		common = s.PolicySpec
		ps := policy.ToolPolicySpec{ToolName: s.ToolName, Action: s.Action, Reason: s.Reason}
		if s.Conditions != nil {
			ps.Conditions = &policy.ToolConditions{Patterns: s.Conditions.Patterns}
		}
		spec = ps
	case policy.KindValidatingPolicy:
		var s v1alpha1.ValidatingPolicySpec
		decoded = decodeSpec(o.Spec, &s)
		common = s.PolicySpec
		ps := policy.ValidatingPolicySpec{}
		for _, mc := range s.MatchConditions {
			ps.MatchConditions = append(ps.MatchConditions, policy.MatchCondition{Name: mc.Name, Expression: mc.Expression})
		}
		for _, v := range s.Validations {
			ps.Validations = append(ps.Validations, policy.Validation{Expression: v.Expression, Message: v.Message, Reason: v.Reason})
		}
		spec = ps
	default:
		return d, policy.ValidationError{{Field: "kind", Reason: fmt.Sprintf("unknown kind %q (accepted: %s, %s)", o.Kind, policy.KindToolPolicy, policy.KindValidatingPolicy)}}
	}
	if decoded != nil {
		return d, decoded
	}
	raw, err := json.Marshal(spec)
	if err != nil { // plain strings and slices: a failure is a bug
		return d, fmt.Errorf("encode %s spec: %w", o.Kind, err)
	}
	d.Policy = &policy.Policy{
		Name:        o.Name,
		Kind:        o.Kind,
		Scope:       policy.Scope{Org: common.Scope.Org, Team: common.Scope.Team, Employee: common.Scope.Employee},
		Labels:      common.Labels,
		Enforcement: common.Enforcement,
		Spec:        raw,
	}
	if common.Rollout != nil {
		r, err := convertRollout(common.Rollout)
		if err != nil {
			return d, err
		}
		d.Rollout = r
	}
	return d, nil
}

// decodeSpec strictly decodes a resource's spec, with errors under "spec".
func decodeSpec(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return policy.ValidationError{{Field: "spec", Reason: "required"}}
	}
	err := policy.DecodeStrict(raw, v)
	if err == nil {
		return nil
	}
	var ve policy.ValidationError
	if !errors.As(err, &ve) {
		return policy.ValidationError{{Field: "spec", Reason: err.Error()}}
	}
	out := make(policy.ValidationError, len(ve))
	for i, fe := range ve {
		out[i] = policy.FieldError{Field: joinField("spec", fe.Field), Reason: fe.Reason}
	}
	return out
}

func joinField(prefix, field string) string {
	switch {
	case field == "":
		return prefix
	case strings.HasPrefix(field, "["):
		return prefix + field
	}
	return prefix + "." + field
}

// camelFields maps the REST API's snake_case spec fields to the resources'
// camelCase ones, so that a message names the field the author wrote.
var camelFields = strings.NewReplacer("spec.tool_name", "spec.toolName")

// kubeMessage rewrites a validation message for a resource's author.
func kubeMessage(msg string) string { return camelFields.Replace(msg) }

// objectError is a conversion failure as the engine takes it.
func objectError(o object, err error) sources.ObjectError {
	oe := sources.ObjectError{Object: objectName(o.Kind, o.Name), Name: o.Name, Message: kubeMessage(err.Error())}
	var ve policy.ValidationError
	if errors.As(err, &ve) && len(ve) > 0 {
		oe.Field = kubeMessage(ve[0].Field)
		oe.Message = ve[0].Reason
		if len(ve) > 1 {
			oe.Message += "; " + kubeMessage(ve[1:].Error())
		}
	}
	return oe
}
