// Package store is policyd's replicated state in one bbolt file
// (data_dir/state.db): policies, employees, the event log, entity-state
// versions, cluster members, drift and reload state and staged rollouts,
// plus the index of the last applied Raft entry. It knows nothing of Raft:
// its writer (raftfsm) hands it batches of decided changes, one bbolt
// transaction each, and subscribers hear of every committed batch
// (Subscribe). Open refuses a damaged file with ErrDamaged and never writes
// to it; the node then rebuilds state.db from its Raft snapshot and log.
// See docs/design.md and docs/operations.md.
package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store/boltcheck"
)

// Sentinel errors. Business errors (ErrNotFound, ErrConflict) come back as a
// command's result; they leave the state unchanged.
var (
	// ErrNotFound is returned when the named entity does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned when a compare-and-set precondition fails.
	ErrConflict = errors.New("conflict")
	// ErrForeignDB is returned by Open when the file is a valid bbolt
	// database that policyd did not create.
	ErrForeignDB = errors.New("not a policyd state database")
	// ErrClosed is returned by operations on a closed store.
	ErrClosed = errors.New("store closed")
	// ErrDamaged is returned by Open, Inspect and Restore when the file is
	// not a whole bbolt database: truncated, or with pages overwritten (see
	// internal/store/boltcheck).
	ErrDamaged = boltcheck.ErrDamaged
)

// schemaMagic marks a state.db as ours. A new schema gets a new value and a
// migration; a node never guesses at a file it does not recognise.
const schemaMagic = "policyd-state-v1"

var (
	bucketMeta     = []byte("meta")
	bucketPolicies = []byte("policies")
	bucketEmploy   = []byte("employees")
	bucketEvents   = []byte("events")
	bucketStates   = []byte("entity_states")
	bucketMembers  = []byte("members")

	// dataBuckets is every bucket that holds replicated state, in digest order.
	dataBuckets = [][]byte{bucketPolicies, bucketEmploy, bucketEvents, bucketStates, bucketMembers, bucketDriftReports, bucketDriftTasks, bucketDriftOpen, bucketReloadHashes, bucketReloadPending, bucketReloadRestarts, bucketReloadErrors, bucketRollouts, bucketRolloutLocks, bucketSources}

	keyMagic         = []byte("magic")
	keyAppliedIndex  = []byte("applied_index")
	keyPrunedThrough = []byte("events_pruned_through")
)

// Store is the bbolt-backed state. All methods are safe for concurrent use.
type Store struct {
	path   string
	logger *slog.Logger

	// mu guards db: every transaction holds it for reading, and only Restore
	// and Close, which replace or close the file, hold it for writing.
	mu     sync.RWMutex
	db     *bolt.DB
	closed bool

	// noSync: commits skip fsync and the file carries a dirty marker
	// while open (see Options.NoSync).
	noSync    bool
	discarded bool

	applied atomic.Uint64

	waitMu sync.Mutex
	waitCh chan struct{} // closed and replaced whenever applied advances

	subMu sync.Mutex
	subs  map[*Subscription]struct{}

	digestMu    sync.Mutex
	digestIndex uint64
	digest      string
}

// Options tune how a store writes.
type Options struct {
	// NoSync commits batches without fsync. The caller must hold a durable
	// copy of every batch elsewhere and be able to apply it again: the
	// daemon's Raft log, replayed on top of the latest Raft snapshot. bbolt
	// without fsync is only safe while the process lives, since the kernel
	// may write a commit's pages in any order, so the store marks the file
	// dirty (DirtySuffix) before its first write and clears the mark only
	// after a final fsync in Close. A dirty file found by the next Open is
	// discarded, whatever mode opens it: the state is then empty (applied
	// index 0) and must be rebuilt from the durable copy.
	NoSync bool
}

// DirtySuffix names the marker file (path + DirtySuffix) that says the state
// database was written without fsync and not closed cleanly.
const DirtySuffix = ".dirty"

