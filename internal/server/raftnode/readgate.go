package raftnode

import (
	"context"
	"sync"
	"time"
)

// readGate coalesces consistent reads. A caller waits for a read that
// started after it arrived, so it returns only once the local replica holds
// everything committed before the call; callers that arrive together share
// one read, so a reconnect storm of thousands of sidecars costs a handful of
// ReadIndex round trips to the leader, not one each.
//
// Discovery streams pass through it before their first snapshot: a sidecar
// that fails over from an up-to-date node to a lagging one must not be sent
// an older policy set than it already holds (found by the chaos suite). A
// node that cannot confirm it is current (no leader, partitioned) refuses
// the stream, and the sidecar keeps its newer cached set and tries another
// node.
type readGate struct {
	ctx     context.Context // the node's life; ends in-flight reads on shutdown
	read    func(ctx context.Context) error
	timeout time.Duration

	mu      sync.Mutex
	waiting []chan error
	running bool
}

func newReadGate(ctx context.Context, timeout time.Duration, read func(ctx context.Context) error) *readGate {
	return &readGate{ctx: ctx, read: read, timeout: timeout}
}

// Wait returns nil once a consistent read started after the call has
// completed, or the read's error.
func (g *readGate) Wait(ctx context.Context) error {
	ch := make(chan error, 1)
	g.mu.Lock()
	g.waiting = append(g.waiting, ch)
	if !g.running {
		g.running = true
		go g.loop()
	}
	g.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loop runs one read per batch of waiters until none are left. Every
// waiter of a batch arrived before its read started.
func (g *readGate) loop() {
	for {
		g.mu.Lock()
		batch := g.waiting
		g.waiting = nil
		if len(batch) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		ctx, cancel := context.WithTimeout(g.ctx, g.timeout)
		err := g.read(ctx)
		cancel()
		for _, ch := range batch {
			ch <- err
		}
	}
}
