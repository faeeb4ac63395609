package store

import (
	"fmt"
	"log/slog"
)

// Size is the number of bytes WriteTo writes: the database file as of the
// snapshot. A backup sent over HTTP announces it as Content-Length, so that a
// cut-off transfer is an error rather than a short file.
func (sn *Snapshot) Size() int64 { return sn.tx.Size() }

// FileInfo describes a state database file without opening it for writing.
type FileInfo struct {
	// AppliedIndex is the index of the last Raft entry the file holds.
	AppliedIndex uint64
	// Digest is the same state digest Store.Digest reports for a live
	// replica at that index.
	Digest string
}

// Inspect checks, read-only, that path is a policyd state database (a backup
// written by Snapshot.WriteTo, or a stopped node's state.db) and reports its
// applied index and digest. It never writes to the file, so a backup can be
// verified in place.
func Inspect(path string) (FileInfo, error) {
	if err := checkFile(path); err != nil {
		return FileInfo{}, err
	}
	db, err := openBolt(path, true, false)
	if err != nil {
		return FileInfo{}, err
	}
	// A read-only Store over the file reuses Digest as is; nothing but the
	// two reads below touches it.
	defer db.Close() // read-only: nothing to flush
	s := &Store{path: path, logger: slog.New(slog.DiscardHandler), db: db}
	idx, err := s.readApplied()
	if err != nil {
		return FileInfo{}, err
	}
	s.applied.Store(idx)
	digest, idx, err := s.Digest()
	if err != nil {
		return FileInfo{}, fmt.Errorf("inspect %q: %w", path, err)
	}
	return FileInfo{AppliedIndex: idx, Digest: digest}, nil
}
