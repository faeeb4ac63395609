package raftnode

import (
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// Bounds of the leader's in-memory copy of recent log entries.
const (
	// logCacheEntries: a replication batch (raft.max_append_entries, 512)
	// fits.
	logCacheEntries = 512
	// logCacheBytes: 512 entries of 4 KB policies fit (about 2 MiB);
	// larger entries are cached fewer at a time. A policy may be up to
	// 1 MiB (the request body limit), and hashicorp/raft's own LogCache,
	// bounded in entries only, then held up to 512 MiB.
	logCacheBytes = 8 << 20
)

// logCache keeps the most recent log entries in memory so that the leader
// does not read back from disk every entry it has just appended in order to
// send it to the followers (from raft.db that was a twentieth of the
// leader's CPU under write load). It is hashicorp/raft's LogCache with a
// bound in bytes as well as in entries: it holds a contiguous run of the
// newest entries, at most logCacheEntries of them and at most
// logCacheBytes of entry data, and anything else is read from the store.
//
// It is also the leader's raft.LogStager (third_party/raft): entries the
// leader has sent to its followers but not yet written itself are served
// from staged, outside the bounds, until StoreLogs returns. They are the
// batch raft holds in memory anyway.
type logCache struct {
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

var _ raft.LogStager = (*logCache)(nil)

func newLogCache(store raft.LogStore, maxCount, maxBytes int) *logCache {
	return &logCache{store: store, maxCount: maxCount, maxBytes: maxBytes}
}

// GetLog implements raft.LogStore.
func (c *logCache) GetLog(idx uint64, log *raft.Log) error {
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
func (c *logCache) StageLogs(logs []*raft.Log) {
	c.mu.Lock()
	c.staged = logs
	c.mu.Unlock()
}

// StoreLog implements raft.LogStore.
func (c *logCache) StoreLog(log *raft.Log) error {
	return c.StoreLogs([]*raft.Log{log})
}

// StoreLogs implements raft.LogStore: the store first, then the cache, so
// that the bounded run never holds an entry the store does not (only
// staged, which StoreLogs clears, does).
func (c *logCache) StoreLogs(logs []*raft.Log) error {
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

// entrySize is what an entry counts against logCacheBytes.
func entrySize(l *raft.Log) int { return len(l.Data) + len(l.Extensions) }

func (c *logCache) reset() {
	clear(c.run)
	c.run, c.bytes = c.run[:0], 0
}

// DeleteRange implements raft.LogStore. Raft deletes a prefix after a
// snapshot and, on a follower, a conflicting suffix; either way the cache
// starts over. (Staged entries are newer than any snapshot, and only a
// leader stages, so neither deletion reaches them.)
func (c *logCache) DeleteRange(lo, hi uint64) error {
	c.mu.Lock()
	c.reset()
	c.mu.Unlock()
	return c.store.DeleteRange(lo, hi)
}

// FirstIndex implements raft.LogStore.
func (c *logCache) FirstIndex() (uint64, error) { return c.store.FirstIndex() }

// LastIndex implements raft.LogStore.
func (c *logCache) LastIndex() (uint64, error) { return c.store.LastIndex() }

// IsMonotonic implements raft.MonotonicLogStore when the store does
// (raft-wal), so that raft keeps treating the log as monotonic through the
// cache.
func (c *logCache) IsMonotonic() bool {
	m, ok := c.store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
