package raftnode

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/policyd/policyd/internal/third_party/raft"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/server/raftlog"
	"github.com/policyd/policyd/internal/store"
)

// The offline operations (policyd recover, policyd snapshot restore) work
// on a stopped node's data directory. They touch Raft's files directly, the
// way `consul operator` and `etcdutl` do, because the node that would own
// them is not running; the running node never does this.

// lockWaitTime is how long the offline operations wait for a bbolt file's
// lock before deciding that a running node holds it.
const lockWaitTime = 2 * time.Second

// RestoreIndexGap is how far above the backup's index a restored cluster
// starts its history (store.StartHistory): more entries than a cluster
// could have committed after its backup was taken (at 10,000 writes a
// second, five days' worth), and small enough to leave room in a uint64
// for billions of restores.
const RestoreIndexGap = 1 << 32

func raftConfiguration(peers []config.Peer) raft.Configuration {
	var c raft.Configuration
	for _, p := range peers {
		c.Servers = append(c.Servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address), Suffrage: raft.Voter})
	}
	return c
}

// checkOffline refuses a data directory that belongs to another node or is
// in use: a running node holds exclusive locks on state.db and its log.
func checkOffline(cfg config.Config) error {
	l := raftlog.Layout{Dir: cfg.DataDir}
	raw, err := os.ReadFile(l.NodeIDPath())
	switch {
	case err == nil:
		if got := strings.TrimSpace(string(raw)); got != cfg.NodeID {
			return fmt.Errorf("data_dir %s belongs to node %q, not node_id %q", cfg.DataDir, got, cfg.NodeID)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("read node id: %w", err)
	}
	for _, p := range l.LockFiles() {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		db, err := bolt.Open(p, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockWaitTime})
		if errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("%s is locked by a running process: stop the node first", p)
		}
		if err == nil {
			_ = db.Close()
		}
		// Any other error (a damaged file) is for the caller to find or
		// replace; it does not mean the node is running.
	}
	return nil
}

// offlineRaft is a stopped node's Raft storage, opened for the offline
// operations.
type offlineRaft struct {
	logs  raftlog.Store
	snaps *raft.FileSnapshotStore
	trans raft.Transport
}

func openOfflineRaft(cfg config.Config, logOut io.Writer) (*offlineRaft, error) {
	dir := raftlog.Layout{Dir: cfg.DataDir}.RaftDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create raft dir %q: %w", dir, err)
	}
	snaps, err := raft.NewFileSnapshotStore(dir, cfg.Raft.SnapshotRetain, logOut)
	if err != nil {
		return nil, fmt.Errorf("open raft snapshots in %q: %w", dir, err)
	}
	logs, _, err := raftlog.Open(dir, cfg.Raft.LogStore, hclog.New(&hclog.LoggerOptions{Name: "raft", Output: logOut, Level: hclog.Warn}))
	if err != nil {
		return nil, err
	}
	// RecoverCluster and snapshot creation only use the transport to encode
	// peer addresses for old snapshot formats; nothing is sent.
	_, trans := raft.NewInmemTransport("")
	return &offlineRaft{logs: logs, snaps: snaps, trans: trans}, nil
}

func (o *offlineRaft) Close() error {
	if err := o.logs.Close(); err != nil {
		return fmt.Errorf("close raft log: %w", err)
	}
	return nil
}

func warnLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// Recovered is the state of a node after Recover.
type Recovered struct {
	Before, Applied uint64 // the state's applied index before and after
	Digest          string
}

