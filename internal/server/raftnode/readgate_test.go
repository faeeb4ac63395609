package raftnode

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/poll"
)

// TestReadGateStartsAfterArrival checks the property discovery relies on: a
// waiter is answered only by a read that began after it called Wait, even
// when a read was already in flight, and concurrent waiters share reads.
func TestReadGateStartsAfterArrival(t *testing.T) {
	var started atomic.Int64 // reads begun
	release := make(chan struct{})
	g := newReadGate(t.Context(), 5*time.Second, func(ctx context.Context) error {
		started.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})

	first := make(chan error, 1)
	go func() { first <- g.Wait(t.Context()) }()
	poll.Eventually(t, "first read to start", func() error {
		if started.Load() != 1 {
			return errors.New("not started")
		}
		return nil
	}, poll.Within(5*time.Second))

	// These arrive while read 1 is in flight: read 1 must not answer them.
	const late = 20
	var wg sync.WaitGroup
	var answered atomic.Int64
	for range late {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Wait(t.Context()); err != nil {
				t.Errorf("late Wait: %v", err)
			}
			answered.Add(1)
		}()
	}
	poll.Eventually(t, "late waiters queued", func() error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.waiting) != late {
			return errors.New("not all queued")
		}
		return nil
	}, poll.Within(5*time.Second))

	release <- struct{}{} // ends read 1
	if err := <-first; err != nil {
		t.Fatalf("first Wait: %v", err)
	}
	if got := answered.Load(); got != 0 {
		t.Fatalf("%d late waiters answered by a read that started before they arrived", got)
	}
	close(release) // read 2, shared by all late waiters
	wg.Wait()
	if got, want := started.Load(), int64(2); got != want {
		t.Fatalf("reads = %d, want %d (late waiters share one read)", got, want)
	}
}

func TestReadGateError(t *testing.T) {
	errNoLeader := errors.New("no leader")
	g := newReadGate(t.Context(), time.Second, func(context.Context) error { return errNoLeader })
	if err := g.Wait(t.Context()); !errors.Is(err, errNoLeader) {
		t.Fatalf("Wait = %v, want %v", err, errNoLeader)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	blocked := newReadGate(t.Context(), time.Second, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	if err := blocked.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context = %v, want context.Canceled", err)
	}
}
