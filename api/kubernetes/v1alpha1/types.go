package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Annotation and values the Kubernetes source reads and writes.
const (
	// AnnotationAdopt, set to "true", lets the object take over a policy of
	// the same name that the API or another source owns.
	AnnotationAdopt = "policyd.io/adopt"
	// SourceKubernetes is status.source of an object the source reconciled.
	SourceKubernetes = "kubernetes"
)

// Condition types and reasons of status.conditions.
const (
	ConditionAccepted    = "Accepted"
	ConditionRolledOut   = "RolledOut"
	ConditionProgressing = "Progressing"

	ReasonCommitted    = "Committed"
	ReasonInvalid      = "Invalid"
	ReasonConflict     = "Conflict"
	ReasonPruneRefused = "PruneRefused"
	ReasonFailed       = "Failed"

	ReasonAllAcked = "AllAcked"
	ReasonPending  = "Pending"
	ReasonNacked   = "Nacked"

	ReasonStaging = "Staging"
	ReasonIdle    = "Idle"
)

// Scope says who a policy is for; all fields empty means everyone.
type Scope struct {
	// +optional
	Org string `json:"org,omitempty"`
	// +optional
	Team string `json:"team,omitempty"`
	// +optional
	Employee string `json:"employee,omitempty"`
}

// PolicySpec is what every kind's spec holds besides its own fields.
type PolicySpec struct {
	// +optional
	Scope Scope `json:"scope,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Enforcement is enforce (the default) or shadow.
	// +optional
	// +kubebuilder:validation:Enum=enforce;shadow
	Enforcement string `json:"enforcement,omitempty"`
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`
}

// ToolConditions narrows a ToolPolicy to inputs matching one of Patterns
// (RE2).
type ToolConditions struct {
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Patterns []string `json:"patterns,omitempty"`
}

// ToolPolicySpec is what a sidecar does when an agent calls ToolName.
type ToolPolicySpec struct {
	PolicySpec `json:",inline"`
	// +kubebuilder:validation:MinLength=1
	ToolName string `json:"toolName"`
	// +kubebuilder:validation:Enum=deny;audit;allow
	Action string `json:"action"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Conditions *ToolConditions `json:"conditions,omitempty"`
}

// MatchCondition is a CEL expression a request must satisfy for the policy
// to apply to it.
type MatchCondition struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	Expression string `json:"expression"`
}

// Validation is one CEL check and the message given when it fails.
type Validation struct {
	// +kubebuilder:validation:MinLength=1
	Expression string `json:"expression"`
	// +kubebuilder:validation:MinLength=1
	Message string `json:"message"`
	// +optional
	Reason string `json:"reason,omitempty"`
}

// ValidatingPolicySpec holds CEL validations, applied to the requests every
// match condition accepts.
type ValidatingPolicySpec struct {
	PolicySpec `json:",inline"`
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	MatchConditions []MatchCondition `json:"matchConditions,omitempty"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Validations []Validation `json:"validations"`
}

// Sidecars counts the connected sidecars the policy applies to by their
// answer to the newest set holding its revision.
type Sidecars struct {
	Total   int32 `json:"total"`
	Acked   int32 `json:"acked"`
	Nacked  int32 `json:"nacked"`
	Pending int32 `json:"pending"`
}

// PolicyStatus is written by policyd's leader through the status
// subresource.
type PolicyStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Revision is the policy's revision (its Raft index) once committed.
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// +optional
	Source string `json:"source,omitempty"`
	// +optional
	Sidecars *Sidecars `json:"sidecars,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ToolPolicy allows, audits or denies an agent's calls of one tool.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tp,categories=policyd
// +kubebuilder:printcolumn:name="Scope",type=string,JSONPath=`.spec.scope`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="RolledOut",type=string,JSONPath=`.status.conditions[?(@.type=="RolledOut")].status`
// +kubebuilder:printcolumn:name="Acked",type=integer,JSONPath=`.status.sidecars.acked`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ToolPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ToolPolicySpec `json:"spec"`
	// +optional
	Status PolicyStatus `json:"status,omitempty"`
}

// ToolPolicyList is a list of ToolPolicy.
//
// +kubebuilder:object:root=true
type ToolPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ToolPolicy `json:"items"`
}

// ValidatingPolicy checks an agent's requests with CEL expressions.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=vp,categories=policyd
// +kubebuilder:printcolumn:name="Scope",type=string,JSONPath=`.spec.scope`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="RolledOut",type=string,JSONPath=`.status.conditions[?(@.type=="RolledOut")].status`
// +kubebuilder:printcolumn:name="Acked",type=integer,JSONPath=`.status.sidecars.acked`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ValidatingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ValidatingPolicySpec `json:"spec"`
	// +optional
	Status PolicyStatus `json:"status,omitempty"`
}

// ValidatingPolicyList is a list of ValidatingPolicy.
//
// +kubebuilder:object:root=true
type ValidatingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ValidatingPolicy `json:"items"`
}
