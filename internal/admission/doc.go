// Package admission is policyd's drift detection (docs/drift.md):
// a pure decision function, Decide, and an http.Handler for AdmissionReview
// admission.k8s.io/v1 that resolves the parent and calls it. Follow-up work
// (annotation backups on parents, consumed approvals, drift reports) is
// returned as Effects, which the server proposes through Raft so that the
// leader alone performs it.
//
// # Decisions where the specification leaves room
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
//     failure the identification rule avoids.
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
//   - The parent comes from an informer, and a real controller acts on a
//     spec change within milliseconds, often before the informer has it.
//     A decision that rests on the parent being at rest (drift denied or
//     logged, approved, rejected) is made again on a fresh read of the
//     parent (FreshObjects) when the server offers one; if that read fails,
//     the cached copy decides. Other decisions make no API call.
//   - freeze: "" and "false" mean not frozen; any other value that is not
//     JSON freezes (the safe side, as for unparsable values).
//   - Unparsable approvals or rejections are ignored with a warning on the
//     response (and a log line), not a denial: a typo by an approver must
//     not block all changes, and rejections only ever narrow what
//     approvals allow.
//   - Initialization rules (drift.initialization, package initrule): a
//     kind's rules are alternatives ("any of"), the word default stands
//     for the seed's whole order, and a kind with configured rules does not
//     use its built-in one, so "apps/Deployment=default" gives the seed's
//     order back to Deployments whose controller sets Ready. The
//     <prefix>/phase annotation is always checked first. A rule with an
//     unknown signal, or default beside other signals, fails config load.
//   - Modes: the object's own <prefix>/mode, then its parent's, then its
//     namespace's, then drift.mode. The object's annotation is read as
//     stored (the old object): only a controller's write can be drift, and
//     a controller's new object carries its parent's annotations, not the
//     object's; a CREATE has no stored object, so its parent's mode
//     applies. A value other than enforce or log is ignored.
//   - Trace labels. An object's <prefix>/trace-<key> annotations, as the
//     object will hold them, become labels on its own hop when the hop is
//     written (a CREATE or a spec change), so a controller's copies of its
//     parent's are not inherited, and a metadata-only change leaves the
//     trace as it was. A key that is not a valid label key (a qualified
//     name) or a value over 1 KiB is left out, with a warning on the
//     response and a log line; the request is not refused. A child's trace
//     copies its parent's hops byte for byte, fields this version does not
//     know included.
//   - Resolved reports. An approved drift always yields a Resolved effect,
//     with both objects and the diff, so a receiver that audits approvals
//     hears of approvals written in advance too. Its Occurrence (the pair,
//     the child's generation before the change, both specs) keeps it to one
//     report per approved change: the API server calls each replica's
//     webhook with its own uid, and a controller whose approved write loses
//     a conflict to a status update retries the same change. The parent's
//     spec change and the child's deletion also yield Resolved effects, on
//     every such request since Decide has no memory; the server sends those
//     only for an open Detected report.
//   - Subresources other than status (scale, eviction) are not examined.
//
// # Where the seed and Kausality differ, and what we chose
//
// Kausality (github.com/kausality-io/kausality) is the project drift detection
// comes from; its code and its design document do not always agree.
//
//   - Initialization: Kausality's observedGeneration check is the field's
//     mere presence; the seed requires observedGeneration == generation
//     with Ready=True. We follow the seed: Crossplane sets Synced (and
//     observedGeneration) before the children exist.
//   - Mode: Kausality reads the new object's annotation, then the
//     namespace's, then its configuration, and not the parent's. We follow
//     the object > parent > namespace > drift.mode, reading the
//     object as stored (see Modes above), so that a controller syncing its
//     parent's annotations cannot change its child's mode.
//   - Rejections: Kausality denies a rejected drift only in enforce mode.
//     We deny it in both modes: a rejection is an explicit human
//     decision.
//   - Wildcards: as in Kausality, "*" matches any apiVersion, kind or name,
//     and only the whole value "*" is a wildcard ("web-*" is a name). Unlike
//     Kausality, apiVersion matches by group (the version is ignored: an
//     object is the same at every served version) and an empty apiVersion
//     matches any group.
//   - Resolved: as in Kausality, every approved drift is reported Resolved.
//     Kausality sends one per webhook call; we send one per approved change
//     (see Resolved reports above), since a cluster of replicas would
//     otherwise report each approval several times.
//   - Trace: as in Kausality, labels are the object's own and not
//     inherited, and a controller's write extends its parent's trace.
//     Kausality starts a new origin when the parent is at rest (drift); we
//     extend the parent's trace and mark the hop (approval mode, or drift
//     when logged), so a report's trace shows where the drift came from.
//     Label keys and sizes are checked, which Kausality does not do.
package admission
