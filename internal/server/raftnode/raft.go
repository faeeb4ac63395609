package raftnode

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/server/peer"
	"github.com/policyd/policyd/internal/server/raftlog"
)

// peerHandshakeTimeout bounds TLS and the peer handshake of one connection.
const peerHandshakeTimeout = 5 * time.Second

// setupRaft builds the transport, log store, snapshot store and raft
// instance, and bootstraps the cluster if configured to and no Raft state
// exists.
func (n *Node) setupRaft() error {
	rc := n.cfg.Raft
	raftDir := n.layout.RaftDir()
	if err := os.MkdirAll(raftDir, 0o700); err != nil {
		return fmt.Errorf("create raft dir %q: %w", raftDir, err)
	}
	hl := NewHCLog(n.logger, "raft")

	// Without an advertise address the transport advertises the bound one
	// (config validation refuses an unspecified bind host without advertise).
	var adv net.Addr
	if a := rc.Advertise; a != "" {
		tcp, err := net.ResolveTCPAddr("tcp", a)
		if err != nil {
			return fmt.Errorf("raft.advertise %q: %w", a, err)
		}
		adv = tcp
	}
	tc := &raft.NetworkTransportConfig{
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  hl.Named("transport"),
		// No pipelined replication. hashicorp/raft v1.7.3's pipeline can
		// deadlock when its decoder stops (a follower answers
		// Success=false, or a newer term) while the sender has one more
		// batch to hand over: the sender waits on the in-flight channel,
		// the response reader on the done channel, and only the sender
		// would close the pipeline. That follower then gets heartbeats but
		// no entries until the leader restarts, and Raft.Shutdown waits
		// forever (the chaos suite hung on it after a leadership transfer;
		// grafana/pyroscope#5518 describes the same stall). Entries are
		// still sent in batches of up to raft.max_append_entries.
		MaxRPCsInFlight: 1,
	}
	n.peerCfg = &peer.Config{
		NodeID: n.id, TrustDomain: n.cfg.Cluster.TrustDomain, Keys: n.deps.Keys, TLS: n.deps.TLS,
		ClusterID: n.ClusterID, HandshakeTimeout: peerHandshakeTimeout, Member: n.mayPeer,
		Mismatch: n.peerMismatch,
	}
	sl, err := NewStreamLayer(rc.Addr, adv, n.deps.Conns, n.peerCfg, n.logger.With("component", "peer"))
	if err != nil {
		return fmt.Errorf("listen raft.addr %s: %w", rc.Addr, err)
	}
	sl.notMember = func() { n.toldNotMember.Store(time.Now().UnixNano()) }
	mux, done := sl.mux, make(chan struct{})
	go func() { defer close(done); mux.Serve() }()
	n.mux, n.muxDone = mux, done
	tc.Stream = sl
	tr := raft.NewNetworkTransportWithConfig(tc)
	n.transport = tr

	ls := n.logStore // opened by openDataFiles, before state.db
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, rc.SnapshotRetain, hl.Named("snapshots"))
	if err != nil {
		return fmt.Errorf("open raft snapshots in %q: %w", raftDir, err)
	}

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(n.id)
	conf.Logger = hl
	conf.HeartbeatTimeout = rc.HeartbeatTimeout
	conf.ElectionTimeout = rc.ElectionTimeout
	conf.LeaderLeaseTimeout = rc.LeaderLeaseTimeout
	conf.CommitTimeout = rc.CommitTimeout
	conf.SnapshotInterval = rc.SnapshotInterval
	conf.SnapshotThreshold = rc.SnapshotThreshold
	conf.TrailingLogs = rc.TrailingLogs
	// Group entries: the leader sends up to MaxAppendEntries per RPC and
	// hands the FSM whole batches (one bbolt transaction each).
	conf.MaxAppendEntries = rc.MaxAppendEntries
	conf.BatchApplyCh = true
	// Per-peer replication metrics only in their labelled form (peer_id,
	// renamed peer by main's bridge): the legacy copies put the peer's ID
	// in the metric name, one metric per peer.
	conf.NoLegacyTelemetry = true
	// The FSM is persistent: it already holds everything up to its applied
	// index, and replayed entries at or below it are skipped. Raft then
	// replays only the entries after its latest snapshot, so if state.db is
	// behind that snapshot (lost, or replaced by an older copy) the gap
	// would never be applied: restore the snapshot first in that case.
	conf.NoSnapshotRestoreOnStart = true
	if metas, err := snaps.List(); err != nil {
		return fmt.Errorf("list raft snapshots in %q: %w", raftDir, err)
	} else if len(metas) > 0 && metas[0].Index > n.store.AppliedIndex() {
		n.logger.Warn("state.db is behind the latest raft snapshot; restoring the snapshot before replaying the log",
			"state_applied_index", n.store.AppliedIndex(), "snapshot_index", metas[0].Index)
		conf.NoSnapshotRestoreOnStart = false
	}
	if err := raft.ValidateConfig(conf); err != nil {
		return fmt.Errorf("raft config: %w", err)
	}

	fsm := raftfsm.New(n.store, n.logger.With("component", "fsm"))
	fsm.SetStoreFault(n.storeFault)
	n.fsm = fsm
	logs := raftlog.NewCache(ls)
	r, err := raft.NewRaft(conf, fsm, logs, ls, snaps, tr)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	n.raft = r
	n.raftUp.Store(true)

	has, err := raft.HasExistingState(ls, ls, snaps)
	if err != nil {
		return fmt.Errorf("inspect raft state: %w", err)
	}
	if has || !rc.Bootstrap {
		return nil
	}
	servers := []raft.Server{{ID: conf.LocalID, Address: tr.LocalAddr(), Suffrage: raft.Voter}}
	if len(rc.Peers) > 0 {
		servers = servers[:0]
		for _, p := range rc.Peers {
			servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address), Suffrage: raft.Voter})
		}
	}
	n.logger.Info("bootstrapping cluster", "servers", len(servers))
	if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("bootstrap cluster: %w", err)
	}
	return nil
}