// Open opens or creates the state database at path, committing every batch
// with fsync. It refuses a file that is corrupt or was not written by
// policyd, naming the file, and never writes to such a file.
func Open(path string, logger *slog.Logger) (*Store, error) {
	return OpenWithOptions(path, logger, Options{})
}

// OpenWithOptions is Open with options. If it discarded a dirty file (see
// Options.NoSync and Discarded), the caller owes the store its whole
// history.
func OpenWithOptions(path string, logger *slog.Logger, opts Options) (*Store, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir for %q: %w", path, err)
	}
	discarded, err := discardDirty(path)
	if err != nil {
		return nil, err
	}
	if discarded {
		logger.Warn("state db was written without fsync and not closed cleanly: discarded; the state is rebuilt from the raft snapshot and log",
			"path", path)
	}
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		// Inspect read-only first: bbolt writes to a file it opens read-write.
		if err := checkFile(path); err != nil {
			return nil, err
		}
	}
	if opts.NoSync {
		if err := markDirty(path); err != nil {
			return nil, err
		}
	}
	db, err := openBolt(path, false, opts.NoSync)
	if err != nil {
		return nil, err
	}
	if err := db.Update(initBuckets); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("initialise state db %q: %w", path, err)
	}
	if err := rebuildHeads(db, path, logger); err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &Store{
		path:      path,
		logger:    logger,
		db:        db,
		noSync:    opts.NoSync,
		discarded: discarded,
		waitCh:    make(chan struct{}),
		subs:      make(map[*Subscription]struct{}),
	}
	idx, err := s.readApplied()
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s.applied.Store(idx)
	return s, nil
}

// Discarded reports whether Open found the file dirty and started empty.
func (s *Store) Discarded() bool { return s.discarded }

// discardDirty removes path if its dirty marker exists, then the marker.
func discardDirty(path string) (bool, error) {
	marker := path + DirtySuffix
	if _, err := os.Stat(marker); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("state db %q: %w", path, err)
	}
	for _, p := range []string{path, path + ".restore", marker} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("discard unclean state db: %w", err)
		}
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return false, fmt.Errorf("discard unclean state db: %w", err)
	}
	return true, nil
}

// markDirty creates path's dirty marker, durably, before the first write
// without fsync.
func markDirty(path string) error {
	marker := path + DirtySuffix
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("mark state db dirty: %w", err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("mark state db dirty: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("mark state db dirty: %w", err)
	}
	return nil
}

// openBolt opens path with bbolt. bbolt trusts its file, so checkFile runs
// boltcheck first; a fault or panic it still meets while opening, in this
// goroutine, becomes ErrDamaged instead of ending the process.
func openBolt(path string, readOnly, noSync bool) (_ *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("open state db %q: %w: bbolt: %v (the file was left untouched)", path, ErrDamaged, r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:  2 * time.Second, // another process holds the lock: fail, don't hang
		ReadOnly: readOnly,
		NoSync:   noSync,
		// A snapshot is a long read transaction; a remap while it is open would
		// stall writers, so reserve address space up front.
		InitialMmapSize: 256 << 20,
		FreelistType:    bolt.FreelistMapType,
		NoFreelistSync:  true,
	})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open state db %q: locked by another process", path)
		}
		if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) {
			return nil, fmt.Errorf("open state db %q: %w: %w (the file was left untouched)", path, ErrDamaged, err)
		}
		return nil, fmt.Errorf("open state db %q: %w (the file was left untouched)", path, err)
	}
	return db, nil
}

// checkFile verifies, read-only, that path is a whole bbolt file and a
// policyd state database.
func checkFile(path string) error {
	if err := boltcheck.Check(path); err != nil {
		return fmt.Errorf("open state db %q: %w (the file was left untouched)", path, err)
	}
	db, err := openBolt(path, true, false)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("open state db %q: %w (no meta bucket; the file was left untouched)", path, ErrForeignDB)
		}
		if got := meta.Get(keyMagic); !bytes.Equal(got, []byte(schemaMagic)) {
			return fmt.Errorf("open state db %q: %w (schema %q, want %q; the file was left untouched)", path, ErrForeignDB, got, schemaMagic)
		}
		return nil
	})
}

