// policyd: not upstream. With BatchApplyCh, a future that is still queued
// when raft shuts down must be answered (see ApplyLog and README.md).

package raft

import (
	"errors"
	"testing"
	"time"
)

// TestApplyQueuedAtShutdownResolves applies after Shutdown. ApplyLog picks at
// random between the closed shutdown channel and the buffered applyCh, which
// no loop drains any more, so about half of these futures are queued; before
// the patch their Error never returned.
func TestApplyQueuedAtShutdownResolves(t *testing.T) {
	tests := []struct {
		name string
		call func(r *Raft) Future
	}{
		{"Apply", func(r *Raft) Future { return r.Apply([]byte("x"), 0) }},
		{"Barrier", func(r *Raft) Future { return r.Barrier(0) }},
		{"VerifyLeader", func(r *Raft) Future { return r.VerifyLeader() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A cluster each: the first subtest leaves applyCh full, and
			// a full channel would make every later call take the
			// shutdown branch.
			conf := inmemConfig(t)
			conf.BatchApplyCh = true
			c := MakeCluster(1, t, conf)
			defer c.Close()
			r := c.Leader()
			if err := r.Shutdown().Error(); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			for i := 0; i < 2*conf.MaxAppendEntries; i++ {
				f := tc.call(r)
				done := make(chan error, 1)
				go func() { done <- f.Error() }()
				select {
				case err := <-done:
					if !errors.Is(err, ErrRaftShutdown) {
						t.Fatalf("%s %d after shutdown: got %v, want %v", tc.name, i, err, ErrRaftShutdown)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s %d after shutdown: Error did not return", tc.name, i)
				}
			}
		})
	}
}
