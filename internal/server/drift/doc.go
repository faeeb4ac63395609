// Package drift runs the drift-detection webhook's integration with the
// cluster and with Kubernetes (docs/drift.md); the decision itself is the
// pure admission package.
//
//   - Objects resolves parents and namespaces from informers, started for a
//     parent kind the first time a request names it (RESTMapper from
//     discovery), so the hot path makes no API call. A miss falls back to a
//     GET: an informer that has not synced yet, or an object created since
//     its last event. A decision that would be drift is confirmed on a GET
//     of the parent (FreshParent): a real controller acts on a spec change
//     within milliseconds, often before the cache has seen it.
//   - Sink turns a decision's effects into ObserveDrift Raft commands. It
//     queues them and proposes in the background: a webhook answer never
//     waits for a Raft commit, and an election does not time out the API
//     server's call. The cost is that effects queued on a node that dies
//     before proposing them are lost; the controller's next attempt at the
//     same drift reports it again.
//   - Followup is the leader's worker (a LeaderTask). It performs the tasks
//     the FSM keeps: annotation patches of parents (controllers backup,
//     phase, consumed and stale approvals) and DriftReport callbacks, and
//     records what it did through Raft.
//
// # Exactly one report per drift
//
// The API server calls every node's webhook, so one drift is observed up to
// once per node. Deduplication is in the FSM (internal/store/drift.go), in log order:
// the first Detected of an id opens a delivery task, the others only count.
// The leader delivers a task to each callback URL and records each URL's
// success through Raft before it is forgotten; a new leader resumes the
// tasks left, skipping URLs recorded as delivered. A report can still be
// POSTed twice to one URL if a leader dies between the receiver's 2xx and
// the commit of that record; the report id is stable, so receivers can
// drop the repeat.
//
// # Retries
//
// A callback is retried with exponential backoff (Retry.Initial doubling to
// Retry.Max) until it has been attempted Retry.Attempts times; a 4xx answer
// other than 408 and 429 is final at once, as the receiver refused the
// report itself. Reports of one parent/child pair are delivered in order: a
// Resolved waits for its Detected.
package drift
