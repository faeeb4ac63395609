// Package client is the Go SDK for sidecars and agent proxies
// (docs/sidecars.md). It keeps the policies that apply to one
// identity in memory (never on disk, NFR2), follows a policyd cluster over
// one of two transports, and answers "may this tool call run?" on the hot
// path without allocation-heavy work or locks.
//
// # Transports
//
// TransportGRPC (the default) speaks the discovery protocol of
// api/discovery/v1: the first request carries the last version applied, the
// server pushes a full snapshot (or "unchanged" when the client already has
// the current version), and the client answers each response with an ACK or,
// when the set is rejected, a NACK that carries the last good version and the
// error. A HealthCheck is sent every HealthInterval on the node the stream is
// open on, so the server does not flush the stream as inactive; two health
// checks in a row that fail with Unavailable or DeadlineExceeded end the
// stream and the client fails over (a dead TCP connection is detected that
// way). A snapshot carries the whole set, but the client decodes only the
// policies whose encoding differs from the previous response's and keeps
// the others as it holds them (nodes encode an unchanged policy with the same
// bytes every time), so an update costs about what changed, also after a
// reconnect to another node. The price is the last response's bytes, kept
// for the comparison.
//
// TransportWS follows the WebSocket feed of api/feed/v1: init replaces the
// whole set, upsert and delete change one policy, ping is answered with pong
// at once, revoke revokes. A reconnect carries ?since=<the Raft index of the
// last message received>, so the server replays only what was missed, or
// sends init when it cannot. The client sends a WebSocket ping frame every
// HealthInterval and fails over when no pong arrives. There is no NACK over
// WebSocket: a message whose result is rejected is logged and skipped, the
// previous set stays in force, and the resume index still moves past it.
//
// # States
//
//	connecting   (initial; block all) -- first set applied -------------> ready
//	ready        (enforce)            -- connection lost ---------------> disconnected
//	disconnected (cached policies)    -- reconnected and synced --------> ready
//	disconnected                      -- Grace elapsed: still disconnected, but block all
//	any                               -- revoke / 4403 / auth refused --> revoked (block all, terminal)
//
// A connection counts as synced (→ ready) when, over gRPC, the first response
// on the stream has been answered and the client holds a set (a full set it
// accepted, or "unchanged" for the set it holds), and over WebSocket when init
// has been applied, or right after the handshake of a reconnect with ?since=
// (the server then replays what was missed, or sends init).
//
// Grace is a timer started when ready turns into disconnected; it runs on the
// injectable Config.Clock so tests can drive it. When it fires, the state stays
// disconnected but ShouldBlockAll becomes true ("disconnected, but
// past grace period"); the next successful sync returns to ready and lifts
// the block. Policies are kept while disconnected; a reconnect that answers
// "unchanged" (gRPC) or replays nothing (WebSocket) costs no full resend.
//
// Revocation is terminal: Run returns an error wrapping ErrRevoked and the
// client blocks everything from then on. It is caused by a revoke message or
// close code 4403 on the feed, by codes.PermissionDenied or
// codes.Unauthenticated ending a discovery stream, and by HTTP 401/403 on the
// feed's handshake. One refusal is not final at once: an employee the node
// does not know (Unauthenticated with the ErrorInfo reason UNKNOWN_EMPLOYEE,
// a 401 whose error envelope has that reason), which may be created in a
// moment, is retried with the usual backoff and failover for
// Config.UnknownIdentityGrace (30s) from the first such refusal since the
// last sync, and revokes only if it is still unknown then; the state stays
// connecting (or disconnected, with the cached set) meanwhile. Set
// Config.RetryUnauthorized to retry every refusal at connect for ever
// instead; a revoke message and close code 4403 always revoke.
//
// OnStateChange is called for every transition, in order, from the goroutine
// running Run, with no SDK lock held (a callback may call any method). When
// Run returns because its context ended, a ready or disconnected client moves
// to disconnected and blocks everything ("policy client stopped"): a stopped
// client never fails open.
//
// # Failover and backoff
//
// Servers is a list of nodes. The client starts with the first and, after a
// failed attempt or a stream that ended, moves to the next one, wrapping
// around. Between attempts it waits a random duration in
// [0, min(BackoffMax, BackoffMin·2^n)] ("full jitter"), where n counts the
// attempts since the last sync. Every node computes the same policy-set
// version for the same identity, so failing over to another node answers
// "unchanged" (gRPC) or replays nothing (WebSocket). To spread a fleet of
// sidecars over the nodes, shuffle Servers per sidecar.
//
// An agent that serves many identities, one Client each, can give them one
// shared connection (Config.GRPCConn) so that their discovery streams are
// multiplexed on it, as grpc-go multiplexes streams, instead of one TCP
// connection per identity. Failing over is then the connection's: a
// resolver with several nodes moves it, and each stream is reopened on it
// with the same backoff.
//
// # ToolPolicy semantics (IsBlocked)
//
// Only policies of kind "ToolPolicy" take part; other kinds are kept (and
// returned by Policies) but never block a tool call (Evaluate runs
// ValidatingPolicies too, see below). Their spec is
//
//	{"tool_name": "Bash", "action": "deny|audit|allow", "reason": "...",
//	 "conditions": {"patterns": ["rm -rf", "..."]}}
//
// A policy matches a call when tool_name equals the tool exactly (case
// sensitive) or is "*", and either it has no patterns or at least one pattern
// (RE2, unanchored: regexp.MatchString) matches at least one string leaf of the
// input. String leaves are found recursively through maps, slices, arrays and
// pointers; map keys, numbers, booleans and structs are not inspected.
// Among the matching policies deny wins: the call is blocked with the reason
// of the first deny policy by name (or "blocked by policy <name>" when it has
// none). allow and audit never block, and allow never overrides a deny (it
// documents intent and has no effect on the decision). A matching audit
// policy is logged at Info level with the policy and tool, for calls that are
// not blocked (deny is checked first, and a denied call never runs). When
// ShouldBlockAll is
// true, IsBlocked blocks every call with the reason of the state
// (ReasonConnecting, ReasonDisconnected, ReasonRevoked, ReasonStopped).
//
// Each accepted set is compiled once (patterns are compiled when the set is
// applied, never per call) into an immutable value behind an atomic pointer,
// so IsBlocked, ShouldBlockAll and State take no lock. A set in which a
// ToolPolicy has an invalid spec (no tool_name, an unknown action, a pattern
// that does not compile) is rejected as a whole, exactly like an error from
// the Config.Apply hook: over gRPC it is NACKed with the error and the last
// good version, and the previous set stays in force.
//
// # ValidatingPolicy semantics (Evaluate)
//
// Evaluate decides a Request: when it names a tool, the ToolPolicy rule above
// (deny wins) is applied first; then every ValidatingPolicy in the set, in
// name order, must have each of its validations' CEL expressions evaluate to
// true. The first that does not denies, with its message and reason. An
// expression that fails at run time, returns something other than a bool or
// exceeds Config.CELCostLimit denies too (fail closed), and is counted in
// EvalErrors.
//
// A ValidatingPolicy's optional spec.matchConditions narrow it, as in
// Kubernetes: it applies only when every match condition is true. One that
// is false skips the policy, whatever the others give; otherwise one that
// fails (as above) denies with the message "match condition <name>
// failed", Decision.Err set and EvalErrors counted. So an HTTP-style
// policy can say `has(request.method)` to leave tool calls alone.
//
// Expressions are compiled when a set is applied, in the environment of
// package api/celenv, which the server validates with, plus
// Config.CELEnvOptions; a ValidatingPolicy that does not compile rejects
// the set like a bad ToolPolicy. Evaluate denies everything whenever
// IsBlocked blocks everything.
//
// # Shadow policies
//
// A policy with Enforcement "shadow" (EnforcementShadow) never decides
// (docs/rollouts.md). The client declares the "shadow" capability, so
// nodes send it shadow policies, and compiles them apart from the enforced
// set (a bad one rejects the set like any other). IsBlocked and Evaluate
// decide with the enforced policies; then each shadow policy that applies
// is evaluated alone (IsBlocked: shadow ToolPolicies; Evaluate: those and
// shadow ValidatingPolicies) and counted: evaluated, would_block (it denies
// where the enforced decision allowed) and would_allow (the reverse).
// Stats().Shadow has the counts since New. Every ShadowReportInterval the
// gains since the last report that reached a node are sent to it
// (ReportShadow over gRPC, where a refused report is kept for the next;
// a shadow_report message over WebSocket, sent at most every 6 s, since a
// node takes one report per sidecar every 5 s and the feed has no answer).
// Counts not yet reported when Run returns are not sent. Without shadow
// policies none of this costs more than a nil check.
package client