// Recover runs raft.RecoverCluster on a stopped node: it brings the state
// up to the end of the node's log and writes a snapshot whose configuration
// is servers, so that the node starts as a member of that cluster. Raft's
// and the store's warnings go to logOut.
func Recover(cfg config.Config, servers []config.Peer, logOut io.Writer) (_ Recovered, err error) {
	if err := checkOffline(cfg); err != nil {
		return Recovered{}, err
	}
	l := raftlog.Layout{Dir: cfg.DataDir}
	// Opening the stores would create empty ones; a wrong --data-dir should
	// leave no trace.
	if _, err := os.Stat(l.StatePath()); err != nil {
		return Recovered{}, fmt.Errorf("nothing to recover in data_dir %s: %w (is --config or --data-dir right?)", cfg.DataDir, err)
	}
	if kind, err := raftlog.Existing(l.RaftDir()); err != nil {
		return Recovered{}, fmt.Errorf("nothing to recover in data_dir %s: %w", cfg.DataDir, err)
	} else if kind == "" {
		return Recovered{}, fmt.Errorf("nothing to recover in data_dir %s: no raft log (is --config or --data-dir right?)", cfg.DataDir)
	}
	st, err := store.Open(l.StatePath(), warnLogger(logOut))
	if err != nil {
		return Recovered{}, err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	r, err := openOfflineRaft(cfg, logOut)
	if err != nil {
		return Recovered{}, err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	before := st.AppliedIndex()

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(cfg.NodeID)
	conf.LogOutput = logOut
	conf.LogLevel = "warn"
	fsm := recoveryFSM{raftfsm.New(st, warnLogger(logOut))}
	if err := raft.RecoverCluster(conf, fsm, r.logs, r.logs, r.snaps, r.trans, raftConfiguration(servers)); err != nil {
		return Recovered{}, fmt.Errorf("recover %s: %w", cfg.DataDir, err)
	}
	digest, idx, err := st.Digest()
	if err != nil {
		return Recovered{}, err
	}
	return Recovered{Before: before, Applied: idx, Digest: digest}, nil
}

// recoveryFSM releases each snapshot once it is persisted: RecoverCluster
// never calls Release, and an open store snapshot holds a read transaction
// that would block closing the store.
type recoveryFSM struct{ *raftfsm.FSM }

func (f recoveryFSM) Snapshot() (raft.FSMSnapshot, error) {
	s, err := f.FSM.Snapshot()
	if err != nil {
		return nil, err
	}
	return releasingSnapshot{s}, nil
}

type releasingSnapshot struct{ raft.FSMSnapshot }

func (s releasingSnapshot) Persist(sink raft.SnapshotSink) error {
	defer s.Release()
	return s.FSMSnapshot.Persist(sink)
}

// Restored is the state of a node after Restore.
type Restored struct {
	BackupIndex uint64 // the backup's applied index
	Applied     uint64 // the new history's first index
	Digest      string
	MovedTo     string // where the previous state went, "" if there was none
}

// Restore makes a stopped node's data directory the start of a new
// cluster. It writes file as state.db, moves it RestoreIndexGap entries
// ahead (a new history, see store.StartHistory), and writes beside it a Raft
// snapshot at that index whose configuration is servers. Raft then starts
// from that snapshot (no bootstrap) and numbers new entries after it: the
// state's applied index and the Raft log stay in step, so no new entry is
// mistaken for one already applied. Existing state is refused unless
// force, which moves it aside.
func Restore(cfg config.Config, file string, servers []config.Peer, force bool, logOut io.Writer) (_ Restored, err error) {
	info, err := store.Inspect(file)
	if err != nil {
		return Restored{}, fmt.Errorf("restore from %s: %w", file, err)
	}
	if info.AppliedIndex == 0 {
		return Restored{}, fmt.Errorf("restore from %s: the snapshot holds no applied entries", file)
	}
	if err := checkOffline(cfg); err != nil {
		return Restored{}, err
	}
	// Opened before the state is moved aside: file may be the node's own
	// state.db, the way out for a node alone whose Raft log is damaged.
	src, err := os.Open(file)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	defer src.Close()
	l := raftlog.Layout{Dir: cfg.DataDir}
	moved, err := moveStateAside(l, force)
	if err != nil {
		return Restored{}, err
	}
	st, err := store.Open(l.StatePath(), warnLogger(logOut))
	if err != nil {
		return Restored{}, err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	if err := st.Restore(src); err != nil {
		return Restored{}, err
	}
	digest, idx, err := st.Digest()
	if err != nil {
		return Restored{}, err
	}
	if digest != info.Digest || idx != info.AppliedIndex {
		return Restored{}, fmt.Errorf("restored state is at %d (digest %s), the file at %d (digest %s)", idx, digest, info.AppliedIndex, info.Digest)
	}
	// Every server restores the same file, so every one starts the new
	// history at the same index and with the same digest.
	if err := st.StartHistory(idx + RestoreIndexGap); err != nil {
		return Restored{}, err
	}
	if digest, idx, err = st.Digest(); err != nil {
		return Restored{}, err
	}

	r, err := openOfflineRaft(cfg, logOut)
	if err != nil {
		return Restored{}, err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	// Term 1, as a freshly bootstrapped cluster's first entries; the
	// configuration counts as committed at the snapshot's index.
	sink, err := r.snaps.Create(raft.SnapshotVersionMax, idx, 1, raftConfiguration(servers), idx, r.trans)
	if err != nil {
		return Restored{}, fmt.Errorf("create raft snapshot: %w", err)
	}
	sn, err := st.Snapshot()
	if err != nil {
		_ = sink.Cancel()
		return Restored{}, err
	}
	_, err = sn.WriteTo(sink)
	sn.Release()
	if err != nil {
		_ = sink.Cancel()
		return Restored{}, fmt.Errorf("write raft snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return Restored{}, fmt.Errorf("finish raft snapshot: %w", err)
	}
	return Restored{BackupIndex: info.AppliedIndex, Applied: idx, Digest: digest, MovedTo: moved}, nil
}

// moveStateAside moves state.db and raft/ into a fresh pre-restore-<time>
// directory, if either exists. Without force, existing state is an error.
func moveStateAside(l raftlog.Layout, force bool) (string, error) {
	var present []string
	for _, p := range []string{l.StatePath(), l.RaftDir()} {
		if _, err := os.Stat(p); err == nil {
			present = append(present, filepath.Base(p))
		}
	}
	if len(present) == 0 {
		return "", os.MkdirAll(l.Dir, 0o700)
	}
	if !force {
		return "", fmt.Errorf("data_dir %s already holds state (%v): pass --force to move it aside, or use an empty directory", l.Dir, present)
	}
	aside := filepath.Join(l.Dir, "pre-restore-"+time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err := os.Mkdir(aside, 0o700); err != nil {
		return "", fmt.Errorf("move state aside: %w", err)
	}
	for _, name := range present {
		if err := os.Rename(filepath.Join(l.Dir, name), filepath.Join(aside, name)); err != nil {
			return "", fmt.Errorf("move %s aside: %w", name, err)
		}
	}
	return aside, nil
}
