package benchset

import (
	"slices"
	"testing"

	"github.com/policyd/policyd/internal/policy"
)

// The node would refuse a policy the validator refuses, and the scenario
// would fail only after starting it.
func TestPoliciesValid(t *testing.T) {
	v, err := policy.NewValidator(nil)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	var validating []string
	for name, doc := range Policies() {
		p, err := policy.DecodePolicy(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := v.Policy(p); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if p.Name != name || p.Scope.Org != Org {
			t.Errorf("%s: name %q, org %q", name, p.Name, p.Scope.Org)
		}
		kinds[p.Kind]++
		if p.Kind == policy.KindValidatingPolicy {
			validating = append(validating, name)
		}
	}
	if kinds[policy.KindValidatingPolicy] != 20 || kinds[policy.KindToolPolicy] != 20 || len(kinds) != 2 {
		t.Errorf("kinds = %v, want 20 ValidatingPolicies and 20 ToolPolicies", kinds)
	}
	// The deny case is meant to run every policy before the one denying.
	slices.Sort(validating)
	if got := validating[len(validating)-1]; got != DenyingPolicy {
		t.Errorf("last ValidatingPolicy is %s, want %s", got, DenyingPolicy)
	}
}
