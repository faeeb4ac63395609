// Package peer is the door of the peer plane (docs/security.md): one TCP
// listener, raft.addr, that carries Raft and the node-to-node API, and that
// only cluster members get through.
//
// # Handshake
//
// Every connection, after TLS when raft.tls is set, starts with a handshake
// that the dialling node opens:
//
//  1. hello (client): magic "PDP1", the stream kind (Raft, API or a
//     probe), whether it holds the cluster secret, a 32-byte random nonce,
//     its node ID and its cluster ID ("" while it has none);
//  2. challenge (server): a status byte (0, or a refusal with its reason),
//     its own nonce, node ID and cluster ID;
//  3. proof (client): HMAC-SHA256 under the secret of a label and
//     everything sent so far, when the cluster has a secret;
//  4. result (server): a status byte and, with a secret, its own HMAC under
//     another label, so that both sides prove they hold the secret.
//
// The secret never crosses the wire, both nonces are in every MAC (no
// replay) and the two labels differ (no reflection). Keyring holds several
// secrets so that one rotates without downtime: the first dials, any one
// answers. Without TLS the traffic after the handshake is neither encrypted
// nor integrity-protected; raft.tls is for networks that are not trusted.
//
// With raft.tls and a client CA, a peer's certificate must name a node
// identity, the URI SAN spiffe://<trust domain>/node/<id>, and the node ID
// the peer claims must be one its certificate names, on both sides. A
// sidecar's or an operator's certificate from the same CA names no node
// and is refused.
//
// Cluster IDs are checked on both sides: two nodes that both know their
// cluster and disagree refuse each other, with an error that names both
// IDs. A node with no cluster ID yet (a new data dir waiting to be joined)
// accepts any authenticated peer. The mux hands every mismatch it refuses to
// Config.Mismatch, so that the node can tell whether its own data dir is
// the stray one (internal/server/raftnode/foreign.go).
//
// # Listener
//
// Mux accepts, then runs the TLS and peer handshakes on a goroutine per
// connection, bounded by HandshakeTimeout, so that a peer that stalls holds
// up nobody; the caller caps connections (raft.max_connections) before the
// mux sees them. An authenticated connection goes to the sub-listener of its
// kind: Raft's stream layer or the node-to-node gRPC server. Refusals are
// logged at a bounded rate (one line per interval with a count), so that a
// wrong secret repeated 10,000 times neither fills the log nor the memory.
package peer
