package raftnode

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Readiness is "caught up", not "close": a node is ready only when it has
// applied at least the leader's commit index as of the check, learned with
// a read index through the leader (ConsistentRead). A node that has just
// restarted therefore stays unready until it holds every write the cluster
// acknowledged before the check, so it never answers 404 for one of them.
//
// A probe must stay cheap when many arrive (kubelet, load balancers, the
// metrics scrape, gRPC health): concurrent checks share one read index
// round trip (readGate), and a finished check's answer is reused for
// readyCacheFor, so a node takes at most about ten read indexes a second
// for probes however often it is asked.
const (
	// readyTimeout bounds one check: the read index and the wait for this
	// node to apply up to it. It stays under kubelet's default probe
	// timeout of 1 s, so a slow check reads as "not ready", not as a
	// failed probe with no answer.
	readyTimeout = 900 * time.Millisecond
	// readyCacheFor is how long a finished check's answer is reused.
	readyCacheFor = 100 * time.Millisecond
)

// readiness runs and caches the caught-up check.
type readiness struct {
	gate *readGate

	mu  sync.Mutex
	at  time.Time // when the last check finished; zero before the first
	err error
}

func newReadiness(ctx context.Context, read func(ctx context.Context) error) *readiness {
	return &readiness{gate: newReadGate(ctx, readyTimeout, read)}
}

// check returns the answer of a check that finished within readyCacheFor,
// or runs one (sharing it with concurrent callers).
func (r *readiness) check(ctx context.Context) error {
	r.mu.Lock()
	if !r.at.IsZero() && time.Since(r.at) < readyCacheFor {
		err := r.err
		r.mu.Unlock()
		return err
	}
	r.mu.Unlock()
	err := r.gate.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		// The caller gave up; that says nothing about the node.
		return &unavailableError{msg: "not ready: " + ctx.Err().Error()}
	}
	if err != nil {
		err = &unavailableError{msg: "not caught up with the leader's commit index: " + err.Error()}
	}
	r.mu.Lock()
	r.at, r.err = time.Now(), err
	r.mu.Unlock()
	return err
}

// Ready reports nil when this node is not removed, its data dir belongs to
// the cluster of its raft.peers (as far as they answered), it knows a
// leader, and has applied at least the leader's commit index as of the call
// (a read index, bounded by readyTimeout). Its errors are all Unavailable
// (503).
func (n *Node) Ready(ctx context.Context) error {
	if n.removed.Load() {
		return &unavailableError{msg: RemovedRefusal}
	}
	if e := n.foreign.Load(); e != nil {
		return e
	}
	if !n.peersChecked.Load() {
		return &unavailableError{msg: "checking this data dir's cluster ID with raft.peers"}
	}
	if _, id := n.raft.LeaderWithID(); id == "" {
		return fmt.Errorf("no known leader: %w", ErrNoLeader)
	}
	return n.ready.check(ctx)
}
