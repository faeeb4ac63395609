// Package kubernetes holds policyd's Kubernetes manifests (the YAML files in
// this directory, a kustomize base, and the components in components/) and,
// in its tests, their validation against a real kube-apiserver: every
// document is applied with strict field validation, the pod template must
// meet the "restricted" Pod Security Standard, the ServiceAccount's rights
// are asked of the API server with and without drift, and the ConfigMap's
// config file must load as it would in a pod. It has no non-test code. The
// manifests and their choices are in docs/operations.md; the secure
// defaults in docs/security.md.
package kubernetes
