// Package raftnode is the one owner of hashicorp/raft in policyd: it builds
// raft over raftfsm, store and the log of internal/server/raftlog, with a
// transport on the peer plane (internal/server/peer), bootstraps or joins the
// cluster, forwards writes to the leader (api/cluster/v1) and checks them
// there, answers linearizable reads with a read index, changes membership,
// runs leader-only tasks, and runs `policyd recover` and `policyd snapshot
// restore`. A damaged Raft log or state.db stops New with a
// raftlog.DataError; a failed write while running closes Faulted. See
// docs/operations.md.
package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/grpc"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/server/limits"
	"github.com/policyd/policyd/internal/server/peer"
	"github.com/policyd/policyd/internal/server/raftlog"
	"github.com/policyd/policyd/internal/store"
	"github.com/policyd/policyd/internal/tlsfiles"
)

// LeaderTask is work that runs only on the leader. Run is started once this
// node is leader and its state has caught up with every entry committed
// before its term (a barrier); ctx ends when leadership is lost or the node
// stops, and the next leadership term does not start until Run has returned.
type LeaderTask struct {
	Name string
	Run  func(ctx context.Context)
}

// Deps is what the node's wiring hands the Raft owner once its listeners
// are bound (Setup).
type Deps struct {
	// Validator checks the content of commands forwarded to the leader.
	Validator *policy.Validator
	// Keys are the cluster secrets; nil without cluster.secret_file.
	Keys *peer.Keyring
	// TLS secures the peer plane (raft.tls); nil: plain TCP.
	TLS *tlsfiles.Reloader
	// Conns, if not nil, counts and caps the Raft listener's connections.
	Conns *limits.Conns
	// Addrs are the HTTP and gRPC addresses this node registers for others.
	Addrs func() (http, grpc string)
	// LocalClients and LocalShadow answer the peer API's application
	// RPCs, a member asking for this node's part of a cluster-wide view;
	// the packages that own the views implement them (proxystatus, shadow).
	LocalClients func(context.Context, *clusterv1.LocalClientsRequest) (*clusterv1.LocalClientsResponse, error)
	LocalShadow  func(context.Context, *clusterv1.LocalShadowRequest) (*clusterv1.LocalShadowResponse, error)
	// LocalDecisions and LocalImpact answer a member's query of this
	// node's decision log and its part of an impact replay (decisionlog);
	// nil: the node keeps no decisions and answers with none.
	LocalDecisions func(context.Context, *clusterv1.LocalDecisionsRequest) (*clusterv1.LocalDecisionsResponse, error)
	LocalImpact    func(context.Context, *clusterv1.LocalImpactRequest) (*clusterv1.LocalImpactResponse, error)
	// DropSidecars closes every sidecar stream with reason, once this node
	// is removed from the cluster or finds its data dir belongs to another
	// cluster, and says how many it closed.
	DropSidecars func(reason string) (streams, conns int)
	// ServerOptions and DialOptions tune the peer API's gRPC server and
	// its clients (message sizes, flow-control windows).
	ServerOptions []grpc.ServerOption
	DialOptions   []grpc.DialOption
}

// Node is one node's Raft: its log, state and peer API.
type Node struct {
	cfg    config.Config
	logger *slog.Logger
	id     string
	layout raftlog.Layout
	deps   Deps

	store     *store.Store
	raft      *raft.Raft
	fsm       *raftfsm.FSM
	logStore  raftlog.Store
	faults    *raftlog.Faults // failed writes to the data directory (raftlog.Faults)
	transport *raft.NetworkTransport
	validator *policy.Validator

	peers *peerPool
	// The peer plane (internal/server/peer): raft.addr carries Raft and the
	// node-to-node API (peerSrv), behind the handshake peerCfg describes.
	peerCfg   *peer.Config
	mux       *peer.Mux
	muxDone   chan struct{}
	peerSrv   *grpc.Server
	peerDone  chan struct{}
	clusterID atomic.Pointer[string]

	// ctx ends when Stop starts; background loops watch it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// readyTerm is the term in which this node, as leader, has applied a
	// barrier: reads at its commit index are linearizable only then.
	readyTerm atomic.Uint64
	// acked is the highest index of a write this node has acknowledged
	// (ReadOwnWrites).
	acked watermark
	// removed is set while the Raft configuration no longer holds this
	// node (removed.go).
	removed atomic.Bool
	// ready answers readiness probes (ready.go).
	ready *readiness
	// toldNotMember is when a peer last refused this node as not in its
	// configuration (Unix nanoseconds).
	toldNotMember atomic.Int64
	// foreign is set, once, when raft.peers belong to another cluster
	// than this data dir (foreign.go); peersChecked once their first
	// answers are in, and askPeers asks them again.
	foreign      atomic.Pointer[foreignDataError]
	peersChecked atomic.Bool
	askPeers     chan struct{}
	// raftUp is set once n.raft is assigned, for the peer plane's
	// goroutines, which start before it.
	raftUp      atomic.Bool
	leaderTasks []LeaderTask
	registerMu  sync.Mutex
	registered  bool // this process has registered its record; under registerMu

	startOnce sync.Once
	stopOnce  sync.Once
}

