package adminclient

import (
	"encoding/json"
	"time"
)

// The types below mirror the JSON of docs/api.md, field for field.

// Scope is where a policy applies; all empty is global.
type Scope struct {
	Org      string `json:"org"`
	Team     string `json:"team"`
	Employee string `json:"employee"`
}

// Policy is a stored policy; Spec is the kind's own JSON.
type Policy struct {
	Name   string            `json:"name"`
	Kind   string            `json:"kind"`
	Scope  Scope             `json:"scope"`
	Labels map[string]string `json:"labels,omitempty"`
	// Enforcement is "shadow" for a shadow policy; omitted: enforce.
	Enforcement string          `json:"enforcement,omitempty"`
	Spec        json.RawMessage `json:"spec"`
	Revision    uint64          `json:"revision"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

// ShadowView is GET /v1/policies/{name}/shadow: a shadow policy's counts
// reported by the sidecars, summed across nodes (each node's since it
// started).
type ShadowView struct {
	Policy      string        `json:"policy"`
	Totals      ShadowTotals  `json:"totals"`
	ByScope     []ShadowScope `json:"by_scope"`
	Unreachable []string      `json:"unreachable_nodes,omitempty"`
}

// ShadowTotals are would_block (the shadow policy denied, the enforced ones
// allowed), would_allow (the reverse), evaluated.
type ShadowTotals struct {
	WouldBlock uint64 `json:"would_block"`
	WouldAllow uint64 `json:"would_allow"`
	Evaluated  uint64 `json:"evaluated"`
}

// ShadowScope is the counts of the sidecars of one scope (org/team/employee).
type ShadowScope struct {
	Scope string `json:"scope"`
	ShadowTotals
}

// PolicyList is GET /v1/policies.
type PolicyList struct {
	Policies []Policy `json:"policies"`
	// Version is the policy-set version, for an identity query only.
	Version      string `json:"version,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
}

// PolicyFilter selects policies: the ones that apply to an identity (Org,
// Team, Employee), of a Kind; Consistent reads through the leader.
type PolicyFilter struct {
	Org, Team, Employee, Kind string
	Consistent                bool
}

// Employee is an identity.
type Employee struct {
	ID        string    `json:"id"`
	Org       string    `json:"org"`
	Team      string    `json:"team"`
	Status    string    `json:"status"`
	Revision  uint64    `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// EmployeeList is GET /v1/employees.
type EmployeeList struct {
	Employees    []Employee `json:"employees"`
	AppliedIndex uint64     `json:"applied_index"`
}

// EmployeeFilter selects employees.
type EmployeeFilter struct {
	Org, Team  string
	Consistent bool
}

// Written is the revision a PUT committed.
type Written struct {
	Revision uint64 `json:"revision"`
}

// Deleted is the answer to a DELETE.
type Deleted struct {
	Deleted  string `json:"deleted"`
	Revision uint64 `json:"revision"`
}

// Event is one entry of the event log; ID is its Raft index.
type Event struct {
	ID           uint64          `json:"id"`
	EntityType   string          `json:"entity_type"`
	Org          string          `json:"org"`
	Action       string          `json:"action"`
	EntityID     string          `json:"entity_id"`
	Data         json.RawMessage `json:"data"`
	OriginatedAt time.Time       `json:"originated_at"`
	ProcessedAt  time.Time       `json:"processed_at"`
	// Actor is who made the change ("token:NAME", "cert:SUBJECT",
	// "task:NAME", "anonymous"); empty in events older than the audit trail.
	Actor     string `json:"actor,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// RevertedTo is the revision a revert wrote back.
	RevertedTo uint64 `json:"reverted_to,omitempty"`
}

// EventPage is GET /v1/events.
type EventPage struct {
	Events []Event `json:"events"`
	// PrunedThrough is the last id retention removed.
	PrunedThrough uint64 `json:"pruned_through"`
	LastID        uint64 `json:"last_id"`
}

// EventFilter selects events; Org "" with OrgSet is the global ones.
type EventFilter struct {
	Type   string
	Org    string
	OrgSet bool
	Actor  string
	After  uint64
	Limit  int
}

