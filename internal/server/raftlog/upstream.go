package raftlog

import (
	"errors"
	"io"

	upstream "github.com/hashicorp/raft"

	"github.com/policyd/policyd/internal/third_party/raft"
)

// upstreamStore is what raft-wal and raft-boltdb implement: hashicorp/raft's
// own stores, whose Log type is not the patched copy's.
type upstreamStore interface {
	upstream.LogStore
	upstream.StableStore
	io.Closer
}

// fromUpstream adapts a store written against hashicorp/raft to the copy in
// internal/third_party/raft, which is a package of this module so that it builds
// without a replace directive (and `go install …@version` works). The two
// Log types have the same fields; each call copies the struct and shares
// the data.
type fromUpstream struct{ s upstreamStore }

var (
	_ raft.LogStore          = fromUpstream{}
	_ raft.StableStore       = fromUpstream{}
	_ raft.MonotonicLogStore = fromUpstream{}
)

func (a fromUpstream) FirstIndex() (uint64, error) { return a.s.FirstIndex() }
func (a fromUpstream) LastIndex() (uint64, error)  { return a.s.LastIndex() }

func (a fromUpstream) GetLog(index uint64, log *raft.Log) error {
	var l upstream.Log
	if err := a.s.GetLog(index, &l); err != nil {
		if errors.Is(err, upstream.ErrLogNotFound) {
			// raft compares with its own sentinel.
			return raft.ErrLogNotFound
		}
		return err
	}
	*log = raft.Log{Index: l.Index, Term: l.Term, Type: raft.LogType(l.Type), Data: l.Data,
		Extensions: l.Extensions, AppendedAt: l.AppendedAt}
	return nil
}

func (a fromUpstream) StoreLog(log *raft.Log) error {
	l := toUpstream(log)
	return a.s.StoreLog(&l)
}

// StoreLogs is on every append's path: the copies share one allocation.
func (a fromUpstream) StoreLogs(logs []*raft.Log) error {
	copies := make([]upstream.Log, len(logs))
	out := make([]*upstream.Log, len(logs))
	for i, l := range logs {
		copies[i] = toUpstream(l)
		out[i] = &copies[i]
	}
	return a.s.StoreLogs(out)
}

func (a fromUpstream) DeleteRange(lo, hi uint64) error { return a.s.DeleteRange(lo, hi) }

func (a fromUpstream) Set(key, val []byte) error            { return a.s.Set(key, val) }
func (a fromUpstream) Get(key []byte) ([]byte, error)       { return a.s.Get(key) }
func (a fromUpstream) SetUint64(key []byte, v uint64) error { return a.s.SetUint64(key, v) }
func (a fromUpstream) GetUint64(key []byte) (uint64, error) { return a.s.GetUint64(key) }
func (a fromUpstream) Close() error                         { return a.s.Close() }

// IsMonotonic passes raft-wal's promise on: it cannot delete a log suffix,
// so raft restores a snapshot over it instead.
func (a fromUpstream) IsMonotonic() bool {
	m, ok := a.s.(upstream.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func toUpstream(l *raft.Log) upstream.Log {
	return upstream.Log{Index: l.Index, Term: l.Term, Type: upstream.LogType(l.Type), Data: l.Data,
		Extensions: l.Extensions, AppendedAt: l.AppendedAt}
}
