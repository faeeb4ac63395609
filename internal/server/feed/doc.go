// Package feed is the WebSocket policy feed (docs/sidecars.md):
// GET /ws/policies on the HTTP listener pushes, to every connected sidecar,
// the policies that apply to its identity, as they are committed. The wire
// contract (messages, close codes, parameters) is api/feed/v1.
//
// # Handshake
//
// A connection is authenticated before the upgrade; a rejected one gets a
// plain HTTP response with the admin API's JSON error envelope
// ({"error":{"code":…,"message":…}}), never a WebSocket:
//
//   - 400 invalid: not a WebSocket upgrade, an unparsable ?since=, a query
//     parameter (name or value) that is not valid UTF-8, named in the
//     message, or a token sent as the bearer.<jwt> subprotocol without also
//     offering policyd.feed.v1 (see below);
//   - 401 unauthorized: no token, a token that does not verify (signature,
//     expiry, issuer, audience…), or an unknown employee, which alone has
//     the envelope's reason UNKNOWN_EMPLOYEE (feedv1.ReasonUnknownEmployee:
//     it may not have been created yet, and the SDK retries it for a while);
//   - 403 forbidden: an inactive employee, or a token whose org differs
//     from the employee record (its team claim is not checked: see
//     Employees);
//   - 503 unavailable: the node is shutting down, the client resumes
//     (?since=) from a version this node has not reached (see Resuming),
//     or the node cannot confirm it is current before reading the record.
//
// The mapping from errors to statuses lives in one function, statusOf.
//
// The token is verified first; then the node waits (up to catchUpWait)
// until it holds every write it has acknowledged, the wait a local read of
// the admin API makes, and only then reads the employee record, so that a
// sidecar started right after its employee was created through this node
// is admitted. A refusal for the record's sake (unknown, inactive, another
// org) is confirmed by a consistent read (Deps.CaughtUp) and a second look
// before it is answered, so that a node behind the cluster never refuses an
// employee created or reactivated through another node.
//
// With auth.mode jwt the token comes from "Authorization: Bearer <jwt>" or,
// for browsers, which cannot set headers, from a subprotocol
// "bearer.<jwt>" in Sec-WebSocket-Protocol. A client that sends the token
// that way must offer "policyd.feed.v1" as well: the server selects it, so
// that the token is never echoed back in the response, and RFC 6455 (and
// every browser) fails a handshake whose selected subprotocol was not
// offered. The identity (org, team, employee) is always the employee
// record's; the token's org has to agree with it (auth.Identify).
//
// With auth.mode none (local development only) there is no token: the
// connection names its employee with ?employee=<id>, and the record must
// exist and be active. Anyone who can reach the listener can then read any
// employee's policies: that mode must never be used in production.
//
// Origins are not checked: the feed has no ambient credentials (cookies),
// every connection presents its token explicitly, so a cross-site page
// gains nothing it could not get with the token anyway.
//
// # Delivery
//
// The node's change dispatcher calls OnChange for every committed batch,
// in commit order, after the policy index (internal/server/policyset) has taken it
// in. The hub indexes its connections by org, team and employee; for each
// policy change it looks up the connections any of the change's scopes (the
// new one and, for a move, the old one) applies to, and sends each of them
// upsert when the policy now applies to it, delete otherwise. A connection
// therefore only ever hears about policies that apply, or applied, to its
// identity: a policy moved out of its scope arrives as delete, one moved in
// as upsert, and other tenants hear nothing. Each distinct message of a
// batch is encoded once and its bytes shared by every connection that gets
// it; the digest (the identity's policy-set version after the batch) is
// part of the message, so the cache key is (message, digest).
//
// version is the Raft index of the change (for init, the index the set was
// read at). A policy changed more than once in one batch is sent once, in
// its current state, with the index of its first change in the batch, so
// that versions only grow along a connection and a client whose last
// message had version v holds, for every policy changed up to v, a state
// at least as new as v's: that is what ?since= resumes from. Every
// connection also remembers the index its state is complete up to and
// skips changes at or below it, so a change that raced with the
// connection's init is not sent twice.
//
// A batch that would put more messages in a connection's queue than it has
// room for is sent as one fresh init instead. A Resync (snapshot restore,
// or a dispatcher that fell behind) sends init to every connection, after
// re-checking every employee.
//
// # Resuming with ?since=
//
// since is the version of the last message the client processed. When the
// event log still holds every event after it (since >= the log's pruned-
// through mark), the server replays only what the client missed, up to
// the last change it has dispatched: each policy touched after since is
// sent once, in that order and with the index of its first change after
// since, as upsert (its latest state) if it applies now, or as delete if it
// does not but applied at since or at some point after it; other tenants'
// policies are never named. Whether a policy whose first change after since
// was an update applied at since is read from its previous event, looked
// for within replayLookback indexes before since. The server sends init
// instead, which is always correct, when that cannot be established, when
// the replay is long (since more than maxReplayEvents log entries back,
// decided without reading the event log, or more than maxReplayEvents
// events, or more messages than half the send buffer), or when the employee record changed after
// since (the identity may have moved). A since ahead of this node's
// applied index waits up to catchUpWait for a consistent read (Deps.CaughtUp,
// the gate the discovery stream uses): once the node holds everything the
// cluster committed before the handshake, it resumes from since. If the
// read fails or the node does not catch up in time, the handshake is
// refused with 503 unavailable rather than answered with init: an init
// from a lagging node would take the sidecar back to an older set (a
// policy deleted since would be in force again), and the client keeps its
// set and tries another node. If the node is current and since is still
// ahead, the cluster never committed it, the client's set belongs to a
// history that is gone, and it gets init. (A restore starts the new history
// 2^32 entries after the backup, with the events before marked as pruned,
// so an index of the lost history is normally below the pruned mark and
// gets init that way: see store.StartHistory.) Every replayed message carries the digest of
// the set the replay ends at. A replay with nothing to send sends nothing:
// the client keeps its set.
//
// # Staged rollouts and capabilities
//
// A client declares what it handles beyond version 1 of the feed with the
// query parameter ?capabilities=rollouts,shadow (comma-separated; values
// the server does not know are ignored, and a server older than the
// parameter ignores it, since unknown query parameters are never refused).
// A connection that declared "rollouts" and whose employee id hashes into
// the cohort of an active staged rollout that changes its identity's set
// (docs/rollouts.md, policyset.SetFor) is served the candidate set: its
// init holds it, and every message's digest is the candidate's version.
// Everyone else, and every connection that declared nothing, is served the
// stable set. Upserts and deletes carry the state of the set the
// connection is served, so a write to a policy outside the rollout reaches
// both kinds with their own digests.
//
// A rollout change (a new stage, a rollback, an abort, a completion) sends
// each connection it moves between sets the upserts and deletes that take
// it from the set it holds to the one it is now to be served, in name order,
// with the rollout change's index as their version; a connection whose
// content does not change (a member at a later stage) is sent nothing.
//
// A resume with ?since= cannot be exact for an identity that an active
// rollout touches (the client may hold the candidate or be due it, and the
// event log describes neither), nor for one a rollout touched that ended
// without completing after since (the client may still hold its
// candidate): those get init. A completed rollout's writes are ordinary
// events, replayed as any other. ClientInfo's rollouts carries the tags
// ("<id>:<stage>") of the candidates a connection was sent.
//
// # Employees
//
// An employee who is deactivated or deleted is revoked on every node, from
// each node's own apply stream: each of its connections gets revoke and is
// closed with 4403 (CloseRevoked), and a new connection is refused before
// the upgrade (403 for inactive, 401 for deleted).
//
// The employee record, not the token, decides the team. An employee moved
// to another team of its org keeps its connections, re-indexed under the
// new team, and each gets a fresh init for it, which replaces the old
// team's set; from then on it hears the new team's changes only. Its token
// still names the old team and keeps working, on open connections and on
// the next connect, until the sidecar refreshes it.
//
// An org is a tenant, and a tenant boundary is never crossed on an open
// connection: an employee moved to another org is revoked like a
// deactivated one (revoke with the reason "employee moved to another org",
// then 4403), and a token that names the old org is refused (403) at the
// next connect. The sidecar needs a token for the new org.
//
// The same holds for a change committed during the handshake (attach reads
// the record again) and after a resync.
//
// # Liveness and backpressure
//
// Each connection has one bounded send queue (feed.send_buffer messages)
// and one write path: every network write (messages, pings, the close) is
// done by drain, each bounded by feed.write_timeout, and at most one drain
// runs per connection; no lock is held across a write. The broadcaster
// never blocks: a message that does not fit in a full queue closes the
// connection with 4429 (CloseSlowConsumer); the client reconnects and gets
// init (or a short replay). A timer sends ping every feed.ping_interval
// and closes with 4408 (ClosePongTimeout) when no pong arrived for two
// intervals. A close (the reason, then the close handshake) gets at most
// min(write_timeout, maxCloseGrace) before the socket is cut.
//
// A connection's reader accepts only text frames holding {"type":"pong"}
// or a shadow_report (docs/rollouts.md, handed to the node's shadow
// aggregate, which bounds and counts bad ones), up to
// feed.max_message_bytes (at least 128 KiB for a connection that declared
// the shadow capability): a binary frame closes with 1003, invalid
// JSON, another type, or text that is not valid UTF-8 (invalid bytes, or a
// \u escape of a lone surrogate, which encoding/json would read as U+FFFD;
// the reason names the field) with 4400 (CloseInvalidMessage), a frame
// over the limit with 1009. RFC 6455 has 1007 for a text frame that is not
// UTF-8; 4400 is used instead so that every message the client should not
// have sent ends one way. Protocol-level ping frames (the SDK sends them) are
// answered with pong frames by the WebSocket library.
//
// # Idle connections
//
// An idle connection runs no goroutine and holds only small buffers, so
// that a node holds tens of thousands (issue target: 16 KB each; measured
// with go run ./bench idle-memory -streams 0 -ws 10000):
//
//   - drain runs on a goroutine started when there is something to write
//     (the handshake's own goroutine writes the first messages) and ends
//     when the queue is empty; the queue is a slice released when empty.
//   - The ping is a timer, not a ticker in a loop.
//   - Reads: on Linux the hub's poller (one epoll instance, one goroutine)
//     watches every connection's socket, level-triggered and one-shot, and
//     starts a read task when it is readable. The task reads messages
//     until the client is between messages and the socket holds nothing
//     more, then re-arms the registration and ends. The WebSocket library
//     only has a blocking Read, so the socket it reads from (wire) returns
//     errWouldBlock instead of waiting, but only at a message boundary,
//     which it knows by following the frame structure of what it returned
//     (see wire). The library then stands exactly where a new message
//     starts. So a client's pong, close frame or garbage is read as soon
//     as it arrives, as with a reader goroutine: nothing is detected later
//     than before.
//   - net/http's 4 KiB read and write buffers of the hijacked connection
//     are replaced by smaller ones (readBufferSize, writeBufferSize). The
//     write buffer holds little more than a frame header: the wire keeps
//     back the start of a frame and sends it with the rest of the frame in
//     one writev, so a message of any size is one write syscall. TLS
//     connections keep a 1 KiB write buffer instead, so that a message
//     that fits is one record.
//
// What still holds a goroutine: a client that stops in the middle of a
// frame (or of a fragmented message) keeps its read task waiting for the
// rest, until the pong timeout closes it; and a connection the poller
// cannot watch reads with a goroutine of its own for its lifetime: TLS
// (tls.Conn buffers decrypted data the socket's readiness says nothing
// about), platforms other than Linux, or a failure to register with epoll
// (logged).
//
// CloseAll (server shutdown) refuses new connections with 503, closes every
// connection with 1001 and returns when their goroutines have ended;
// connections that do not complete the close handshake within
// shutdownGrace are cut.
//
// # Observability
//
// Metrics: policy_ws_connections_total (gauge), policy_ws_connections_by_org
// (gauge, label org), policy_broadcast_latency_ms (histogram: commit time of
// the change to the message written to the socket) and
// policy_broadcast_count (policy-carrying messages written: init, upsert,
// delete). Clients lists the connections for GET /v1/clients; the feed has
// no ACKs, so a WebSocket client is always reported "acked" for the last
// version written to it.
package feed
