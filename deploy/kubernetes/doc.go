// Package kubernetes holds policyd's Kubernetes manifests (the YAML files in
// this directory, a kustomize base, and the components in components/) and,
// in its tests, their validation against a real kube-apiserver: every
// document is applied with strict field validation (cert-manager's objects
// against a minimal copy of its CRDs in testdata/), the pod template must
// meet the "restricted" Pod Security Standard without a warning, the
// ServiceAccount's rights are asked of the API server with and without
// drift, and the config file in the ConfigMap must load and validate as it
// would in a pod, given the environment the StatefulSet sets.
//
// Secure by default (docs/security.md): sidecars authenticate with JWTs
// (auth.mode: jwt, the issuer's public keys from a Secret), the admin API
// with tokens, and peers with node certificates AND the cluster secret, so
// that either leaking alone opens nothing. HTTP, gRPC and Raft run TLS.
//
// Decisions the design leaves open, recorded here:
//   - Certificates come from Secrets the operator creates (the base), or
//     from cert-manager (components/cert-manager), which issues the same
//     two Secrets: policyd-tls (HTTPS, gRPC, the drift webhook) and
//     policyd-node-tls (the peer plane). Two self-signed CAs, so that the
//     peer plane trusts a CA that signs node certificates only.
//   - One node certificate names every replica (URI SANs
//     spiffe://policyd/node/<pod>, DNS names <pod>.policyd-raft), because
//     a StatefulSet mounts the same Secret in every pod. A leaked key can
//     then pose as any replica; docs/security.md shows the per-pod
//     alternative (cert-manager's csi-driver).
//   - http.tls has no client CA: the kubelet's probes present no
//     certificate. The admin API shares the HTTP port with the WebSocket
//     feed, so it also answers through the sidecars' Service; admin tokens
//     protect it, and policyd-admin is the Service to expose to operators.
//   - Drift detection is a component (components/drift): without it the
//     ServiceAccount has no cluster-wide rights. Its keys reach the pods as
//     POLICYD_DRIFT_* from an optional ConfigMap (envFrom), so the
//     component only adds objects and patches none; the tests render the
//     base and components by reading their resource lists, and compare
//     with `kubectl kustomize` where it is installed.
//   - The drift read role names the built-in parent kinds, never Secrets;
//     parents of other kinds need their resources added by the operator.
//   - Peers are addressed as <pod>.<headless service> (resolved through the
//     pod's DNS search path), so the config works in any namespace and
//     cluster domain; the webhook's service reference, the reload Role and
//     the certificates' DNS names name the namespace.
//   - podManagementPolicy is Parallel: with OrderedReady the second pod would
//     wait for the first to be ready, which needs a leader, which needs the
//     second pod.
//   - The headless service publishes not-ready addresses, because peers must
//     find each other before any of them can become ready.
//   - Zone and node spread is ScheduleAnyway, so the pods schedule on
//     clusters with fewer zones or none labelled.
//   - GOMEMLIMIT is the container's memory limit (downward API).
package kubernetes
