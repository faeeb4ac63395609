// Package chaos holds the chaos suite: three real `policyd serve`
// processes on loopback, concurrent REST clients, faults injected at random,
// and a linearizability check of the recorded history with porcupine. The
// package has no non-test code; run it with
//
//	go test ./tests/chaos                                   # short form, about 2 minutes
//	go test ./tests/chaos -run TestChaos -v -timeout 60m -chaos.duration=30m -chaos.check-timeout=20m
//
// Flags: -chaos.duration (workload time), -chaos.seed (0: from the clock; the
// seed is logged, and a run replays its fault schedule and operation mix with
// it, not its timing), -chaos.clients, -chaos.check-timeout (porcupine),
// -chaos.faults (comma-separated subset of the kinds below), -chaos.binary (test
// a prebuilt policyd instead of building this module), -chaos.log-store (the
// nodes' raft.log_store, boltdb or wal), -chaos.keep.
//
// # Processes
//
// TestMain builds the policyd binary from this module once. Each node runs in
// its own process group with Pdeathsig=SIGKILL (Linux), so nothing survives
// the test binary, even when `go test -timeout` aborts it without running
// cleanups; the normal path stops every process in t.Cleanup.
//
// # Network faults: one proxy per node, sources told apart by the hello
//
// Every node's raft.advertise (and its address in raft.peers and in joins) is
// a proxy in the test process in front of the node's real raft.addr, so all
// Raft traffic to node j flows through proxy j. To cut one direction of one
// pair (i → j) rather than all of j's traffic, proxy j must know which node
// dialled: every connection to a node's Raft port, Raft's and the
// node-to-node API's alike, opens with the peer handshake's hello naming the
// dialling node (internal/server/peer). The proxy reads the hello (peer.ReadHello),
// forwards the bytes it read, and from then on copies blindly, so writes
// forwarded to the leader are cut by a partition as Raft is. A cut link (i, j) closes the open
// connections i → j at proxy j (the dialler sees a reset) and holds new ones
// open without forwarding a byte until the cut heals (it sees a black hole
// and its timeouts). Responses travel back on the dialler's connection, so a
// partition between i and j cuts both (i, j) and (j, i). This keeps the node
// unaware of the proxies and needs no privileges (no network namespaces, no
// iptables), at the price of depending on the transport's framing, which
// the proxy tolerates failing: an undecodable connection is forwarded and
// counted, never cut.
//
// # Faults
//
// One fault at a time, each healed before the next, at random intervals:
//
//   - kill: kill -9 of the leader or a follower, restarted after a while;
//   - pause: SIGSTOP of a node (often the leader) for longer than the
//     election timeout, then SIGCONT — the deposed-leader case of Jepsen's
//     etcd and Consul analyses;
//   - partition: a node isolated from both peers, or one link cut (the third
//     node still sees both sides);
//   - transfer: SIGTERM of the leader, whose graceful shutdown transfers
//     leadership (raft TimeoutNow) before it exits, then a restart. There is
//     no admin route that transfers leadership without a restart;
//   - membership: DELETE /v1/cluster/members/{id} of a node, then POST
//     /v1/cluster/join with its proxy address. hashicorp/raft shuts down a
//     server that applies its own removal (ShutdownOnRemove), so when the
//     re-added node does not catch up by itself it is restarted.
//
// # History and checks
//
// Clients PUT, CAS-PUT (If-Match with a revision they observed), DELETE and
// GET ?consistent=true the policies k0..k4 on random nodes; a PUT's body
// carries a unique write id. An operation that failed or timed out is of
// unknown outcome. Since every applied write is in the event log (the
// event id is its Raft index), the log resolves them after the
// run: a write id not in it was not applied and is dropped; one in it
// succeeded, and its return time becomes the first answer on its key that
// showed its revision or a later one. DELETEs are matched to DELETE events
// (by revision, or by the leader's processed_at for a plain one); see
// operations in history_test.go for why each bound is sound. Left
// open-ended, such operations made porcupine's search explode on long runs.
// A request refused before it was sent (connection refused) is dropped too.
// After the faults heal:
//
//   - no consistent read returned a revision already replaced by a write
//     acknowledged before the read began (staleReads: no search needed);
//   - porcupine (KV model, one key at a time) must find the history, closed
//     by a consistent read of every key on every node, linearizable;
//   - every acknowledged write is in the event log exactly once and is
//     either its key's final value on every node or followed by a later
//     change of that key (no write lost, none applied twice), and no write id
//     is seen with two revisions;
//   - the three FSM digests and applied indexes (GET /v1/cluster) are equal;
//   - each sidecar (SDK clients over gRPC and WebSocket) is monotonic: every
//     policy revision it holds was written, each key only moves forward in
//     its own history (replayed from the event log), WebSocket Raft indexes
//     never decrease, and it ends on the final set and version; every
//     whole set it receives over gRPC existed as of one index (a "torn"
//     set fails the run; WebSocket deltas are not whole sets).
//
// A failing run keeps its directory (printed; under os.TempDir(), not
// t.TempDir()) with the node logs, the history and porcupine's HTML
// visualisation.
package chaos
