package raftnode

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/raftlog"
)

// gatedStore holds the leader's StoreLogs of entries from index gate on
// until released, standing in for a slow disk.
type gatedStore struct {
	*raft.InmemStore
	mu      sync.Mutex
	gate    uint64 // 0: open
	blocked chan struct{}
	release chan struct{}
}

func (s *gatedStore) arm(from uint64) {
	s.mu.Lock()
	s.gate = from
	s.mu.Unlock()
}

func (s *gatedStore) StoreLogs(logs []*raft.Log) error {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != 0 && logs[len(logs)-1].Index >= gate {
		close(s.blocked)
		<-s.release
	}
	return s.InmemStore.StoreLogs(logs)
}

func (s *gatedStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (nopFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

// TestLeaderAppendsInParallel runs three Raft nodes over loopback TCP with
// policyd's log cache (a raft.LogStager) and the patched hashicorp/raft
// (internal/third_party/raft): while the leader's own append of an entry is held
// up, the followers must already receive and store it, and the entry must
// commit once the leader's append completes.
func TestLeaderAppendsInParallel(t *testing.T) {
	const n = 3
	stores := make([]*gatedStore, n)
	rafts := make([]*raft.Raft, n)
	var servers []raft.Server
	var transports []*raft.NetworkTransport
	for i := range n {
		tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 3, 5*time.Second, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		transports = append(transports, tr)
		servers = append(servers, raft.Server{ID: raft.ServerID(fmt.Sprint("n", i)), Address: tr.LocalAddr(), Suffrage: raft.Voter})
	}
	for i := range n {
		stores[i] = &gatedStore{InmemStore: raft.NewInmemStore(), blocked: make(chan struct{}), release: make(chan struct{})}
		conf := raft.DefaultConfig()
		conf.LocalID = servers[i].ID
		conf.Logger = hclog.NewNullLogger()
		conf.HeartbeatTimeout = 200 * time.Millisecond
		conf.ElectionTimeout = 200 * time.Millisecond
		conf.LeaderLeaseTimeout = 100 * time.Millisecond
		logs := raftlog.NewCache(stores[i])
		r, err := raft.NewRaft(conf, nopFSM{}, logs, stores[i], raft.NewInmemSnapshotStore(), transports[i])
		if err != nil {
			t.Fatal(err)
		}
		rafts[i] = r
	}
	t.Cleanup(func() {
		for i, r := range rafts {
			if err := r.Shutdown().Error(); err != nil {
				t.Errorf("shut down %s: %v", servers[i].ID, err)
			}
		}
		// Closing every pooled outbound connection ends the peers'
		// inbound readers; Close alone only stops the listener.
		for _, tr := range transports {
			tr.CloseStreams()
			_ = tr.Close()
		}
	})
	if err := rafts[0].BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		t.Fatal(err)
	}
	leader := -1
	poll.Eventually(t, "a leader", func() error {
		for i, r := range rafts {
			if r.State() == raft.Leader {
				leader = i
				return nil
			}
		}
		return errors.New("no leader yet")
	}, poll.Within(10*time.Second))

	// The leader's no-op is committed; the next entry is held up on it.
	if err := rafts[leader].Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	next := rafts[leader].LastIndex() + 1
	ls := stores[leader]
	ls.arm(next)
	released := false
	defer func() {
		if !released {
			close(ls.release)
		}
	}()

	f := rafts[leader].Apply([]byte("x"), 10*time.Second)
	select {
	case <-ls.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader never appended the entry")
	}
	poll.Eventually(t, "the followers to store the entry while the leader's append is held up", func() error {
		for i, st := range stores {
			if i == leader {
				continue
			}
			if last, _ := st.LastIndex(); last < next {
				return fmt.Errorf("follower n%d has index %d, want %d", i, last, next)
			}
		}
		return nil
	}, poll.Within(10*time.Second))

	if last, _ := ls.LastIndex(); last >= next {
		t.Fatalf("the leader stored index %d before its append was released", last)
	}
	close(ls.release)
	released = true
	if err := f.Error(); err != nil {
		t.Fatalf("apply after the leader's append completed: %v", err)
	}
	if f.Index() != next {
		t.Errorf("committed at index %d, want %d", f.Index(), next)
	}
}
