// Package admission is policyd's drift detection: a pure decision
// function, Decide, and an http.Handler for AdmissionReview
// admission.k8s.io/v1 that resolves the parent and calls it. Follow-up work
// (annotation backups on parents, consumed approvals, drift reports) is
// returned as Effects, which the server (internal/server/drift) proposes
// through Raft so that the leader alone performs it; this package makes no
// writes and holds no cluster state. The rules and the choices where they
// leave room are in docs/drift.md.
package admission
