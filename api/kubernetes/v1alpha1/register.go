package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group of policyd's resources.
const Group = "policyd.io"

// GroupVersion is the group and version these types are served at.
var GroupVersion = schema.GroupVersion{Group: Group, Version: "v1alpha1"}

// The resources, for dynamic clients and RBAC.
var (
	ToolPolicies       = GroupVersion.WithResource("toolpolicies")
	ValidatingPolicies = GroupVersion.WithResource("validatingpolicies")
)

// AddToScheme registers the types with a scheme, for typed clients and
// decoders.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ToolPolicy{}, &ToolPolicyList{}, &ValidatingPolicy{}, &ValidatingPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
