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
	Enforcement string `json:"enforcement,omitempty"`
	// Source owns the policy: "kubernetes" or "git:NAME"; omitted: the API.
	Source    string          `json:"source,omitempty"`
	Spec      json.RawMessage `json:"spec"`
	Revision  uint64          `json:"revision"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// PolicyList is GET /v1/policies.
type PolicyList struct {
	Policies []Policy `json:"policies"`
	// Version is the policy-set version, for an identity query only.
	Version      string `json:"version,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
}

// PolicyFilter selects policies: the ones that apply to an identity (Org,
// Team, Employee), of a Kind; Consistent reads through the leader; Summary
// leaves the specs out (spec is null), for a listing.
type PolicyFilter struct {
	Org, Team, Employee, Kind string
	Consistent, Summary       bool
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

// ClientList is GET /v1/clients. Clients is the page asked for (every
// sidecar from Clients); Total counts those matching every filter before
// paging, and Counts those matching the node and scope filters, per state.
type ClientList struct {
	Clients     []ClientInfo `json:"clients"`
	Unreachable []string     `json:"unreachable_nodes,omitempty"`
	Total       int          `json:"total"`
	Counts      ClientCounts `json:"counts"`
	// Offset and Limit echo the request's; nil when it gave none, as
	// Clients does.
	Offset *int `json:"offset,omitempty"`
	Limit  *int `json:"limit,omitempty"`
}

// ClientCounts counts sidecars per state. Stale overlaps the others: a
// stale sidecar is also pending, acked or nacked.
type ClientCounts struct {
	Pending int `json:"pending"`
	Acked   int `json:"acked"`
	Nacked  int `json:"nacked"`
	Stale   int `json:"stale"`
}

// ClientFilter selects a page of GET /v1/clients; zero fields are not
// sent. State is pending, acked, nacked or stale (a last health check
// older than StaleAfter, 30s when zero, whatever the state).
type ClientFilter struct {
	Node, Org, Team, Employee, State string
	StaleAfter                       time.Duration
	// Limit 0 asks for no limit, not for an empty page, so that the zero
	// filter lists everything; Offset 0 is the first sidecar.
	Limit, Offset int
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

// URLDelivery is a report's delivery to one callback URL.
type URLDelivery struct {
	URL      string    `json:"url"`
	State    string    `json:"state"`
	Attempts uint32    `json:"attempts"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// StagedChange is a put (Policy, the candidate) or a delete (Name).
type StagedChange struct {
	Op     string  `json:"op"`
	Policy *Policy `json:"policy,omitempty"`
	Name   string  `json:"name,omitempty"`
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
