// policyd: not upstream. With BatchApplyCh, a future that is still queued
// when raft shuts down must be answered (see ApplyLog and README.md).

package raft

import (
	"bytes"
	"errors"
	"sync"
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

// termGate blocks the first write of the current term until released.
type termGate struct {
	*InmemStore
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *termGate) SetUint64(key []byte, val uint64) error {
	if bytes.Equal(key, keyCurrentTerm) && val > 1 {
		g.once.Do(func() { close(g.entered); <-g.release })
	}
	return g.InmemStore.SetUint64(key, val)
}

// TestShutdownWaitsForHeartbeat runs a heartbeat from a newer term, which
// writes the term on the transport's goroutine, and shuts raft down while
// that write is in flight: before the patch Shutdown returned at once, and
// the caller closed the stores under the write.
func TestShutdownWaitsForHeartbeat(t *testing.T) {
	conf := inmemConfig(t)
	conf.LocalID = "a"
	gate := &termGate{InmemStore: NewInmemStore(), entered: make(chan struct{}), release: make(chan struct{})}
	_, trans := NewInmemTransport("a")
	r, err := NewRaft(conf, &MockFSM{}, NewInmemStore(), gate, NewInmemSnapshotStore(), trans)
	if err != nil {
		t.Fatal(err)
	}
	resp := make(chan RPCResponse, 1)
	go r.processHeartbeat(RPC{
		Command:  &AppendEntriesRequest{RPCHeader: RPCHeader{ID: []byte("b"), Addr: []byte("b")}, Term: 7},
		RespChan: resp,
	})
	select {
	case <-gate.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the heartbeat did not write the term")
	}
	done := make(chan struct{})
	go func() { _ = r.Shutdown().Error(); close(done) }()
	select {
	case <-done:
		t.Fatal("Shutdown returned with a heartbeat writing the stable store")
	case <-time.After(200 * time.Millisecond):
	}
	close(gate.release)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the heartbeat ended")
	}
	<-resp
}
