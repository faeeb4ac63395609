package raftlog

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/hashicorp/go-hclog"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/policyd/policyd/internal/third_party/raft"
	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/internal/store/boltcheck"
)

// Raft log store kinds (config raft.log_store).
const (
	// KindBoltDB is hashicorp/raft-boltdb: one bbolt file, raft/raft.db.
	// Each append is a bbolt commit: two fsyncs.
	KindBoltDB = "boltdb"
	// KindWAL is hashicorp/raft-wal: segment files in raft/wal/. Each
	// append is one write and one fsync, and truncation after a snapshot
	// deletes whole segments instead of freeing B-tree pages. The default
	// for new data directories, as in Consul since 1.20
	// (hashicorp/consul#21992). Term and vote go to its bbolt meta
	// database, raft/wal/wal-meta.db.
	KindWAL = "wal"
)

const (
	boltLogFile = "raft.db"
	walDir      = "wal"
)

// Store is the Raft log and stable store of one node.
type Store interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// Existing reports which kind of log raftDir holds, or "" if none. A node
// keeps the kind it was created with whatever raft.log_store says
// later: there is no conversion between them.
func Existing(raftDir string) (string, error) {
	for _, c := range []struct{ kind, path string }{
		{KindBoltDB, filepath.Join(raftDir, boltLogFile)},
		{KindWAL, filepath.Join(raftDir, walDir)},
	} {
		if _, err := os.Stat(c.path); err == nil {
			return c.kind, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("raft log store: %w", err)
		}
	}
	return "", nil
}

// ErrDamaged is returned by Open when the log on disk cannot be read back
// whole.
var ErrDamaged = errors.New("raft log damaged")

// Open opens the log in raftDir, the kind already there or else kind, and
// returns the kind it opened; a log it cannot read back whole is refused
// with ErrDamaged and an error naming the file.
func Open(raftDir, kind string, logger hclog.Logger) (Store, string, error) {
	// Before opening, it checks the bbolt file (raft.db, or raft-wal's
	// wal-meta.db) with internal/store/boltcheck, since bbolt would fault or
	// panic on a damaged one; after, it reads every entry and Raft's term
	// and vote back, since hashicorp/raft panics on an entry it cannot read.
	// Entries at or below the latest snapshot may be missing: a follower
	// that installs a snapshot keeps the older entries it had, so its log
	// can skip from those to the snapshot's index, and raft never reads them
	// again.
	ls, kind, err := openStore(raftDir, kind, logger)
	if err != nil {
		return nil, "", err
	}
	snap, err := latestSnapshot(raftDir, logger)
	if err != nil {
		_ = ls.Close()
		return nil, "", err
	}
	if err := verifyLog(ls, snap); err != nil {
		_ = ls.Close()
		return nil, "", fmt.Errorf("raft log %s: %w", Path(raftDir, kind), err)
	}
	return ls, kind, nil
}

// Path is the file (boltdb) or directory (wal) of a log store.
func Path(raftDir, kind string) string {
	if kind == KindWAL {
		return filepath.Join(raftDir, walDir)
	}
	return filepath.Join(raftDir, boltLogFile)
}

// checkBolt refuses a bbolt file that is not whole (internal/store/boltcheck).
func checkBolt(path string) error {
	if err := boltcheck.Check(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("open raft log %q: %w: %w", path, ErrDamaged, err)
	}
	return nil
}

// guardOpen runs open, turning a panic or memory fault in this goroutine
// (bbolt on a file checkBolt missed) into ErrDamaged.
func guardOpen[T any](path string, open func() (T, error)) (_ T, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("open raft log %q: %w: %v", path, ErrDamaged, r)
		}
	}()
	return open()
}

// Raft's stable-store keys (hashicorp/raft's keyCurrentTerm and friends).
var (
	keyCurrentTerm  = []byte("CurrentTerm")
	keyLastVoteTerm = []byte("LastVoteTerm")
	keyLastVoteCand = []byte("LastVoteCand")
)

// latestSnapshot is the index of the newest snapshot in raftDir, 0 if none.
func latestSnapshot(raftDir string, logger hclog.Logger) (uint64, error) {
	if _, err := os.Stat(filepath.Join(raftDir, "snapshots")); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, 1, logger.Named("snapshots"))
	if err != nil {
		return 0, fmt.Errorf("open raft snapshots in %q: %w", raftDir, err)
	}
	metas, err := snaps.List()
	if err != nil {
		return 0, fmt.Errorf("list raft snapshots in %q: %w", raftDir, err)
	}
	if len(metas) == 0 {
		return 0, nil
	}
	return metas[0].Index, nil
}

