// Package decisionsv1 is the wire contract of decision logs
// (docs/decisions.md): the JSON record a sidecar ships and a node stores,
// the drop counts a sidecar reports with its batches, and the query and
// impact messages of GET /v1/decisions and POST /v1/impact. The SDK
// (client), the node and the CLI share these types. Unknown fields are
// ignored, so fields can be added later.
package decisionsv1

import (
	"encoding/json"
	"time"
)

// Record is one decision. The SDK fills everything but Node and
// Transport; the node that receives it checks Org, Team and Employee
// against the identity it authenticated, sets Node and Transport, and
// stores the record as JSON.
type Record struct {
	Time          time.Time `json:"time"`
	Org           string    `json:"org"`
	Team          string    `json:"team"`
	Employee      string    `json:"employee"`
	ClientAddress string    `json:"client_address"`
	// Request is the request decided on, masked.
	Request Request `json:"request"`
	// Allowed, Policy, Reason and Message are the decision's.
	Allowed bool   `json:"allowed"`
	Policy  string `json:"policy,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Version is the policy-set version the decision was made with.
	Version string `json:"version"`
	// LatencyUS is how long the evaluation took, shadow policies included.
	LatencyUS int64 `json:"latency_us"`
	// ShadowDisagreements names the shadow policies that would have
	// decided otherwise.
	ShadowDisagreements []string `json:"shadow_disagreements,omitempty"`
	// Masked is true when masking removed or hashed something.
	Masked bool `json:"masked"`
	// Node and Transport ("grpc", "ws") are set by the receiving node.
	Node      string `json:"node,omitempty"`
	Transport string `json:"transport,omitempty"`
	// Unrecorded, set only by the node, makes this entry not a decision but
	// the count of the sidecar's decisions since its previous batch that
	// it did not record or ship (sampled out or dropped), so that a replay
	// can say what the logs leave out. Queries skip such entries.
	Unrecorded *Drops `json:"unrecorded,omitempty"`
}

// Request is a recorded request: the tool call (Tool, Input) or the HTTP
// attributes, masked.
type Request struct {
	Tool  string         `json:"tool,omitempty"`
	Input map[string]any `json:"input,omitempty"`
	HTTP  map[string]any `json:"http,omitempty"`
}

// Drops counts records a sidecar dropped before shipping them, by reason;
// a batch carries the counts since the previous batch the node took.
type Drops struct {
	// SampledOut counts allowed decisions not recorded by sampling: not a
	// drop (policyd_decisions_dropped_total leaves it out).
	SampledOut  uint64 `json:"sampled_out,omitempty"`
	BufferFull  uint64 `json:"buffer_full,omitempty"`
	RateLimited uint64 `json:"rate_limited,omitempty"`
	MaskFailed  uint64 `json:"mask_failed,omitempty"`
}

// TypeDecisionLog is the feed message that carries a batch
// (feedv1's message types).
const TypeDecisionLog = "decision_log"

// Batch is the feed's decision_log message: the records as JSON objects.
type Batch struct {
	Type    string            `json:"type"` // TypeDecisionLog
	Records []json.RawMessage `json:"records"`
	Dropped Drops             `json:"dropped"`
}

// Caps on one batch, on both transports; a bigger batch is refused whole.
const (
	MaxBatchRecords = 1000
	MaxBatchBytes   = 4 << 20
	MaxRecordBytes  = 64 << 10
)

// Results of Query.Result.
const (
	ResultAllow = "allow"
	ResultDeny  = "deny"
)

// Page is the answer of GET /v1/decisions: records newest first.
type Page struct {
	Records []Record `json:"records"`
	// Cursor asks for the next (older) page; empty when there is none.
	Cursor string `json:"cursor,omitempty"`
	// Unavailable names the members that did not answer in time: the page
	// lacks their records.
	Unavailable []string `json:"unavailable,omitempty"`
}

// ImpactReport is the answer of POST /v1/impact: the logged decisions of
// the identities a change set affects, decided again under their current
// set and under the set with the changes, summed over every node.
type ImpactReport struct {
	// Since is the oldest decision time replayed; AppliedIndex the policy
	// state the sets were read at.
	Since        time.Time    `json:"since"`
	AppliedIndex uint64       `json:"applied_index"`
	Totals       ImpactCounts `json:"totals"`
	// AllowToDenyRatio is Totals.AllowToDeny / Totals.Evaluated (0 when
	// nothing was evaluated): what a rollout's max_impact_ratio compares.
	AllowToDenyRatio float64      `json:"allow_to_deny_ratio"`
	Teams            []ImpactTeam `json:"teams"`
	// Scanned counts the records read, Masked those evaluated with masked
	// fields, Unrecorded the decisions the logs leave out (sampled out or
	// dropped by the sidecars).
	Scanned    uint64 `json:"scanned"`
	Masked     uint64 `json:"masked"`
	Unrecorded uint64 `json:"unrecorded"`
	// Oldest is the oldest record any node still holds in the window:
	// later than Since when retention has dropped the rest.
	Oldest *time.Time `json:"oldest,omitempty"`
	// CutOff names the nodes whose replay ran out of time: their counts
	// are partial. Unavailable names those that did not answer.
	CutOff      []string `json:"cut_off,omitempty"`
	Unavailable []string `json:"unavailable,omitempty"`
}

// ImpactCounts are a replay's counts; Evaluated is the sum of the others.
type ImpactCounts struct {
	Evaluated   uint64 `json:"evaluated"`
	AllowToDeny uint64 `json:"allow_to_deny"`
	DenyToAllow uint64 `json:"deny_to_allow"`
	Unchanged   uint64 `json:"unchanged"`
	Errors      uint64 `json:"errors"`
}

// ImpactTeam is one org and team's counts with up to 20 example records
// of each flip, masked as they were logged.
type ImpactTeam struct {
	Org  string `json:"org"`
	Team string `json:"team"`
	ImpactCounts
	AllowToDenyExamples []Record `json:"allow_to_deny_examples,omitempty"`
	DenyToAllowExamples []Record `json:"deny_to_allow_examples,omitempty"`
}
