package raftnode

import (
	"errors"
	"fmt"
	"os"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/server/raftlog"
	"github.com/policyd/policyd/internal/store"
)

// The data directory's files and what a damaged or failed one means are
// raftlog's; what follows needs the node: its id and addresses for the
// recovery of a damaged log, and its store.

// Faulted is closed when a write to the data directory has failed and the
// node must end; Fault says which. Such a node cannot be closed (the
// goroutine whose write failed holds Raft): the process exits.
func (n *Node) Faulted() <-chan struct{} { return n.faults.Done() }

// Fault is the write that ended the node, or nil.
func (n *Node) Fault() error {
	if de := n.faults.Fault(); de != nil {
		return de
	}
	return nil
}

// logDamaged is a Raft log that raftlog.Open refused as damaged. The log
// holds this node's votes and entries it may have acknowledged to a
// leader, so it cannot be rebuilt in place: the node leaves the cluster and
// joins again empty (the order etcd documents for a member that lost its
// disk), or, alone, becomes a new cluster from its state.db.
func (n *Node) logDamaged(path string, err error) error {
	return &raftlog.DataError{Path: path, Err: err, Recovery: fmt.Sprintf(
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
	ls, kind, err := raftlog.Open(raftDir, n.cfg.Raft.LogStore, NewHCLog(n.logger, "raft"))
	switch {
	case err == nil:
	case errors.Is(err, raftlog.ErrDamaged):
		return n.logDamaged(raftlog.Path(raftDir, raftlog.ExistingKind(raftDir, n.cfg.Raft.LogStore)), err)
	case raftlog.IsNoSpace(err):
		return raftlog.NoSpace(n.cfg.DataDir, raftDir, raftlog.ExistingKind(raftDir, n.cfg.Raft.LogStore), err)
	default:
		return err
	}
	n.logger.Info("raft log store", "kind", kind)
	n.logStore = raftlog.Watch(ls, raftDir, kind, n.faults)
	statePath := n.layout.StatePath()
	if n.store, err = store.OpenWithOptions(statePath, n.logger.With("component", "store"),
		store.Options{NoSync: !n.cfg.Raft.StateFsync}); err != nil {
		if errors.Is(err, store.ErrDamaged) {
			return raftlog.StateDamaged(statePath, err)
		}
		return err
	}
	return n.checkLogCoversState(raftDir, kind)
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
		return n.logDamaged(raftlog.Path(raftDir, kind), fmt.Errorf(
			"%w: the log and snapshots end at index %d, but state.db has applied entries up to %d: the end of the log is lost",
			raftlog.ErrDamaged, last, applied))
	}
	return nil
}

// storeFault is the FSM's handler for a batch or snapshot that state.db
// could not take (raftfsm.FSM.SetStoreFault).
func (n *Node) storeFault(err error) error {
	return n.faults.Check(n.store.Path(), err)
}

// Parked reports whether a failed write holds Raft until the process exits.
func (n *Node) Parked() bool { return n.faults.Parked() }