// verifyLog reads back Raft's term and vote and every entry in the log, in
// order, the way Raft reads them when it starts and replays; an entry at or
// below snapshot may be missing.
func verifyLog(ls Store, snapshot uint64) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrDamaged, r)
		}
	}()
	for _, k := range [][]byte{keyCurrentTerm, keyLastVoteTerm} {
		if _, err := ls.GetUint64(k); err != nil && !isNotFound(err) {
			return fmt.Errorf("%w: read %s: %w", ErrDamaged, k, err)
		}
	}
	if _, err := ls.Get(keyLastVoteCand); err != nil && !isNotFound(err) {
		return fmt.Errorf("%w: read %s: %w", ErrDamaged, keyLastVoteCand, err)
	}
	first, err := ls.FirstIndex()
	if err != nil {
		return fmt.Errorf("%w: first index: %w", ErrDamaged, err)
	}
	last, err := ls.LastIndex()
	if err != nil {
		return fmt.Errorf("%w: last index: %w", ErrDamaged, err)
	}
	if first == 0 && last == 0 {
		return nil
	}
	if first == 0 || first > last {
		return fmt.Errorf("%w: the log runs from index %d to %d", ErrDamaged, first, last)
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := ls.GetLog(i, &l); err != nil {
			if i <= snapshot && errors.Is(err, raft.ErrLogNotFound) {
				i = snapshot // the rest up to the snapshot may be gone too
				continue
			}
			return fmt.Errorf("%w: entry %d of %d-%d: %w", ErrDamaged, i, first, last, err)
		}
		if l.Index != i {
			return fmt.Errorf("%w: entry %d of %d-%d holds index %d", ErrDamaged, i, first, last, l.Index)
		}
	}
	return nil
}

// isNotFound is a stable-store key never written (a node that never
// voted); raft-wal returns no error for one.
func isNotFound(err error) bool { return errors.Is(err, raftboltdb.ErrKeyNotFound) }

func openStore(raftDir, kind string, logger hclog.Logger) (Store, string, error) {
	existing, err := Existing(raftDir)
	if err != nil {
		return nil, "", err
	}
	if existing != "" && existing != kind {
		logger.Warn("raft.log_store differs from the log on disk; keeping the log on disk (there is no conversion)",
			"configured", kind, "on_disk", existing)
		kind = existing
	}
	switch kind {
	case KindWAL:
		dir := filepath.Join(raftDir, walDir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, "", fmt.Errorf("create raft wal dir %q: %w", dir, err)
		}
		if err := checkBolt(filepath.Join(dir, metadb.FileName)); err != nil {
			return nil, "", err
		}
		meta := &metadb.BoltMetaDB{}
		w, err := guardOpen(dir, func() (*wal.WAL, error) {
			return wal.Open(dir, wal.WithLogger(logger.Named("wal")), wal.WithMetaStore(meta))
		})
		if err != nil {
			_ = meta.Close()
			if errors.Is(err, wal.ErrCorrupt) {
				err = fmt.Errorf("%w: %w", ErrDamaged, err)
			}
			return nil, "", fmt.Errorf("open raft wal %q: %w", dir, err)
		}
		return fromUpstream{&walStore{WAL: w, meta: meta}}, kind, nil
	case KindBoltDB:
		path := filepath.Join(raftDir, boltLogFile)
		// The free list is not written on each commit but rebuilt by
		// scanning the file on open (what etcd does for its backend): every
		// log truncation after a snapshot frees many pages, and writing that
		// list on every commit is most of a commit's pages under write load.
		// Each append is still fsynced before it counts.
		if err := checkBolt(path); err != nil {
			return nil, "", err
		}
		ls, err := guardOpen(path, func() (*raftboltdb.BoltStore, error) {
			return raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{
				Timeout:        2 * time.Second, // another process holds the lock: fail, don't hang
				NoFreelistSync: true,
				FreelistType:   bbolt.FreelistMapType,
			}})
		})
		if err != nil {
			if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) {
				err = fmt.Errorf("%w: %w", ErrDamaged, err)
			}
			return nil, "", fmt.Errorf("open raft log %q: %w", path, err)
		}
		return fromUpstream{ls}, kind, nil
	}
	return nil, "", fmt.Errorf("raft.log_store %q: want %s or %s", kind, KindBoltDB, KindWAL)
}

// lockFiles are the bbolt files in raftDir that a running node holds
// locked, for either kind of log; the offline commands check them to refuse
// a node that is running.
func lockFiles(raftDir string) []string {
	return []string{filepath.Join(raftDir, boltLogFile), filepath.Join(raftDir, walDir, metadb.FileName)}
}

// walStore closes the WAL's meta database too: raft-wal v0.4.0's Close
// leaves it open, and with it the file lock, so the same process could not
// open the log again (a node restarted in-process waited on the lock for
// ever).
type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (s *walStore) Close() error {
	return errors.Join(s.WAL.Close(), s.meta.Close())
}
