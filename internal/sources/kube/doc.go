// Package kube is the Kubernetes source's driver: it watches ToolPolicy and
// ValidatingPolicy resources (api/kubernetes/v1alpha1) with informers on the
// leader, turns them into declared policies, writes each object's outcome
// and rollout back through the status subresource in batches, and serves
// the validating admission webhook for the two kinds. See
// docs/sources.md#kubernetes.
package kube
