package command

import (
	"fmt"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
)

// PutPolicy builds the command that stores p: its spec canonicalised once,
// here, on the node that took the write (server-managed fields are dropped;
// the FSM sets them).
func PutPolicy(p *policy.Policy, ifMatch *uint64) (*Command, error) {
	spec, err := p.CanonicalSpec()
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", p.Name, err)
	}
	pb := &commandv1.Policy{
		Name: p.Name, Kind: p.Kind, Labels: p.Labels, Spec: spec,
		Enforcement: policy.CanonicalEnforcement(p.Enforcement),
		Scope:       &commandv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
	}
	return New(&commandv1.PutPolicy{Policy: pb, IfMatch: precondition(ifMatch)})
}

// PolicyOf is the policy a typed command carries. The spec aliases the
// message's bytes, which proto.Unmarshal owns.
func PolicyOf(pb *commandv1.Policy) *policy.Policy {
	sc := pb.GetScope()
	return &policy.Policy{
		Name: pb.GetName(), Kind: pb.GetKind(), Labels: pb.GetLabels(), Spec: pb.GetSpec(),
		Enforcement: pb.GetEnforcement(),
		Scope:       policy.Scope{Org: sc.GetOrg(), Team: sc.GetTeam(), Employee: sc.GetEmployee()},
	}
}

// PutEmployee builds the command that stores e.
func PutEmployee(e *policy.Employee, ifMatch *uint64) (*Command, error) {
	pb := &commandv1.Employee{Id: e.ID, Org: e.Org, Team: e.Team, Status: e.Status}
	return New(&commandv1.PutEmployee{Employee: pb, IfMatch: precondition(ifMatch)})
}

// EmployeeOf is the employee a typed command carries.
func EmployeeOf(pb *commandv1.Employee) *policy.Employee {
	return &policy.Employee{ID: pb.GetId(), Org: pb.GetOrg(), Team: pb.GetTeam(), Status: pb.GetStatus()}
}

// DeletePolicy builds the command that deletes a policy.
func DeletePolicy(name string, ifMatch *uint64) (*Command, error) {
	return New(&commandv1.DeletePolicy{Name: name, IfMatch: precondition(ifMatch)})
}

// DeleteEmployee builds the command that deletes an employee.
func DeleteEmployee(id string, ifMatch *uint64) (*Command, error) {
	return New(&commandv1.DeleteEmployee{Id: id, IfMatch: precondition(ifMatch)})
}

// PolicyMessage is p as a command carries it, its spec canonicalised.
func PolicyMessage(p *policy.Policy) (*commandv1.Policy, error) {
	spec, err := p.CanonicalSpec()
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", p.Name, err)
	}
	return &commandv1.Policy{
		Name: p.Name, Kind: p.Kind, Labels: p.Labels, Spec: spec,
		Enforcement: policy.CanonicalEnforcement(p.Enforcement),
		Scope:       &commandv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
	}, nil
}