func initBuckets(tx *bolt.Tx) error {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	if meta.Get(keyMagic) == nil {
		if err := meta.Put(keyMagic, []byte(schemaMagic)); err != nil {
			return err
		}
	}
	for _, b := range dataBuckets {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) readApplied() (uint64, error) {
	var idx uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		idx = getUint(tx.Bucket(bucketMeta), keyAppliedIndex)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("read applied index from %q: %w", s.path, err)
	}
	return idx, nil
}

// Path is the state database file.
func (s *Store) Path() string { return s.path }

// AppliedIndex is the index of the last Raft entry applied to the store.
func (s *Store) AppliedIndex() uint64 { return s.applied.Load() }

// WaitApplied blocks until the applied index reaches idx or ctx ends.
func (s *Store) WaitApplied(ctx context.Context, idx uint64) error {
	for {
		s.waitMu.Lock()
		ch := s.waitCh
		s.waitMu.Unlock()
		if s.applied.Load() >= idx {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for applied index %d (at %d): %w", idx, s.applied.Load(), ctx.Err())
		}
	}
}

func (s *Store) advance(idx uint64) {
	s.applied.Store(idx)
	s.waitMu.Lock()
	close(s.waitCh)
	s.waitCh = make(chan struct{})
	s.waitMu.Unlock()
}

// view runs fn in a read transaction.
func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return s.db.View(fn)
}

// Close closes the database and ends every subscription.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.subMu.Lock()
	for sub := range s.subs {
		sub.close()
	}
	s.subs = map[*Subscription]struct{}{}
	s.subMu.Unlock()
	if s.noSync {
		// Everything written without fsync reaches the disk before the
		// dirty mark goes; if this fails the mark stays and the next Open
		// rebuilds.
		if err := s.db.Sync(); err != nil {
			_ = s.db.Close()
			return fmt.Errorf("close state db %q: fsync: %w", s.path, err)
		}
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state db %q: %w", s.path, err)
	}
	if s.noSync {
		if err := os.Remove(s.path + DirtySuffix); err != nil {
			return fmt.Errorf("close state db %q: clear dirty mark: %w", s.path, err)
		}
		if err := syncDir(filepath.Dir(s.path)); err != nil {
			return fmt.Errorf("close state db %q: %w", s.path, err)
		}
	}
	return nil
}

// Snapshot is a consistent, point-in-time view of the whole database, for
// Raft snapshots. Writers keep going while it is open.
type Snapshot struct {
	tx      *bolt.Tx
	release sync.Once
	unlock  func()
}

// Snapshot opens a read transaction over the whole database. The caller must
// call Release.
func (s *Store) Snapshot() (*Snapshot, error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	tx, err := s.db.Begin(false)
	if err != nil {
		s.mu.RUnlock()
		return nil, fmt.Errorf("begin snapshot of %q: %w", s.path, err)
	}
	return &Snapshot{tx: tx, unlock: s.mu.RUnlock}, nil
}

// Index is the applied index the snapshot contains.
func (sn *Snapshot) Index() uint64 { return getUint(sn.tx.Bucket(bucketMeta), keyAppliedIndex) }

// WriteTo streams the database file as of the snapshot.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) { return sn.tx.WriteTo(w) }

// Release ends the snapshot's transaction. Safe to call more than once.
func (sn *Snapshot) Release() {
	sn.release.Do(func() {
		_ = sn.tx.Rollback()
		sn.unlock()
	})
}

