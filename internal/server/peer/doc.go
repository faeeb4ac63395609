// Package peer is the door of the peer plane: one TCP listener, raft.addr,
// that carries Raft and the node-to-node API, and that only cluster members
// get through. It owns the peer handshake (hello, challenge, proof, result:
// an HMAC-SHA256 challenge-response under the cluster secret, Keyring), the
// node-identity check of peer certificates, the cluster-ID check, and Mux,
// which hands each authenticated connection to the sub-listener of its
// kind. It does not cap connections (the caller does, raft.max_connections)
// nor decide what a stray data dir means (internal/server/raftnode). See
// docs/security.md.
package peer
