package main

import (
	"bytes"
	"encoding/json"
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
	"github.com/hashicorp/raft"
	"github.com/spf13/cobra"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/config"
	"github.com/policyd/policyd/raftfsm"
	"github.com/policyd/policyd/server"
	"github.com/policyd/policyd/store"
)

// The offline commands (recover, snapshot restore) work on a stopped node's
// data directory, laid out as server.New lays it out. They touch Raft's files
// directly, the way `consul operator` and `etcdutl` do, because the node that
// would own them is not running; the running daemon never does this.
const (
	stateFile    = "state.db"
	raftDirName  = "raft"
	nodeIDFile   = "node-id"
	lockWaitTime = 2 * time.Second
)

func recoverCommand() *cobra.Command {
	var peersFile string
	cmd := &cobra.Command{
		Use:   "recover --peers-file FILE",
		Short: "Recover a stopped node from the loss of quorum by rewriting its Raft configuration (offline)",
		Long: `recover rewrites the Raft configuration of a STOPPED node to the servers listed
in --peers-file, using hashicorp/raft's RecoverCluster, so that a cluster that
lost its quorum for good can elect a leader again. Run it on every surviving
node with the same peers file, then start them.

The peers file is a JSON array naming every server of the recovered cluster,
this node included:

  [
    {"id": "node1", "address": "10.0.0.1:7000"}
  ]

The node's data directory and ID come from the same config file and flags as
serve (--config, --data-dir, --node-id). Every entry in this node's Raft log is
applied, including entries the old cluster may never have committed: they are
committed by the recovery. See docs/operations.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if peersFile == "" {
				return &usageError{errors.New("recover needs --peers-file FILE (a JSON array of {\"id\", \"address\"})")}
			}
			cfg, err := config.Load("", os.Environ(), cmd.Flags())
			if err != nil {
				return err
			}
			servers, err := readPeersFile(peersFile, cfg)
			if err != nil {
				return err
			}
			return recoverNode(cfg, servers, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	config.RegisterFlags(cmd.Flags())
	cmd.Flags().StringVar(&peersFile, "peers-file", "", "JSON array of the recovered cluster's servers: [{\"id\": ..., \"address\": \"host:port\"}]")
	return cmd
}

// peerEntry is one server in a peers file.
type peerEntry struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// readPeersFile reads a peers file and checks it with the rules raft.peers
// follows in the config file (valid IDs, dialable distinct addresses, this
// node among them).
func readPeersFile(path string, cfg config.Config) ([]config.Peer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read peers file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var entries []peerEntry
	if err := dec.Decode(&entries); err != nil {
		return nil, fmt.Errorf("peers file %s: want a JSON array of {\"id\", \"address\"}: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("peers file %s: data after the JSON array", path)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("peers file %s: no servers; list at least this node", path)
	}
	peers := make([]config.Peer, len(entries))
	for i, e := range entries {
		peers[i] = config.Peer{ID: e.ID, Address: e.Address}
	}
	if err := checkPeers(cfg, peers); err != nil {
		return nil, fmt.Errorf("peers file %s: %w", path, err)
	}
	return peers, nil
}

// checkPeers validates a new cluster configuration with config's raft.peers
// rules, as if this node bootstrapped from it.
func checkPeers(cfg config.Config, peers []config.Peer) error {
	if cfg.NodeID == "" {
		return &usageError{errors.New("node_id is required (--node-id or the config file): the new configuration must name this node")}
	}
	probe := cfg
	probe.Raft.Peers = peers
	probe.Raft.Bootstrap = true
	if err := probe.Validate(); err != nil {
		return fmt.Errorf("checked as raft.peers: %w", err)
	}
	return nil
}

func raftConfiguration(peers []config.Peer) raft.Configuration {
	var c raft.Configuration
	for _, p := range peers {
		c.Servers = append(c.Servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address), Suffrage: raft.Voter})
	}
	return c
}

// checkOffline refuses a data directory that belongs to another node or is in
// use: a running node holds exclusive locks on state.db and raft.db.
func checkOffline(cfg config.Config) error {
	raw, err := os.ReadFile(filepath.Join(cfg.DataDir, nodeIDFile))
	switch {
	case err == nil:
		if got := strings.TrimSpace(string(raw)); got != cfg.NodeID {
			return fmt.Errorf("data_dir %s belongs to node %q, not node_id %q", cfg.DataDir, got, cfg.NodeID)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("read node id: %w", err)
	}
	for _, p := range append([]string{filepath.Join(cfg.DataDir, stateFile)}, server.LogStoreLockFiles(filepath.Join(cfg.DataDir, raftDirName))...) {
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
// commands.
type offlineRaft struct {
	logs  server.LogStore
	snaps *raft.FileSnapshotStore
	trans raft.Transport
}

func openOfflineRaft(cfg config.Config, logOut io.Writer) (*offlineRaft, error) {
	dir := filepath.Join(cfg.DataDir, raftDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create raft dir %q: %w", dir, err)
	}
	snaps, err := raft.NewFileSnapshotStore(dir, cfg.Raft.SnapshotRetain, logOut)
	if err != nil {
		return nil, fmt.Errorf("open raft snapshots in %q: %w", dir, err)
	}
	logs, _, err := server.OpenLogStore(dir, cfg.Raft.LogStore, hclog.New(&hclog.LoggerOptions{Name: "raft", Output: logOut, Level: hclog.Warn}))
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

// recoverNode runs raft.RecoverCluster on a stopped node: it brings the
// state up to the end of the node's log and writes a snapshot whose
// configuration is servers, so that the node starts as a member of that
// cluster.
func recoverNode(cfg config.Config, servers []config.Peer, out, logOut io.Writer) (err error) {
	if err := checkOffline(cfg); err != nil {
		return err
	}
	// Opening the stores would create empty ones; a wrong --data-dir should
	// leave no trace.
	if _, err := os.Stat(filepath.Join(cfg.DataDir, stateFile)); err != nil {
		return fmt.Errorf("nothing to recover in data_dir %s: %w (is --config or --data-dir right?)", cfg.DataDir, err)
	}
	if kind, err := server.ExistingLogStore(filepath.Join(cfg.DataDir, raftDirName)); err != nil {
		return fmt.Errorf("nothing to recover in data_dir %s: %w", cfg.DataDir, err)
	} else if kind == "" {
		return fmt.Errorf("nothing to recover in data_dir %s: no raft log (is --config or --data-dir right?)", cfg.DataDir)
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, stateFile), slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	r, err := openOfflineRaft(cfg, logOut)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	before := st.AppliedIndex()

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(cfg.NodeID)
	conf.LogOutput = logOut
	conf.LogLevel = "warn"
	fsm := recoveryFSM{raftfsm.New(st, slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn})))}
	if err := raft.RecoverCluster(conf, fsm, r.logs, r.logs, r.snaps, r.trans, raftConfiguration(servers)); err != nil {
		return fmt.Errorf("recover %s: %w", cfg.DataDir, err)
	}
	digest, idx, err := st.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "recovered node %s: state at applied index %d (was %d), digest %s\nnew configuration: %s\nstart the node; it elects a leader once a majority of these servers run\n",
		cfg.NodeID, idx, before, digest, formatServers(servers))
	return nil
}

func formatServers(servers []config.Peer) string {
	ids := make([]string, len(servers))
	for i, s := range servers {
		ids[i] = s.ID + "=" + s.Address
	}
	return strings.Join(ids, ", ")
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
