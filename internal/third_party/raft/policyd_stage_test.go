// policyd: not upstream. Runs upstream's cluster tests through the leader's
// parallel append (LogStager, see dispatchLogs and README.md).

package raft

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func init() {
	// RAFT_STAGE_LOGS=0 runs upstream's unpatched path instead.
	if os.Getenv("RAFT_STAGE_LOGS") != "0" {
		testStageLogs = newStagingStore
	}
}

// stagingStore is a LogStager in front of a LogStore: staged entries are
// served from memory until StoreLogs has written them, as policyd's log
// cache does.
type stagingStore struct {
	LogStore
	mu     sync.Mutex
	staged map[uint64]*Log
	// stagedTotal counts staged entries, for TestStagingInUse.
	stagedTotal atomic.Uint64
}

var _ LogStager = (*stagingStore)(nil)

// newStagingStore wraps s; the result is a MonotonicLogStore only when s
// is one, as tests assert on that.
func newStagingStore(s LogStore) LogStore {
	st := &stagingStore{LogStore: s, staged: make(map[uint64]*Log)}
	if m, ok := s.(MonotonicLogStore); ok {
		return &monotonicStagingStore{stagingStore: st, m: m}
	}
	return st
}

func (s *stagingStore) StageLogs(logs []*Log) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range logs {
		s.staged[l.Index] = l
	}
	s.stagedTotal.Add(uint64(len(logs)))
}

func (s *stagingStore) GetLog(idx uint64, log *Log) error {
	s.mu.Lock()
	l, ok := s.staged[idx]
	s.mu.Unlock()
	if ok {
		*log = *l
		return nil
	}
	return s.LogStore.GetLog(idx, log)
}

func (s *stagingStore) StoreLog(l *Log) error { return s.StoreLogs([]*Log{l}) }

// StoreLogs yields first, so that the replicators woken by dispatchLogs
// usually send the staged entries before they are durable here: the
// leader's own write then finishes after the followers', the case the
// patch must get right.
func (s *stagingStore) StoreLogs(logs []*Log) error {
	runtime.Gosched()
	err := s.LogStore.StoreLogs(logs)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range logs {
		delete(s.staged, l.Index)
	}
	return err
}

func (s *stagingStore) DeleteRange(lo, hi uint64) error {
	s.mu.Lock()
	for i := range s.staged {
		if i >= lo && i <= hi {
			delete(s.staged, i)
		}
	}
	s.mu.Unlock()
	return s.LogStore.DeleteRange(lo, hi)
}

// monotonicStagingStore is a stagingStore of a MonotonicLogStore.
type monotonicStagingStore struct {
	*stagingStore
	m MonotonicLogStore
}

func (s *monotonicStagingStore) IsMonotonic() bool { return s.m.IsMonotonic() }

// TestStagingInUse checks that this package's cluster tests go through
// the staged path: a leader of a MakeCluster cluster stages what it
// appends.
func TestStagingInUse(t *testing.T) {
	if testStageLogs == nil {
		t.Skip("RAFT_STAGE_LOGS=0: upstream's path")
	}
	c := MakeCluster(3, t, nil)
	defer c.Close()
	leader := c.Leader()
	for i := 0; i < 10; i++ {
		if err := leader.Apply([]byte("test"), time.Second).Error(); err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
	}
	st, ok := leader.logs.(*stagingStore)
	if !ok {
		t.Fatalf("leader's log store is %T, want *stagingStore", leader.logs)
	}
	if n := st.stagedTotal.Load(); n < 10 {
		t.Fatalf("leader staged %d entries, want at least the 10 applied", n)
	}
	c.EnsureSame(t)
}