// New opens the data directory of node id as cfg lays it out: the Raft log,
// then state.db, refusing either if damaged, and the cluster ID. Raft itself
// starts with Setup; Release undoes New.
func New(cfg config.Config, logger *slog.Logger, id string) (_ *Node, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, logger: logger, id: id, layout: raftlog.Layout{Dir: cfg.DataDir}, ctx: ctx, cancel: cancel, askPeers: make(chan struct{}, 1)}
	if others, _ := n.otherPeers(); len(others) == 0 {
		n.peersChecked.Store(true) // no peers to ask
	}
	n.faults = raftlog.NewFaults(cfg.DataDir)
	n.ready = newReadiness(ctx, n.ConsistentRead)
	n.leaderTasks = []LeaderTask{
		// Followers forward writes to the leader's registered address, so a
		// new leader makes sure its own is current before anything else.
		{Name: "register-self", Run: n.ensureRegistered},
		{Name: "forget-removed-members", Run: n.forgetRemovedMembers},
		{Name: "event-retention", Run: n.pruneEventsTask},
		{Name: "cluster-id", Run: n.ensureClusterID},
	}
	defer func() {
		if err != nil {
			if rerr := n.Release(); rerr != nil {
				logger.Warn("cleanup after failed start", "err", rerr)
			}
		}
	}()
	if err = n.openDataFiles(); err != nil {
		return nil, err
	}
	if err = n.loadClusterID(); err != nil {
		return nil, err
	}
	return n, nil
}

// Setup builds the transport on raft.addr, the snapshot store and raft, and
// bootstraps the cluster if configured to and no Raft state exists. From
// then on a failed write to the data directory ends the node.
func (n *Node) Setup(deps Deps) error {
	n.deps = deps
	n.validator = deps.Validator
	n.peers = newPeerPool(func(ctx context.Context, addr string) (net.Conn, error) {
		c, _, err := n.peerCfg.Dial(ctx, addr, peer.KindAPI)
		return c, err
	}, deps.DialOptions)
	if err := n.setupRaft(); err != nil {
		return n.faults.Explain(err)
	}
	n.faults.Arm()
	n.peerSrv = newPeerServer(&clusterService{n: n}, deps.ServerOptions)
	return nil
}

// AddLeaderTask registers work to run while this node leads. It must be
// called before Start.
func (n *Node) AddLeaderTask(t LeaderTask) {
	n.leaderTasks = append(n.leaderTasks, t)
}

// Start serves the peer API and starts the background loops: leader tasks,
// the leader probe, member registration, the removed-node check and the
// check of raft.peers' cluster ID.
func (n *Node) Start() {
	n.startOnce.Do(func() {
		// Not a background loop: the peer API serves until raft stops
		// (Release), so that followers can forward to this node while it
		// hands leadership over.
		n.peerDone = make(chan struct{})
		go func() {
			defer close(n.peerDone)
			if err := n.peerSrv.Serve(n.mux.Listener(peer.KindAPI)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				n.logger.Error("peer api stopped", "err", err)
			}
		}()
		n.goBackground("leadership", n.leadershipLoop)
		if n.cfg.Raft.LeaderProbe {
			n.goBackground("leader-probe", n.leaderProbeLoop)
		}
		n.goBackground("register", n.registerLoop)
		n.goBackground("removed", n.removedLoop)
		if others, _ := n.otherPeers(); len(others) > 0 {
			n.goBackground("peer-cluster", n.peerClusterLoop)
		}
	})
}

