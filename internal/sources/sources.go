// Package sources reconciles the policies that Kubernetes resources and Git
// repositories declare: one engine per source on the leader turns each
// observation into one Raft entry that puts and deletes what changed
// (docs/sources.md). The drivers that read a source are sub-packages.
package sources

import (
	"context"

	"github.com/policyd/policyd/internal/policy"
)

// Kubernetes is the Kubernetes source's name; a Git source's is "git:NAME".
const Kubernetes = "kubernetes"

// GitName is the source name of the Git source configured as name.
func GitName(name string) string { return "git:" + name }

// Declared is one policy a source declares.
type Declared struct {
	// Policy is the declared policy, not yet validated (the engine
	// validates it, with the REST API's messages). Its Source is ignored.
	Policy *policy.Policy
	// Object names the declaring object for operators: "ToolPolicy
	// acme.deny-shell", or "policies/deny.yaml#2" (file and document).
	Object string
	// Adopt lets the source take the policy over from its owner (the API
	// or another source): the annotation policyd.io/adopt: "true", or a
	// Git document's adopt: true.
	Adopt bool
	// Generation is the Kubernetes object's metadata.generation (0 for Git).
	Generation int64
	// Rollout, when set, makes a change of this policy go out as a staged
	// rollout instead of with the sync.
	Rollout *Rollout
}

// ObjectError is an object the driver could not turn into a policy at all
// (unreadable file, bad YAML, a binary file): it counts as invalid.
type ObjectError struct {
	Object  string // as Declared.Object
	Name    string // the policy's name when known
	Field   string // the field path when known
	Message string
}

// Observation is what one full read of a source saw.
type Observation struct {
	// Revision is what was read: a list's resourceVersion, or a commit.
	Revision string
	// Complete is false for a failed or partial read: it never prunes.
	Complete bool
	// Atomic makes one invalid object refuse the whole observation (a Git
	// commit); otherwise each object stands alone (Kubernetes).
	Atomic   bool
	Policies []Declared
	Invalid  []ObjectError
}

// Outcome states of one declared object after a sync.
const (
	StateCommitted    = "Committed"
	StateInvalid      = "Invalid"
	StateConflict     = "Conflict"
	StatePruneRefused = "PruneRefused"
	StateFailed       = "Failed" // the sync could not be committed (no quorum, not leader)
)

// Outcome is what a sync made of one declared object: a driver writes it
// back (Kubernetes status) or reports it (Git).
type Outcome struct {
	Object     string
	Name       string
	Generation int64
	State      string
	// Revision is the policy's revision once committed (its Raft index).
	Revision uint64
	// Message explains a state other than Committed: the field path of an
	// invalid object, the owner of a conflicting one.
	Message string
}

// Driver reads one source. The engine calls Watch once per leadership term
// and Observe whenever Watch signals a change (coalesced, see
// sources.debounce).
type Driver interface {
	// Name is the source's name: Kubernetes or GitName(...).
	Name() string
	// Watch runs until ctx ends, calling changed whenever the source may
	// have changed (an informer event, a poll tick, a webhook). It calls it
	// once at start: a new leader always reads everything.
	Watch(ctx context.Context, changed func()) error
	// Observe reads the source's whole declared state.
	Observe(ctx context.Context) (*Observation, error)
	// Report hands the driver each object's outcome after a sync attempt.
	Report(ctx context.Context, outcomes []Outcome)
}

// Sidecars counts the connected sidecars a policy applies to, by their
// answer to the newest set holding the policy's current revision.
type Sidecars struct {
	Total     int    `json:"total"`
	Acked     int    `json:"acked"`
	Nacked    int    `json:"nacked"`
	Pending   int    `json:"pending"`
	FirstNack string `json:"first_nack,omitempty"`
}

// Fleet tells a driver how far a policy has rolled out.
type Fleet interface {
	// Reach counts the connected sidecars the named policy applies to,
	// by their answer to a set holding its current revision.
	Reach(ctx context.Context, name string) (Sidecars, error)
	// Staging reports the stage of a running staged rollout of the named
	// policy ("" when none runs).
	Staging(name string) string
}
