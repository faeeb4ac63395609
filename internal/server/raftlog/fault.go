package raftlog

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/policyd/policyd/internal/third_party/raft"
)

// DataError is a file in the data directory that the node cannot go on
// with: found damaged at start, or a failed write (a full disk).
type DataError struct {
	Path     string // the file or directory
	Err      error  // what is wrong with it
	Recovery string // what to do about it
	Write    bool   // a write failed (else: found damaged at start)
}

// Error is one line naming the file, what is wrong and what the operator
// does next: `policyd serve` logs it as its last line and exits non-zero.
func (e *DataError) Error() string {
	msg := e.Err.Error()
	if !strings.Contains(msg, e.Path) {
		msg = e.Path + ": " + msg
	}
	return msg + "; to recover: " + e.Recovery
}

func (e *DataError) Unwrap() error { return e.Err }

// Faults ends the node at the first failed write to its Raft log, stable
// store or state.db. Before Arm the failure is returned as a DataError.
type Faults struct {
	// Raft cannot be told about such a write: the leader panics when it
	// fails to store entries it has already sent (internal/third_party/raft change
	// 1), on a failed term write, and when a snapshot it received does not
	// restore; the FSM panicked when a batch did not commit. So once armed,
	// the goroutine whose write failed never returns: nothing after the
	// failed write is acknowledged, Done is closed, and the process exits
	// (`policyd serve` waits on it). Before the node is armed, which
	// raftnode's Setup does once Raft is set up, a write failing while the
	// node starts fails Setup.
	dataDir string
	// park is what a failed write waits on; nil (for ever) but in tests.
	park <-chan struct{}

	mu     sync.Mutex
	armed  bool
	err    *DataError
	done   chan struct{}
	waiter bool // a failed write is parked
}

// NewFaults watches the writes to dataDir's files.
func NewFaults(dataDir string) *Faults {
	return &Faults{dataDir: dataDir, done: make(chan struct{})}
}

// Check handles the result of a write to path: once armed, a failed write
// never returns.
func (f *Faults) Check(path string, err error) error {
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

// Arm makes failed writes end the node from now on; a write that failed
// before and did not fail New ends it now.
func (f *Faults) Arm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = true
	f.signalLocked()
}

func (f *Faults) signalLocked() {
	if f.armed && f.err != nil {
		select {
		case <-f.done:
		default:
			close(f.done)
		}
	}
}

// Done is closed once armed and a write has failed.
func (f *Faults) Done() <-chan struct{} { return f.done }

// Parked reports whether a failed write is waiting for the process to
// exit.
func (f *Faults) Parked() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiter
}

// Fault is the first failed write, or nil.
func (f *Faults) Fault() *DataError {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Explain returns the failed write behind err, a failure of Setup, if a
// write failed: Raft reports a snapshot that could not be restored only as
// "failed to load any existing snapshots".
func (f *Faults) Explain(err error) error {
	if de := f.Fault(); de != nil && !errors.As(err, new(*DataError)) {
		return de
	}
	return err
}

// IsNoSpace reports a write that failed for want of disk space or quota.
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// writeRecovery says what to do after a failed write.
func writeRecovery(dataDir string, err error) string {
	if IsNoSpace(err) {
		return fmt.Sprintf("free space on the disk of %s, or move that directory to a larger disk, and start the node again; "+
			"the write that failed was not acknowledged, and the node reads its log back and catches up", dataDir)
	}
	return fmt.Sprintf("check the disk of %s (the kernel log names I/O errors) and start the node again once it is healthy; "+
		"the write that failed was not acknowledged; if the node then finds a file damaged, its message says what to do", dataDir)
}

// NoSpace is a Raft log in raftDir, under dataDir, that could not be
// opened for want of space.
func NoSpace(dataDir, raftDir, kind string, err error) error {
	// raft-wal preallocates each segment whole, so a fresh node on a small
	// disk fails before it writes anything; the message names the segment,
	// the size it needs and the space free.
	path := Path(raftDir, kind)
	if kind == KindWAL {
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
		dataDir, raftDir)}
}

// StateDamaged is a state.db that store.Open refused as damaged; the node
// rebuilds it from its Raft snapshot and log.
func StateDamaged(path string, err error) error {
	// state.db is the Raft log applied in order: the next start finds no
	// state.db, restores the latest Raft snapshot and replays the log after
	// it (raftnode's setupRaft).
	return &DataError{Path: path, Err: err,
		Recovery: fmt.Sprintf("move the file aside (mv %s %s.damaged) and start the node again: "+
			"it rebuilds state.db from its Raft snapshot and log", path, path)}
}

// ExistingKind is the kind of log raftDir holds, else configured.
func ExistingKind(raftDir, configured string) string {
	if kind, err := Existing(raftDir); err == nil && kind != "" {
		return kind
	}
	return configured
}

// watchedStore hands every failed write of the log and stable store to
// faults.
type watchedStore struct {
	Store
	logPath, stablePath string
	faults              *Faults
}

// Watch hands every failed write of ls, a log of kind in raftDir, to f.
func Watch(ls Store, raftDir, kind string, f *Faults) Store {
	return watch(ls, raftDir, kind, f)
}

func watch(ls Store, raftDir, kind string, f *Faults) *watchedStore {
	w := &watchedStore{Store: ls, logPath: Path(raftDir, kind), faults: f}
	w.stablePath = w.logPath
	if kind == KindWAL {
		w.stablePath = filepath.Join(raftDir, walDir, metadb.FileName)
	}
	return w
}

func (s *watchedStore) StoreLog(l *raft.Log) error {
	return s.faults.Check(s.logPath, s.Store.StoreLog(l))
}

func (s *watchedStore) StoreLogs(logs []*raft.Log) error {
	return s.faults.Check(s.logPath, s.Store.StoreLogs(logs))
}

func (s *watchedStore) DeleteRange(lo, hi uint64) error {
	return s.faults.Check(s.logPath, s.Store.DeleteRange(lo, hi))
}

func (s *watchedStore) Set(k, v []byte) error {
	return s.faults.Check(s.stablePath, s.Store.Set(k, v))
}

func (s *watchedStore) SetUint64(k []byte, v uint64) error {
	return s.faults.Check(s.stablePath, s.Store.SetUint64(k, v))
}

// IsMonotonic passes raft-wal's raft.MonotonicLogStore through.
func (s *watchedStore) IsMonotonic() bool {
	m, ok := s.Store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
