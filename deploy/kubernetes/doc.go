// Package kubernetes holds policyd's Kubernetes manifests (the YAML files in
// this directory) and, in its tests, their validation against a real
// kube-apiserver: every document is created with strict field validation, the
// pod template must meet the "restricted" Pod Security Standard without a
// warning, and the config file in the ConfigMap must load and validate as it
// would in a pod, given the environment the StatefulSet sets.
//
// Decisions the design leaves open, recorded here:
//   - Peers are addressed as <pod>.<headless service> (resolved through the
//     pod's DNS search path), so the manifests work in any namespace and
//     cluster domain; only the webhook's service reference and the reload
//     Role name a namespace.
//   - podManagementPolicy is Parallel: with OrderedReady the second pod would
//     wait for the first to be ready, which needs a leader, which needs the
//     second pod.
//   - The headless service publishes not-ready addresses, because peers must
//     find each other before any of them can become ready.
package kubernetes