// History is GET /v1/policies/{name}/history and /v1/employees/{id}/history:
// the revisions the event log still holds, oldest first.
type History struct {
	EntityType string `json:"entity_type"`
	ID         string `json:"id"`
	// PrunedThrough is the highest event ID retention removed: older
	// revisions are gone.
	PrunedThrough uint64     `json:"pruned_through"`
	Revisions     []Revision `json:"revisions"`
}

// Revision is one write of an entity, from its event.
type Revision struct {
	Revision  uint64    `json:"revision"`
	Time      time.Time `json:"time"`
	Action    string    `json:"action"`
	Actor     string    `json:"actor,omitempty"`
	RequestID string    `json:"request_id,omitempty"`
	// RevertedTo is set when the write was a revert to that revision.
	RevertedTo uint64 `json:"reverted_to,omitempty"`
}

// RevertRequest is POST /v1/policies/{name}/revert (and employees): write
// revision To's content back as a new revision, compare-and-set on IfMatch
// (0: the entity is deleted); nil: on the revision current when the node
// takes the request.
type RevertRequest struct {
	To      uint64  `json:"to"`
	IfMatch *uint64 `json:"if_match,omitempty"`
}

// ClusterStatus is GET /v1/cluster.
type ClusterStatus struct {
	NodeID         string   `json:"node_id"`
	ClusterID      string   `json:"cluster_id"`
	State          string   `json:"state"`
	LeaderID       string   `json:"leader_id"`
	LeaderAddr     string   `json:"leader_raft_addr"`
	Term           uint64   `json:"term"`
	CommitIndex    uint64   `json:"commit_index"`
	LastIndex      uint64   `json:"last_index"`
	AppliedIndex   uint64   `json:"applied_index"`
	LastContact    string   `json:"last_contact,omitempty"`
	Digest         string   `json:"digest"`
	CommandVersion uint32   `json:"command_version"`
	Members        []Member `json:"members"`
}

// Member is one server of the Raft configuration.
type Member struct {
	ID             string `json:"id"`
	RaftAddr       string `json:"raft_addr"`
	HTTPAddr       string `json:"http_addr"`
	GRPCAddr       string `json:"grpc_addr"`
	Suffrage       string `json:"suffrage"`
	Leader         bool   `json:"leader"`
	CommandVersion uint32 `json:"command_version"`
}

// JoinRequest is POST /v1/cluster/join.
type JoinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
}

// Membership is the answer to a join or remove: the configuration index.
type Membership struct {
	ID    string `json:"id"`
	Index uint64 `json:"index"`
}

// TransferLeaderRequest is POST /v1/cluster/transfer-leader.
type TransferLeaderRequest struct {
	ID string `json:"id,omitempty"`
}

// TransferLeaderResult names the leader before and after.
type TransferLeaderResult struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// VersionInfo is GET /v1/version.
type VersionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goversion"`
	Commit    string `json:"commit"`
}

// ClientList is GET /v1/clients.
type ClientList struct {
	Clients     []ClientInfo `json:"clients"`
	Unreachable []string     `json:"unreachable_nodes,omitempty"`
}

// ClientInfo is one connected sidecar.
type ClientInfo struct {
	Node          string    `json:"node"`
	ClientAddress string    `json:"client_address"`
	Transport     string    `json:"transport"`
	Org           string    `json:"org"`
	Team          string    `json:"team"`
	Employee      string    `json:"employee"`
	Version       string    `json:"version"`
	State         string    `json:"state"`
	AckedVersion  string    `json:"acked_version,omitempty"`
	NackMessage   string    `json:"nack_message,omitempty"`
	NackVersion   string    `json:"nack_version,omitempty"`
	ConnectedAt   time.Time `json:"connected_at"`
	LastActive    time.Time `json:"last_health_check"`
	PeerAddr      string    `json:"peer_addr,omitempty"`
}

// ProxyStatus is GET /v1/proxy-status: per version, the discovery clients
// that ACKed, NACKed or have not answered it.
type ProxyStatus struct {
	Done        bool                 `json:"done"`
	Versions    []ProxyStatusVersion `json:"versions"`
	Unreachable []string             `json:"unreachable_nodes,omitempty"`
}

