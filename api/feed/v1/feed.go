// Package feedv1 is the wire contract of the WebSocket policy feed
// (GET /ws/policies): the JSON messages, their type names, the close codes
// and the request parameters. The server (internal/server/feed) and the SDK
// (client) both use these types, so the two cannot drift apart. Unknown
// fields are ignored by both sides, so fields can be added later.
// See docs/sidecars.md.
package feedv1

import "encoding/json"

// Path is where the feed is served on the HTTP listener.
const Path = "/ws/policies"

// Message types.
const (
	TypeInit   = "init"
	TypeUpsert = "upsert"
	TypeDelete = "delete"
	TypeRevoke = "revoke"
	TypePing   = "ping"
	TypePong   = "pong"
	// TypeShadowReport carries a client's shadow-policy counts since its
	// previous report (docs/rollouts.md). A client sends it only to a
	// server that sent it shadow policies, which reads it.
	TypeShadowReport = "shadow_report"
)

// Request parameters.
const (
	// SubprotocolPrefix carries the token for clients (browsers) that cannot
	// set headers: Sec-WebSocket-Protocol: bearer.<jwt>.
	SubprotocolPrefix = "bearer."
	// Subprotocol is what the server selects when the token came as a
	// subprotocol. A client sending its token that way must offer it too:
	// RFC 6455 clients (browsers) fail a handshake whose selected
	// subprotocol they did not offer, and the server never echoes the token.
	Subprotocol = "policyd.feed.v1"
	// QuerySince resumes after the given version (Raft index): the server
	// replays the retained events after it, or sends init when it cannot.
	QuerySince = "since"
	// QueryEmployee names the employee when the server runs with
	// auth.mode: none (local development), where there is no token.
	QueryEmployee = "employee"
	// QueryCapabilities declares what the client handles beyond version 1,
	// comma-separated: capabilities=rollouts,shadow (docs/rollouts.md).
	// Servers ignore values they do not know, and a server that predates
	// the parameter ignores it, so a client may always send it.
	QueryCapabilities = "capabilities"
)

// Capabilities a client may declare, on the feed (QueryCapabilities) and on
// the discovery stream (PolicyDiscoveryRequest.capabilities).
const (
	// CapabilityRollouts: the client may be put in a staged rollout's
	// cohort and served its candidate set.
	CapabilityRollouts = "rollouts"
	// CapabilityShadow: the client evaluates shadow policies without
	// enforcing them.
	CapabilityShadow = "shadow"
	// CapabilityDecisionLog: the client records decisions and would ship
	// them as decision_log messages (decisionsv1.Batch) to a server whose
	// init says it takes them (Init.DecisionLog).
	CapabilityDecisionLog = "decision_log"
)

// Close codes beyond RFC 6455's. Of RFC 6455's, a client also sees 1001
// (going away: the node stops) and 1013 (try again later: the node has not
// heard from a Raft leader for longer than setup.max_staleness, so its
// state may be out of date; reconnect to another node).
const (
	// CloseRevoked: the employee was deactivated, deleted or moved to
	// another org (a token for the new org is needed). The client must
	// block everything and not reconnect with the same token.
	CloseRevoked = 4403
	// ClosePongTimeout: no pong for two ping intervals.
	ClosePongTimeout = 4408
	// CloseSlowConsumer: the connection's send buffer was full. Reconnect;
	// the server sends init.
	CloseSlowConsumer = 4429
	// CloseInvalidMessage: the client sent something that is not a pong.
	CloseInvalidMessage = 4400
)

// Handshake refusal reasons. A refused handshake is a plain HTTP response
// with a JSON body {"error": {"code", "message", "reason"}}; reason is set
// only where a client must tell the refusal apart from others of its
// status (docs/sidecars.md, refusal reasons).
const (
	// ReasonUnknownEmployee rides on a 401: the token verified, but the
	// node holds no employee of its subject, which may not have been
	// created yet. A client retries it for a bounded time before it
	// counts as revoked; a 403 (an inactive employee) revokes at once. The
	// same string as the discovery stream's ErrorInfo reason.
	ReasonUnknownEmployee = "UNKNOWN_EMPLOYEE"
)

// Scope says who a policy is for; empty fields are wildcards.
type Scope struct {
	Org      string `json:"org"`
	Team     string `json:"team"`
	Employee string `json:"employee"`
}

// Policy is a policy as delivered to a sidecar.
type Policy struct {
	Name     string            `json:"name"`
	Kind     string            `json:"kind"`
	Scope    Scope             `json:"scope"`
	Labels   map[string]string `json:"labels,omitempty"`
	Spec     json.RawMessage   `json:"spec"`
	Revision uint64            `json:"revision"`
	// Enforcement is "shadow" for a shadow policy, sent only to clients
	// that declared CapabilityShadow; omitted means enforce.
	Enforcement string `json:"enforcement,omitempty"`
}

// Init is sent once on connect (and instead of a replay that is not
// possible): every applicable policy.
type Init struct {
	Type     string   `json:"type"` // TypeInit
	Policies []Policy `json:"policies"`
	// Version is the Raft index the set was read at.
	Version uint64 `json:"version"`
	// Digest is the scoped policy-set version, the same
	// value the discovery stream calls version_info.
	Digest string `json:"digest"`
	// DecisionLog is true when the server takes decision_log messages; set
	// only for a client that declared CapabilityDecisionLog.
	DecisionLog bool `json:"decision_log,omitempty"`
}

// Upsert says a policy now applies to the connection, new or changed.
type Upsert struct {
	Type    string `json:"type"` // TypeUpsert
	Policy  Policy `json:"policy"`
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
}

// Delete says a policy no longer applies to the connection (deleted, or moved
// out of its scope).
type Delete struct {
	Type       string `json:"type"` // TypeDelete
	PolicyName string `json:"policy_name"`
	Version    uint64 `json:"version"`
	Digest     string `json:"digest"`
}

// Revoke says the employee's access is revoked; the server closes with
// CloseRevoked right after.
type Revoke struct {
	Type   string `json:"type"` // TypeRevoke
	Reason string `json:"reason"`
}

// Ping asks for a Pong.
type Ping struct {
	Type string `json:"type"` // TypePing
}

// Pong answers a Ping.
type Pong struct {
	Type string `json:"type"` // TypePong
}

// Message decodes any message: read Type, then the fields that type uses.
type Message struct {
	Type       string   `json:"type"`
	Policies   []Policy `json:"policies,omitempty"`
	Policy     *Policy  `json:"policy,omitempty"`
	PolicyName string   `json:"policy_name,omitempty"`
	Version    uint64   `json:"version,omitempty"`
	Digest     string   `json:"digest,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	// DecisionLog is Init's.
	DecisionLog bool `json:"decision_log,omitempty"`
}
