package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// Raft log store kinds (config raft.log_store).
const (
	// LogStoreBoltDB is hashicorp/raft-boltdb: one bbolt file, raft/raft.db.
	// Each append is a bbolt commit: two fsyncs.
	LogStoreBoltDB = "boltdb"
	// LogStoreWAL is hashicorp/raft-wal: segment files in raft/wal/. Each
	// append is one write and one fsync, and truncation after a snapshot
	// deletes whole segments instead of freeing B-tree pages. Opt-in: the
	// design names raft-boltdb, and raft-wal's own README still calls it
	// experimental, although Consul has used it for new data directories
	// since 1.20 (hashicorp/consul#21992).
	LogStoreWAL = "wal"
)

const (
	boltLogFile = "raft.db"
	walDir      = "wal"
)

// LogStore is the Raft log and stable store of one node.
type LogStore interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// ExistingLogStore reports which kind of log raftDir holds, or "" if none.
// A node keeps the kind it was created with whatever raft.log_store says
// later: there is no conversion between them.
func ExistingLogStore(raftDir string) (string, error) {
	for _, c := range []struct{ kind, path string }{
		{LogStoreBoltDB, filepath.Join(raftDir, boltLogFile)},
		{LogStoreWAL, filepath.Join(raftDir, walDir)},
	} {
		if _, err := os.Stat(c.path); err == nil {
			return c.kind, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("raft log store: %w", err)
		}
	}
	return "", nil
}

// OpenLogStore opens the log in raftDir: the kind already there, else kind.
// It returns the kind it opened.
func OpenLogStore(raftDir, kind string, logger hclog.Logger) (LogStore, string, error) {
	existing, err := ExistingLogStore(raftDir)
	if err != nil {
		return nil, "", err
	}
	if existing != "" && existing != kind {
		logger.Warn("raft.log_store differs from the log on disk; keeping the log on disk (there is no conversion)",
			"configured", kind, "on_disk", existing)
		kind = existing
	}
	switch kind {
	case LogStoreWAL:
		dir := filepath.Join(raftDir, walDir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, "", fmt.Errorf("create raft wal dir %q: %w", dir, err)
		}
		meta := &metadb.BoltMetaDB{}
		w, err := wal.Open(dir, wal.WithLogger(logger.Named("wal")), wal.WithMetaStore(meta))
		if err != nil {
			_ = meta.Close()
			return nil, "", fmt.Errorf("open raft wal %q: %w", dir, err)
		}
		return &walStore{WAL: w, meta: meta}, kind, nil
	case LogStoreBoltDB:
		path := filepath.Join(raftDir, boltLogFile)
		// The free list is not written on each commit but rebuilt by
		// scanning the file on open (what etcd does for its backend): every
		// log truncation after a snapshot frees many pages, and writing that
		// list on every commit is most of a commit's pages under write load.
		// Each append is still fsynced before it counts.
		ls, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{
			Timeout:        2 * time.Second, // another process holds the lock: fail, don't hang
			NoFreelistSync: true,
			FreelistType:   bbolt.FreelistMapType,
		}})
		if err != nil {
			return nil, "", fmt.Errorf("open raft log %q: %w", path, err)
		}
		return ls, kind, nil
	}
	return nil, "", fmt.Errorf("raft.log_store %q: want %s or %s", kind, LogStoreBoltDB, LogStoreWAL)
}

// LogStoreLockFiles are the bbolt files in raftDir that a running node holds
// locked, for either kind of log; the offline commands check them to refuse
// a node that is running.
func LogStoreLockFiles(raftDir string) []string {
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