// Restore replaces the whole state with the database read from r (a
// Snapshot's WriteTo output). The new file is written beside the old one,
// fsynced, checked, and renamed over it, so a crash leaves either the old or
// the new state, never a mix. Subscribers receive a Resync change.
func (s *Store) Restore(r io.Reader) error {
	tmp := s.path + ".restore"
	if err := writeFileSync(tmp, r); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := checkFile(tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("restore: received snapshot is not a state db: %w", err)
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = os.Remove(tmp)
		return ErrClosed
	}
	if err := s.db.Close(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("restore: close %q: %w", s.path, err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("restore: rename %q over %q: %w", tmp, s.path, err)
	}
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("restore: %w", err)
	}
	db, err := openBolt(s.path, false, s.noSync)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("restore: reopen: %w", err)
	}
	s.db = db
	if err := rebuildHeads(db, s.path, s.logger); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("restore: %w", err)
	}
	idx, err := s.readApplied()
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	// The cached digest is keyed by applied index, and the restored state
	// may be at the same index with other content.
	s.digestMu.Lock()
	s.digest, s.digestIndex = "", 0
	s.digestMu.Unlock()
	s.logger.Info("state restored from snapshot", "applied_index", idx)
	s.advance(idx)
	s.publish(Change{Index: idx, Resync: true, At: time.Now()})
	return nil
}

// StartHistory moves a restored state to index, above its applied index,
// and marks every event up to index as pruned. A restore starts a new
// history at the backup's index, while clients may hold indexes of the lost
// one past it: a feed sidecar's ?since=, a reader of GET /v1/events. Were
// the new history numbered right after the backup, those indexes would
// come round again for other entries, and such a client would be replayed
// the new history on top of a state the new history never had (a policy
// the old cluster created after the backup would stay in force there).
// Starting far above them, with the events marked as pruned, makes every
// index of the lost history read as "too old": the client starts over
// from a full state. Like etcdutl snapshot restore --bump-revision
// --mark-compacted. Only for a store no node serves (restore is offline).
func (s *Store) StartHistory(index uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if applied := getUint(meta, keyAppliedIndex); index <= applied {
			return fmt.Errorf("start history at %d: the state is at %d already", index, applied)
		}
		if err := putUint(meta, keyAppliedIndex, index); err != nil {
			return err
		}
		if err := putUint(meta, keyHeadsIndex, index); err != nil {
			return err
		}
		return putUint(meta, keyPrunedThrough, index)
	})
	if err != nil {
		return fmt.Errorf("start history in %q: %w", s.path, err)
	}
	s.digestMu.Lock()
	s.digest, s.digestIndex = "", 0
	s.digestMu.Unlock()
	s.advance(index)
	return nil
}

func writeFileSync(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("restore: create %q: %w", path, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		_ = f.Close()
		return fmt.Errorf("restore: write %q: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("restore: fsync %q: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("restore: close %q: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %q: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %q: %w", dir, err)
	}
	return nil
}

func putUint(b *bolt.Bucket, key []byte, v uint64) error {
	return b.Put(key, u64(v))
}

func getUint(b *bolt.Bucket, key []byte) uint64 {
	v := b.Get(key)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func u64(v uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], v)
	return k[:]
}

// rebuildHeads brings db's policy heads up to its applied index.
func rebuildHeads(db *bolt.DB, path string, logger *slog.Logger) error {
	var rebuilt bool
	err := db.Update(func(tx *bolt.Tx) (err error) {
		rebuilt, err = syncHeads(tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("state db %q: %w", path, err)
	}
	if rebuilt {
		logger.Info("rebuilt the policy heads of a state db written before them", "path", path)
	}
	return nil
}

// decodePolicy decodes a stored policy and returns it with its own copy of
// the stored bytes, which its spec shares. v may be bbolt's memory, valid
// only inside its transaction; neither result aliases it.
func decodePolicy(k, v []byte) (*policy.Policy, []byte, error) {
	owned := bytes.Clone(v)
	p, err := policy.DecodeStored(owned)
	if err != nil {
		return nil, nil, fmt.Errorf("decode stored policy %q: %w", k, err)
	}
	return p, owned, nil
}

// getJSON decodes the value at key in bucket into v; found reports presence.
func getJSON(b *bolt.Bucket, key string, v any) (found bool, err error) {
	raw := b.Get([]byte(key))
	if raw == nil {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return true, fmt.Errorf("decode stored %q: %w", key, err)
	}
	return true, nil
}
