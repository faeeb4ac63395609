// Package admission is policyd's drift detection (seed 001, DESIGN part 7):
// a pure decision function, Decide, and an http.Handler for AdmissionReview
// admission.k8s.io/v1 that resolves the parent and calls it. Follow-up work
// (annotation backups on parents, consumed approvals, drift reports) is
// returned as Effects, which the server proposes through Raft so that the
// leader alone performs it.
//
// # Decisions where seed 001 and DESIGN leave room
//
//   - Spec. Drift compares the spec field. A kind without one (ConfigMap,
//     Secret, Role) compares its top-level fields except apiVersion, kind,
//     metadata and status, so spec-less children are not silently exempt.
//     CREATE and DELETE always count as spec changes.
//   - User annotations without a spec change. The seed's UPDATE table says
//     to preserve everything from the old object when the spec is
//     unchanged; for a controller we do (it is syncing stale copies from
//     its parent), but anyone else may change user annotations (approvals,
//     rejections, freeze, snooze, mode, trace-*) in a metadata-only write,
//     the computeAnnotationsForUser column, or no one could ever approve.
//   - System annotations written by the leader. trace, updaters,
//     controllers and phase are kept from the old object on a non-controller
//     write, except for two monotonic changes so the leader's own patches
//     pass this webhook: appending one hash to controllers and raising phase
//     to initialized.
//   - updaters on a user's spec change. The seed calls it a new origin; the
//     trace restarts, but the user is appended to updaters rather than
//     replacing them. Replacing would make a human the single updater, and
//     so (before the parent has a controllers record) its controller: the
//     failure DESIGN's identification rule avoids.
//   - Copies of the parent's user annotations. A controller copies its
//     parent's annotations onto children; a copied freeze or approvals
//     would then act on the grandchildren. When the requester is identified
//     as the controller, user annotations come from the old object. When it
//     is not (or identification is lenient), a user annotation changed to
//     exactly the parent's value is taken for a copy and undone, and on
//     CREATE such copies are dropped; a user's own values stay.
//   - DELETE without oldObject (API servers before 1.15) is allowed
//     unexamined rather than denied: there is nothing to judge.
//   - Parents without status.observedGeneration never look reconciled
//     (generation != 0), so their children's changes are always expected.
//   - A parent whose UID differs from the ownerReference's is a recreated
//     owner: the child is treated as an orphan (allowed).
//   - freeze: "" and "false" mean not frozen; any other value that is not
//     JSON freezes (the safe side, as DESIGN says for unparsable values).
//   - Unparsable approvals or rejections are ignored with a warning on the
//     response, not a denial: a typo by an approver must not block all
//     changes, and rejections only ever narrow what approvals allow.
//   - Approvals and rejections match the child's group and kind (any
//     version); an empty apiVersion matches any group.
//   - Resolved effects are emitted whenever a pair's drift would be over
//     (approved, parent reconciling, child deleted) because Decide has no
//     memory; the server sends one only when a Detected report for the pair
//     is outstanding.
//   - Subresources other than status (scale, eviction) are not examined.
package admission
