// Package drift runs the drift-detection webhook's integration with the
// cluster and with Kubernetes; the decision itself is the pure admission
// package. Objects resolves parents and namespaces from informers, Sink
// turns a decision's effects into ObserveDrift Raft commands proposed in
// the background, and Followup is the leader's worker that patches parents
// and delivers DriftReport callbacks, once per drift, recording each
// through Raft. Deduplication itself is the store's (internal/store). See
// docs/drift.md.
package drift
