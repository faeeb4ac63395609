package raftlog

import (
	"bytes"
	"slices"
	"testing"

	"github.com/policyd/policyd/internal/third_party/raft"
)

// countingStore counts the reads that reach the store behind the cache.
type countingStore struct {
	*raft.InmemStore
	reads []uint64
}

func (s *countingStore) GetLog(idx uint64, log *raft.Log) error {
	s.reads = append(s.reads, idx)
	return s.InmemStore.GetLog(idx, log)
}

func TestLogCache(t *testing.T) {
	entry := func(idx uint64, size int) *raft.Log {
		return &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(idx)}, size)}
	}
	entries := func(from, to uint64, size int) []*raft.Log {
		var ls []*raft.Log
		for i := from; i <= to; i++ {
			ls = append(ls, entry(i, size))
		}
		return ls
	}
	store := func(ls []*raft.Log) func(*Cache) error { return func(c *Cache) error { return c.StoreLogs(ls) } }
	del := func(lo, hi uint64) func(*Cache) error {
		return func(c *Cache) error { return c.DeleteRange(lo, hi) }
	}
	tests := []struct {
		name       string
		maxCount   int
		maxBytes   int
		steps      []func(*Cache) error
		read       []uint64 // GetLog these, in order
		fromStore  []uint64 // of which these reach the store
		wantCached int
	}{
		{"newest entries by count", 4, 1 << 20,
			[]func(*Cache) error{store(entries(1, 10, 100))},
			[]uint64{10, 7, 6, 1}, []uint64{6, 1}, 4},
		{"newest entries by bytes", 100, 3000,
			[]func(*Cache) error{store(entries(1, 10, 1000))},
			[]uint64{10, 8, 7}, []uint64{7}, 3},
		{"an entry larger than the budget is not cached, nor what came before it", 100, 3000,
			[]func(*Cache) error{store(entries(1, 3, 100)), store([]*raft.Log{entry(4, 5000)})},
			[]uint64{4, 3}, []uint64{4, 3}, 0},
		{"caching resumes after a large entry", 100, 3000,
			[]func(*Cache) error{store([]*raft.Log{entry(1, 5000)}), store(entries(2, 3, 100))},
			[]uint64{3, 2, 1}, []uint64{1}, 2},
		{"a rewritten suffix starts the run over", 100, 1 << 20,
			[]func(*Cache) error{store(entries(1, 5, 100)), del(4, 5), store(entries(4, 6, 200))},
			[]uint64{6, 4, 3}, []uint64{3}, 3},
		{"entries stored out of order are not mixed in", 100, 1 << 20,
			// 7 and 8 come after a snapshot install.
			[]func(*Cache) error{store(entries(1, 3, 100)), store(entries(7, 8, 100))},
			[]uint64{8, 7, 3}, []uint64{3}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &countingStore{InmemStore: raft.NewInmemStore()}
			c := newCache(st, tc.maxCount, tc.maxBytes)
			for _, step := range tc.steps {
				if err := step(c); err != nil {
					t.Fatal(err)
				}
			}
			if len(c.run) != tc.wantCached {
				t.Errorf("cached %d entries, want %d", len(c.run), tc.wantCached)
			}
			if c.bytes > tc.maxBytes {
				t.Errorf("cached %d bytes, over the budget %d", c.bytes, tc.maxBytes)
			}
			for _, idx := range tc.read {
				var got, want raft.Log
				if err := c.GetLog(idx, &got); err != nil {
					t.Fatalf("GetLog(%d): %v", idx, err)
				}
				if err := st.InmemStore.GetLog(idx, &want); err != nil {
					t.Fatal(err)
				}
				if got.Index != want.Index || !bytes.Equal(got.Data, want.Data) {
					t.Errorf("GetLog(%d) = index %d, %d bytes; the store has index %d, %d bytes", idx, got.Index, len(got.Data), want.Index, len(want.Data))
				}
			}
			if !slices.Equal(st.reads, tc.fromStore) {
				t.Errorf("reads that reached the store %v, want %v", st.reads, tc.fromStore)
			}
		})
	}
}

func TestLogCacheStaged(t *testing.T) {
	batch := func(from, to uint64, size int) []*raft.Log {
		var ls []*raft.Log
		for i := from; i <= to; i++ {
			ls = append(ls, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(i)}, size)})
		}
		return ls
	}
	tests := []struct {
		name string
		size int // of each staged entry; the budget is 3000 bytes
		// after StoreLogs, the reads of the staged entries that reach the store
		fromStoreAfter []uint64
	}{
		{"within the budget: cached once stored", 100, nil},
		{"over the budget: served while staged, then from the store", 2000, []uint64{3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &countingStore{InmemStore: raft.NewInmemStore()}
			c := newCache(st, 100, 3000)
			if err := c.StoreLogs(batch(1, 2, 100)); err != nil {
				t.Fatal(err)
			}
			staged := batch(3, 4, tc.size)
			c.StageLogs(staged)
			for _, l := range staged {
				var got raft.Log
				if err := c.GetLog(l.Index, &got); err != nil {
					t.Fatalf("GetLog(%d) of a staged entry: %v", l.Index, err)
				}
				if !bytes.Equal(got.Data, l.Data) {
					t.Errorf("GetLog(%d) = %d bytes, want the staged %d", l.Index, len(got.Data), len(l.Data))
				}
			}
			if len(st.reads) != 0 {
				t.Fatalf("staged entries were read from the store: %v", st.reads)
			}
			if err := c.StoreLogs(staged); err != nil {
				t.Fatal(err)
			}
			if c.staged != nil {
				t.Errorf("%d entries still staged after StoreLogs", len(c.staged))
			}
			for _, idx := range []uint64{3, 4} {
				var got raft.Log
				if err := c.GetLog(idx, &got); err != nil || got.Index != idx {
					t.Fatalf("GetLog(%d) after StoreLogs = index %d, %v", idx, got.Index, err)
				}
			}
			if !slices.Equal(st.reads, tc.fromStoreAfter) {
				t.Errorf("reads that reached the store %v, want %v", st.reads, tc.fromStoreAfter)
			}
		})
	}
}
