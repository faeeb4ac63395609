package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

	"github.com/policyd/policyd/internal/store"
)

// DataError is a file in the data directory that the node cannot go on
// with: found damaged when the node starts, or a write to it that failed
// (a full disk). Its message is one line naming the file, what is wrong and
// what the operator does next; `policyd serve` logs it as its last line and
// exits non-zero.
type DataError struct {
	Path     string // the file or directory
	Err      error  // what is wrong with it
	Recovery string // what to do about it
	Write    bool   // a write failed (else: found damaged at start)
}

func (e *DataError) Error() string {
	msg := e.Err.Error()
	if !strings.Contains(msg, e.Path) {
		msg = e.Path + ": " + msg
	}
	return msg + "; to recover: " + e.Recovery
}

func (e *DataError) Unwrap() error { return e.Err }

// faults ends the node at the first write to its Raft log, stable store or
// state.db that fails. Raft cannot be told about such a write: the leader
// panics when it fails to store entries it has already sent
// (third_party/raft change 1), on a failed term write, and when a snapshot
// it received does not restore; the FSM panicked when a batch did not
// commit. So once armed, the goroutine whose write failed never returns:
// nothing after the failed write is acknowledged, Faulted is closed, and the
// process exits (`policyd serve` waits on Faulted). Before the node is
// armed, which Setup does once Raft is set up, the error is returned as a
// DataError, so that a write failing while the node starts fails Setup.
type faults struct {
	dataDir string
	// park is what a failed write waits on; nil (for ever) but in tests.
	park <-chan struct{}

	mu     sync.Mutex
	armed  bool
	err    *DataError
	done   chan struct{}
	waiter bool // a failed write is parked
}

func newFaults(dataDir string) *faults {
	return &faults{dataDir: dataDir, done: make(chan struct{})}
}

// check handles the result of a write to path.
func (f *faults) check(path string, err error) error {
	if err == nil {
		return nil
	}
	de := &DataError{Path: path, Err: err, Recovery: writeRecovery(f.dataDir, err), Write: true}
	f.mu.Lock()
	if f.err == nil {
		f.err = de
	}
	armed := f.armed
	f.waiter = f.waiter || armed
	f.signalLocked()
	f.mu.Unlock()
	if !armed {
		return de
	}
	<-f.park
	return de
}

// arm makes failed writes end the node from now on; a write that failed
// before and did not fail New ends it now.
func (f *faults) arm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = true
	f.signalLocked()
}

func (f *faults) signalLocked() {
	if f.armed && f.err != nil {
		select {
		case <-f.done:
		default:
			close(f.done)
		}
	}
}

// parked reports whether a failed write is waiting for the process to
// exit.
func (f *faults) parked() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiter
}