// Rollout is ProxyStatus's name before it was renamed.
//
// Deprecated: use ProxyStatus.
type Rollout = ProxyStatus

// RolloutVersion is ProxyStatusVersion's name before it was renamed.
//
// Deprecated: use ProxyStatusVersion.
type RolloutVersion = ProxyStatusVersion

// ProxyStatusVersion is the discovery clients sent one version.
type ProxyStatusVersion struct {
	Version string      `json:"version"`
	Done    bool        `json:"done"`
	Acked   []ClientRef `json:"acked"`
	Nacked  []NackRef   `json:"nacked"`
	Pending []ClientRef `json:"pending"`
}

// ClientRef names a sidecar.
type ClientRef struct {
	Node   string `json:"node"`
	Client string `json:"client"`
	Scope  string `json:"scope"`
}

// NackRef is a sidecar that rejected a version.
type NackRef struct {
	ClientRef
	Message         string `json:"message"`
	LastGoodVersion string `json:"last_good_version"`
}

// ReloadView is GET /v1/reload.
type ReloadView struct {
	Controller   ReloadController `json:"controller"`
	AppliedIndex uint64           `json:"applied_index"`
	Cache        []ReloadHash     `json:"cache"`
	Queue        []ReloadPending  `json:"queue"`
	Restarts     []ReloadRestart  `json:"restarts"`
	Errors       []ReloadError    `json:"errors"`
}

// ReloadController is this node's ConfigMap reload controller.
type ReloadController struct {
	State           string    `json:"state"`
	Reason          string    `json:"reason,omitempty"`
	Synced          bool      `json:"synced"`
	ResourceVersion string    `json:"resource_version,omitempty"`
	Since           time.Time `json:"since"`
	Namespace       string    `json:"namespace"`
	Selector        string    `json:"selector"`
	ScopeLabel      string    `json:"scope_label"`
	Debounce        string    `json:"debounce"`
}

// ReloadKey names a ConfigMap in a scope.
type ReloadKey struct {
	Scope     string `json:"scope"`
	ConfigMap string `json:"configmap"`
}

// ReloadHash is one hash-cache entry.
type ReloadHash struct {
	ReloadKey
	Hash      string    `json:"hash"`
	Index     uint64    `json:"index"`
	UpdatedAt time.Time `json:"updated_at"`
}

// ReloadPending is one queued restart.
type ReloadPending struct {
	ReloadKey
	Hash        string    `json:"hash"`
	DueAt       time.Time `json:"due_at"`
	Attempts    uint32    `json:"attempts"`
	LastError   string    `json:"last_error,omitempty"`
	Reason      string    `json:"reason"`
	Index       uint64    `json:"index"`
	ScheduledAt time.Time `json:"scheduled_at"`
}

// ReloadRestart is one completed restart.
type ReloadRestart struct {
	ReloadKey
	Hash        string    `json:"hash"`
	Patched     []string  `json:"patched"`
	Skipped     []string  `json:"skipped,omitempty"`
	Attempts    uint32    `json:"attempts"`
	Reason      string    `json:"reason"`
	RestartedAt time.Time `json:"restarted_at"`
	Index       uint64    `json:"index"`
}

// ReloadError is one failed restart attempt.
type ReloadError struct {
	ReloadKey
	Hash     string    `json:"hash"`
	Attempts uint32    `json:"attempts"`
	Error    string    `json:"error"`
	RetryAt  time.Time `json:"retry_at"`
	FailedAt time.Time `json:"failed_at"`
	Index    uint64    `json:"index"`
}

// DriftList is GET /v1/drift.
type DriftList struct {
	Reports []DriftReport `json:"reports"`
}

// DriftFilter selects drift reports.
type DriftFilter struct {
	Phase, Delivery string
	Limit           int
	Consistent      bool
}

