// Package v1alpha1 holds the Go types of policyd's Kubernetes resources,
// ToolPolicy and ValidatingPolicy (group policyd.io), from which
// controller-gen generates the deep copies and the CRDs in
// deploy/kubernetes/crds/. The Kubernetes source reads them
// (docs/sources.md#kubernetes).
//
// +kubebuilder:object:generate=true
// +groupName=policyd.io
package v1alpha1

//go:generate controller-gen object paths=.
//go:generate controller-gen crd paths=. output:crd:artifacts:config=../../../deploy/kubernetes/crds