// fault is the first failed write, or nil.
func (f *faults) fault() *DataError {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// explain returns the failed write behind err, a failure of Setup, if a
// write failed: Raft reports a snapshot that could not be restored only as
// "failed to load any existing snapshots".
func (f *faults) explain(err error) error {
	if de := f.fault(); de != nil && !errors.As(err, new(*DataError)) {
		return de
	}
	return err
}

// Faulted is closed when a write to the data directory has failed and the
// node must end; Fault says which. Such a node cannot be closed (the
// goroutine whose write failed holds Raft): the process exits.
func (n *Node) Faulted() <-chan struct{} { return n.faults.done }

// Fault is the write that ended the node, or nil.
func (n *Node) Fault() error {
	if de := n.faults.fault(); de != nil {
		return de
	}
	return nil
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// writeRecovery says what to do after a failed write.
func writeRecovery(dataDir string, err error) string {
	if isNoSpace(err) {
		return fmt.Sprintf("free space on the disk of %s, or move that directory to a larger disk, and start the node again; "+
			"the write that failed was not acknowledged, and the node reads its log back and catches up", dataDir)
	}
	return fmt.Sprintf("check the disk of %s (the kernel log names I/O errors) and start the node again once it is healthy; "+
		"the write that failed was not acknowledged; if the node then finds a file damaged, its message says what to do", dataDir)
}

// logNoSpace is a Raft log that could not be opened for want of space.
// raft-wal preallocates each segment whole, so a fresh node on a small
// disk fails before it writes anything; the message names the segment, the
// size it needs and the space free.
func (n *Node) logNoSpace(raftDir, kind string, err error) error {
	path := logStorePath(raftDir, kind)
	if kind == LogStoreWAL {
		if segs, _ := filepath.Glob(filepath.Join(path, "*.wal")); len(segs) > 0 {
			path = segs[len(segs)-1] // the names sort by first index
		}
		const mib = 1 << 20
		need := fmt.Sprintf("raft-wal preallocates %d MiB for each log segment", wal.DefaultSegmentSize/mib)
		if free, ok := diskFree(raftDir); ok {
			need += fmt.Sprintf(", and the disk has %d MiB free", free/mib)
		}
		err = fmt.Errorf("%s: %w", need, err)
	}
	return &DataError{Path: path, Err: err, Write: true, Recovery: fmt.Sprintf(
		"free space on the disk of %[1]s, or move that directory to a larger disk, and start the node again; "+
			"on a new data directory, raft.log_store: boltdb needs no preallocated segment (remove %[2]s first)",
		n.cfg.DataDir, raftDir)}
}

// stateDamaged is a state.db that store.Open refused as damaged. state.db
// is the Raft log applied in order, so the node rebuilds it: the next start
// finds no state.db, restores the latest Raft snapshot and replays the log
// after it (setupRaft).
func stateDamaged(path string, err error) error {
	return &DataError{Path: path, Err: err,
		Recovery: fmt.Sprintf("move the file aside (mv %s %s.damaged) and start the node again: "+
			"it rebuilds state.db from its Raft snapshot and log", path, path)}
}

// logDamaged is a Raft log that OpenLogStore refused as damaged. The log
// holds this node's votes and entries it may have acknowledged to a
// leader, so it cannot be rebuilt in place: the node leaves the cluster and
// joins again empty (the order etcd documents for a member that lost its
// disk), or, alone, becomes a new cluster from its state.db.
func (n *Node) logDamaged(path string, err error) error {
	return &DataError{Path: path, Err: err, Recovery: fmt.Sprintf(
		"in a cluster that keeps a quorum without this node, remove it (policyd cluster remove %[1]s, against a healthy node), "+
			"move %[2]s aside, start it again with an empty data directory and raft.bootstrap false, and join it "+
			"(policyd cluster join --id %[1]s --raft-addr %[3]s); a node alone: policyd snapshot restore --force %[4]s --node-id %[1]s "+
			"with its other serve flags (a new cluster from what state.db holds; the old files are kept in %[2]s/pre-restore-*)",
		n.id, n.cfg.DataDir, n.cfg.RaftAdvertise(), n.layout.StatePath())}
}

// openDataFiles opens the Raft log, then state.db, refusing either if
// damaged. The log goes first: a state.db left dirty by a crash is
// discarded when it opens, and is the only other copy of the state if the
// log turns out to be damaged.
func (n *Node) openDataFiles() error {
	raftDir := n.layout.RaftDir()
	if err := os.MkdirAll(raftDir, 0o700); err != nil {
		return fmt.Errorf("create raft dir %q: %w", raftDir, err)
	}
	ls, kind, err := OpenLogStore(raftDir, n.cfg.Raft.LogStore, NewHCLog(n.logger, "raft"))
	switch {
	case err == nil:
	case errors.Is(err, ErrLogDamaged):
		return n.logDamaged(logStorePath(raftDir, existingKind(raftDir, n.cfg.Raft.LogStore)), err)
	case isNoSpace(err):
		return n.logNoSpace(raftDir, existingKind(raftDir, n.cfg.Raft.LogStore), err)
	default:
		return err
	}
	n.logger.Info("raft log store", "kind", kind)
	n.logStore = watchLogStore(ls, raftDir, kind, n.faults)
	statePath := n.layout.StatePath()
	if n.store, err = store.OpenWithOptions(statePath, n.logger.With("component", "store"),
		store.Options{NoSync: !n.cfg.Raft.StateFsync}); err != nil {
		if errors.Is(err, store.ErrDamaged) {
			return stateDamaged(statePath, err)
		}
		return err
	}
	return n.checkLogCoversState(raftDir, kind)
}

func existingKind(raftDir, configured string) string {
	if kind, err := ExistingLogStore(raftDir); err == nil && kind != "" {
		return kind
	}
	return configured
}

// checkLogCoversState refuses a log that ends before the state: every
// entry state.db has applied was in the log or a snapshot first, so a log
// and snapshots that end earlier have lost their end (a truncated raft-wal
// segment reads back as a shorter log). Raft would number new entries from
// there, and the state would skip them as applied.
func (n *Node) checkLogCoversState(raftDir, kind string) error {
	last, err := n.logStore.LastIndex()
	if err != nil {
		return fmt.Errorf("raft log: last index: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, 1, NewHCLog(n.logger, "raft").Named("snapshots"))
	if err != nil {
		return fmt.Errorf("open raft snapshots in %q: %w", raftDir, err)
	}
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("list raft snapshots in %q: %w", raftDir, err)
	}
	if len(metas) > 0 {
		last = max(last, metas[0].Index)
	}
	if applied := n.store.AppliedIndex(); applied > last {
		return n.logDamaged(logStorePath(raftDir, kind), fmt.Errorf(
			"%w: the log and snapshots end at index %d, but state.db has applied entries up to %d: the end of the log is lost",
			ErrLogDamaged, last, applied))
	}
	return nil
}

// storeFault is the FSM's handler for a batch or snapshot that state.db
// could not take (raftfsm.FSM.SetStoreFault).
func (n *Node) storeFault(err error) error {
	return n.faults.check(n.store.Path(), err)
}

// watchedLogStore hands every failed write of the log and stable store to
// faults.
type watchedLogStore struct {
	LogStore
	logPath, stablePath string
	faults              *faults
}

func watchLogStore(ls LogStore, raftDir, kind string, f *faults) *watchedLogStore {
	w := &watchedLogStore{LogStore: ls, logPath: logStorePath(raftDir, kind), faults: f}
	w.stablePath = w.logPath
	if kind == LogStoreWAL {
		w.stablePath = filepath.Join(raftDir, walDir, metadb.FileName)
	}
	return w
}

func (s *watchedLogStore) StoreLog(l *raft.Log) error {
	return s.faults.check(s.logPath, s.LogStore.StoreLog(l))
}

func (s *watchedLogStore) StoreLogs(logs []*raft.Log) error {
	return s.faults.check(s.logPath, s.LogStore.StoreLogs(logs))
}

func (s *watchedLogStore) DeleteRange(lo, hi uint64) error {
	return s.faults.check(s.logPath, s.LogStore.DeleteRange(lo, hi))
}

func (s *watchedLogStore) Set(k, v []byte) error {
	return s.faults.check(s.stablePath, s.LogStore.Set(k, v))
}

func (s *watchedLogStore) SetUint64(k []byte, v uint64) error {
	return s.faults.check(s.stablePath, s.LogStore.SetUint64(k, v))
}

// IsMonotonic passes raft-wal's raft.MonotonicLogStore through.
func (s *watchedLogStore) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// Parked reports whether a failed write holds Raft until the process exits.
func (n *Node) Parked() bool { return n.faults.parked() }