// DriftReport is a stored drift report and what the cluster did with it.
type DriftReport struct {
	ID           string          `json:"id"`
	Phase        string          `json:"phase"`
	PairID       string          `json:"pair_id"`
	Report       json.RawMessage `json:"report"`
	FirstSeen    time.Time       `json:"first_seen"`
	SentAt       time.Time       `json:"sent_at,omitzero"`
	LastSeen     time.Time       `json:"last_seen"`
	Observations int             `json:"observations"`
	Delivery     string          `json:"delivery"`
	Deliveries   []URLDelivery   `json:"deliveries,omitempty"`
	Revision     uint64          `json:"revision"`
}

// URLDelivery is a report's delivery to one callback URL.
type URLDelivery struct {
	URL      string    `json:"url"`
	State    string    `json:"state"`
	Attempts uint32    `json:"attempts"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// StagedRollout is a staged rollout (docs/rollouts.md), as POST
// /v1/rollouts and the actions answer; GET /v1/rollouts/{id} adds Status.
type StagedRollout struct {
	ID             string               `json:"id"`
	Changes        []StagedChange       `json:"changes"`
	Stages         []StagedRolloutStage `json:"stages"`
	MaxNackRatio   float64              `json:"max_nack_ratio"`
	MinAckCoverage float64              `json:"min_ack_coverage"`
	OnHalt         string               `json:"on_halt"`
	State          string               `json:"state"`
	Stage          uint32               `json:"stage"`
	StageStartedAt time.Time            `json:"stage_started_at"`
	HaltReason     string               `json:"halt_reason,omitempty"`
	Actor          string               `json:"actor,omitempty"`
	RequestID      string               `json:"request_id,omitempty"`
	CreatedAt      time.Time            `json:"created_at"`
	UpdatedAt      time.Time            `json:"updated_at"`
	Status         *StagedRolloutStatus `json:"status,omitempty"`
}

// StagedChange is a put (Policy, the candidate) or a delete (Name).
type StagedChange struct {
	Op     string  `json:"op"`
	Policy *Policy `json:"policy,omitempty"`
	Name   string  `json:"name,omitempty"`
}

// StagedRolloutStage is one stage; Bake is a Go duration.
type StagedRolloutStage struct {
	Percent uint32 `json:"percent"`
	Bake    string `json:"bake"`
}

// StagedRolloutStatus is what the sidecars report of a rollout.
type StagedRolloutStatus struct {
	Cohort      RolloutCohort        `json:"cohort"`
	Stages      []RolloutStageStatus `json:"stages"`
	Shadow      []ShadowView         `json:"shadow"`
	Unreachable []string             `json:"unreachable_nodes,omitempty"`
}

// RolloutCohort counts the sidecars holding the current stage's candidate:
// discovery clients by answer, feed clients in SizeWS.
type RolloutCohort struct {
	Size    int `json:"size"`
	SizeWS  int `json:"size_ws"`
	Acked   int `json:"acked"`
	Nacked  int `json:"nacked"`
	Pending int `json:"pending"`
}

// RolloutStageStatus is one stage: passed, current or pending.
type RolloutStageStatus struct {
	Percent uint32 `json:"percent"`
	Bake    string `json:"bake"`
	State   string `json:"state"`
}

// StagedRolloutList is GET /v1/rollouts.
type StagedRolloutList struct {
	Rollouts     []StagedRollout `json:"rollouts"`
	AppliedIndex uint64          `json:"applied_index"`
}

// StartRollout is the body of POST /v1/rollouts.
type StartRollout struct {
	Changes      []StartChange `json:"changes"`
	Stages       []StartStage  `json:"stages"`
	MaxNackRatio float64       `json:"max_nack_ratio"`
	// MinAckCoverage: nil means the server's default, 1.
	MinAckCoverage *float64 `json:"min_ack_coverage,omitempty"`
	// OnHalt: "rollback" (the default) or "stay".
	OnHalt string `json:"on_halt,omitempty"`
}

// StartChange is a put (Op "put", Policy the whole policy document) or a
// delete (Op "delete", Name).
type StartChange struct {
	Op     string          `json:"op"`
	Policy json.RawMessage `json:"policy,omitempty"`
	Name   string          `json:"name,omitempty"`
}

// StartStage is one stage: Percent 1..100, Bake a duration ("2m").
type StartStage struct {
	Percent int    `json:"percent"`
	Bake    string `json:"bake"`
}
