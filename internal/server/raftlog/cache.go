package raftlog

import (
	"fmt"
	"sync"

	"github.com/policyd/policyd/internal/third_party/raft"
)

// Bounds of the leader's in-memory copy of recent log entries.
const (
	// cacheEntries: a replication batch (raft.max_append_entries, 512)
	// fits.
	cacheEntries = 512
	// cacheBytes: 512 entries of 4 KB policies fit (about 2 MiB);
	// larger entries are cached fewer at a time. A policy may be up to
	// 1 MiB (the request body limit), and hashicorp/raft's own LogCache,
	// bounded in entries only, then held up to 512 MiB.
	cacheBytes = 8 << 20
)

// Cache keeps the newest log entries in memory, bounded in entries and in
// bytes, so that the leader does not read back from disk what it has just
// appended; it is also the leader's raft.LogStager (internal/third_party/raft).
type Cache struct {
	// Reading them back from raft.db was a twentieth of the leader's CPU
	// under write load. It is hashicorp/raft's LogCache with a bound in
	// bytes as well: a contiguous run of the newest entries, at most
	// cacheEntries of them and cacheBytes of entry data; anything else is
	// read from the store. Entries the leader has sent to its followers
	// but not yet written itself are served from staged, outside the
	// bounds, until StoreLogs returns: the batch raft holds in memory
	// anyway.
	store    raft.LogStore
	maxCount int
	maxBytes int

	mu sync.RWMutex
	// run is the cached entries, oldest first, contiguous in index.
	run   []*raft.Log
	bytes int
	// staged is the batch being written by StoreLogs after StageLogs.
	staged []*raft.Log
}

var _ raft.LogStager = (*Cache)(nil)

// NewCache caches the newest entries of store, within the bounds above.
func NewCache(store raft.LogStore) *Cache { return newCache(store, cacheEntries, cacheBytes) }

func newCache(store raft.LogStore, maxCount, maxBytes int) *Cache {
	return &Cache{store: store, maxCount: maxCount, maxBytes: maxBytes}
}

// GetLog implements raft.LogStore.
func (c *Cache) GetLog(idx uint64, log *raft.Log) error {
	c.mu.RLock()
	l := lookup(c.staged, idx)
	if l == nil {
		l = lookup(c.run, idx)
	}
	c.mu.RUnlock()
	if l != nil {
		*log = *l
		return nil
	}
	return c.store.GetLog(idx, log)
}

// lookup finds idx in a run of entries contiguous in index; nil if absent.
func lookup(run []*raft.Log, idx uint64) *raft.Log {
	if n := len(run); n > 0 && idx >= run[0].Index && idx <= run[n-1].Index {
		return run[idx-run[0].Index]
	}
	return nil
}

// StageLogs implements raft.LogStager: logs are readable from now until
// StoreLogs has stored them. Raft stages one batch at a time, always the
// batch it then stores.
func (c *Cache) StageLogs(logs []*raft.Log) {
	c.mu.Lock()
	c.staged = logs
	c.mu.Unlock()
}

// StoreLog implements raft.LogStore.
func (c *Cache) StoreLog(log *raft.Log) error {
	return c.StoreLogs([]*raft.Log{log})
}

// StoreLogs implements raft.LogStore: the store first, then the cache, so
// that the bounded run never holds an entry the store does not (only
// staged, which StoreLogs clears, does).
func (c *Cache) StoreLogs(logs []*raft.Log) error {
	if err := c.store.StoreLogs(logs); err != nil {
		return fmt.Errorf("store logs: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.staged = nil
	for _, l := range logs {
		if n := len(c.run); n > 0 && l.Index != c.run[n-1].Index+1 {
			// Not the next entry (a follower overwriting a conflicting
			// suffix): start the run over.
			c.reset()
		}
		size := entrySize(l)
		if size > c.maxBytes {
			c.reset() // too large to cache; the run would not be contiguous past it
			continue
		}
		c.run = append(c.run, l)
		c.bytes += size
		for len(c.run) > c.maxCount || c.bytes > c.maxBytes {
			c.bytes -= entrySize(c.run[0])
			c.run[0] = nil
			c.run = c.run[1:]
		}
	}
	return nil
}

// entrySize is what an entry counts against cacheBytes.
func entrySize(l *raft.Log) int { return len(l.Data) + len(l.Extensions) }

func (c *Cache) reset() {
	clear(c.run)
	c.run, c.bytes = c.run[:0], 0
}

// DeleteRange implements raft.LogStore. Raft deletes a prefix after a
// snapshot and, on a follower, a conflicting suffix; either way the cache
// starts over. (Staged entries are newer than any snapshot, and only a
// leader stages, so neither deletion reaches them.)
func (c *Cache) DeleteRange(lo, hi uint64) error {
	c.mu.Lock()
	c.reset()
	c.mu.Unlock()
	return c.store.DeleteRange(lo, hi)
}

// FirstIndex implements raft.LogStore.
func (c *Cache) FirstIndex() (uint64, error) { return c.store.FirstIndex() }

// LastIndex implements raft.LogStore.
func (c *Cache) LastIndex() (uint64, error) { return c.store.LastIndex() }

// IsMonotonic implements raft.MonotonicLogStore when the store does
// (raft-wal), so that raft keeps treating the log as monotonic through the
// cache.
func (c *Cache) IsMonotonic() bool {
	m, ok := c.store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
