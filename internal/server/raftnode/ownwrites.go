package raftnode

import (
	"context"
	"fmt"
	"sync/atomic"
)

// ReadOwnWrites returns once the local replica holds every write this node
// has acknowledged (a Propose that returned it committed), or ctx's error.
// A write is acknowledged once the leader has applied it, and a follower
// applies it within raft.commit_timeout of that, so the wait is short and
// costs nothing once the replica has caught up; it never asks the leader.
// Local reads and sidecar handshakes wait for it, so that nothing this node
// has answered as written is then read back as missing.
func (n *Node) ReadOwnWrites(ctx context.Context) error {
	idx := n.acked.Load()
	if n.store.AppliedIndex() >= idx {
		return nil
	}
	if err := n.store.WaitApplied(ctx, idx); err != nil {
		return fmt.Errorf("apply index %d, a write this node acknowledged (applied %d): %w", idx, n.store.AppliedIndex(), err)
	}
	return nil
}

// watermark is a monotonic index.
type watermark struct{ v atomic.Uint64 }

// Load returns the highest index raised so far.
func (w *watermark) Load() uint64 { return w.v.Load() }

func (w *watermark) raise(idx uint64) {
	for {
		cur := w.v.Load()
		if idx <= cur || w.v.CompareAndSwap(cur, idx) {
			return
		}
	}
}