func (n *Node) goBackground(name string, fn func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer n.logger.Debug("background loop ended", "loop", name)
		fn()
	}()
}

// Stop ends the background loops and leader tasks, waits for them, and
// closes the connections to peers. Raft keeps running until Close.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		n.cancel()
		n.wg.Wait()
		if n.peers != nil {
			n.peers.Close()
		}
	})
}

// Close stops the node's Raft: it hands leadership over if this node leads,
// so the cluster doesn't wait out an election timeout, then releases
// everything. A node whose write to the data directory failed cannot be
// closed (Faulted).
func (n *Node) Close() error {
	if n.faults.Parked() {
		// Raft waits on a failed write that never returns (raftlog.Faults):
		// it cannot shut down, and the process exits instead.
		return n.Fault()
	}
	n.Stop()
	if n.raft != nil && n.raft.State() == raft.Leader && n.otherVoters() > 0 {
		if err := n.raft.LeadershipTransfer().Error(); err != nil {
			// Expected when the whole cluster is stopping at once.
			n.logger.Info("leadership transfer before shutdown failed", "err", err)
		}
	}
	return n.Release()
}

// Release closes the peer API, raft, the transport, the log store and the
// state database, whichever exist. It is also the cleanup path of a failed
// start.
func (n *Node) Release() error {
	var errs []error
	if n.peerSrv != nil {
		n.peerSrv.Stop()
		if n.peerDone != nil {
			<-n.peerDone
		}
	}
	if n.raft != nil {
		if err := n.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
	}
	if n.transport != nil {
		// Close only stops the listener; pooled and pipelined connections
		// stay open (and peers' handlers blocked on them) unless closed too.
		n.transport.CloseStreams()
		if err := n.transport.Close(); err != nil {
			errs = append(errs, fmt.Errorf("raft transport: %w", err))
		}
	}
	if n.mux != nil {
		// The transport closed it; a failed Setup may not have built one.
		_ = n.mux.Close()
		<-n.muxDone
	}
	if n.logStore != nil {
		if err := n.logStore.Close(); err != nil {
			errs = append(errs, fmt.Errorf("raft log store: %w", err))
		}
	}
	if n.store != nil {
		if err := n.store.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	n.cancel()
	return errors.Join(errs...)
}

// ID is this node's Raft server ID.
func (n *Node) ID() string { return n.id }

// Store is the node's local replica.
func (n *Node) Store() *store.Store { return n.store }

// RaftAddr is the address peers use for Raft.
func (n *Node) RaftAddr() string { return string(n.transport.LocalAddr()) }

// IsLeader reports whether this node currently leads.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// LeaderID is the leader this node knows of, "" if none.
func (n *Node) LeaderID() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// LastContact is when this node last heard from a leader.
func (n *Node) LastContact() time.Time { return n.raft.LastContact() }

// Term is the current Raft term.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// SkippedEntries is how many ignorable entries of unknown types the FSM
// skipped since start.
func (n *Node) SkippedEntries() uint64 {
	if n.fsm == nil {
		return 0
	}
	return n.fsm.Skipped()
}

// CommitIndex is the Raft commit index known to this node.
func (n *Node) CommitIndex() uint64 { return n.raft.CommitIndex() }

// Removed reports whether this node was removed from the cluster.
func (n *Node) Removed() bool { return n.removed.Load() }

// Raft is the raft instance, for tests of the node's wiring that drive
// raft directly (a leadership transfer, a snapshot).
func (n *Node) Raft() *raft.Raft { return n.raft }

// LogStore is the Raft log and stable store, for the same tests.
func (n *Node) LogStore() raftlog.Store { return n.logStore }

func (n *Node) self() store.Member {
	m := store.Member{ID: n.id, RaftAddr: string(n.transport.LocalAddr()), CommandVersion: command.CommandVersion}
	if n.deps.Addrs != nil {
		m.HTTPAddr, m.GRPCAddr = n.deps.Addrs()
	}
	return m
}

func (n *Node) otherVoters() int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.id {
			c++
		}
	}
	return c
}

// NewReadGate coalesces this node's consistent reads (readgate.go); each
// read is bounded by forward.timeout and ends when the node stops.
func (n *Node) NewReadGate() func(ctx context.Context) error {
	return newReadGate(n.ctx, n.cfg.Forward.Timeout, n.ConsistentRead).Wait
}
