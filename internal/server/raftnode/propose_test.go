package raftnode

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// TestApplyAtRaftShutdownEnds proposes on a leader whose raft has shut down
// (as a crash under load leaves it). Raft's apply queue is buffered, so some
// of these entries are queued with no loop left to answer them: each call
// must still fail as ambiguous, and the goroutine that waits for raft's
// answer must end instead of waiting for ever (hashicorp/raft#498, patched
// in internal/third_party/raft).
func TestApplyAtRaftShutdownEnds(t *testing.T) {
	n, _ := singleNode(t, nil)
	cmd, err := command.New(&commandv1.PruneEvents{CutoffUnixNano: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.raft.Shutdown().Error(); err != nil {
		t.Fatalf("raft shutdown: %v", err)
	}
	// Twice the queue's length: some calls find it full, the rest queue.
	for i := range 2 * n.cfg.Raft.MaxAppendEntries {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := n.applyLocal(ctx, cmd, false)
		cancel()
		if !errors.Is(err, ErrAmbiguous) {
			t.Fatalf("apply %d after raft shutdown: got %v, want %v", i, err, ErrAmbiguous)
		}
	}
	poll.Eventually(t, "apply waiters to end", func() error {
		if k := servertest.Goroutines("raftnode.(*Node).applyLocal.func"); k > 0 {
			return fmt.Errorf("%d still waiting for raft", k)
		}
		return nil
	}, poll.Within(5*time.Second))

}
