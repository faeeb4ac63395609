// Package server runs one policyd node. It is the only package that touches
// Raft: it builds the raft instance over raftfsm and store, bootstraps or
// joins the cluster, forwards writes from followers to the leader over the
// internal gRPC service (api/cluster/v1), answers linearizable reads with a
// read index, runs leader-only tasks while this node leads, and owns the
// listeners (admin REST in server/adminapi, gRPC).
//
// Shutdown runs in a fixed order: stop accepting (listeners), end long-lived
// streams, stop leader tasks and background loops, hand leadership over if
// this node leads, shut raft down, then close the log store and the state
// database.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/auth"
	"github.com/policyd/policyd/config"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server/adminapi"
	"github.com/policyd/policyd/store"
)

// LeaderTask is work that runs only on the leader. Run is started once this
// node is leader and its state has caught up with every entry committed
// before its term (a barrier); ctx ends when leadership is lost or the node
// stops, and the next leadership term does not start until Run has returned.
type LeaderTask struct {
	Name string
	Run  func(ctx context.Context)
}

// Node is one running policyd server.
type Node struct {
	cfg    config.Config
	logger *slog.Logger
	id     string
	reg    *prometheus.Registry

	store     *store.Store
	raft      *raft.Raft
	logStore  *raftboltdb.BoltStore
	transport *raft.NetworkTransport
	validator *policy.Validator

	httpLn  net.Listener
	grpcLn  net.Listener
	httpSrv *http.Server
	grpcSrv *grpc.Server
	health  *health.Server
	api     *adminapi.API
	peers   *peerPool

	// ctx ends when Close starts; background loops watch it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// readyTerm is the term in which this node, as leader, has applied a
	// barrier: reads at its commit index are linearizable only then.
	readyTerm   atomic.Uint64
	leaderTasks []LeaderTask

	startOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

// New builds a node from cfg: it opens (or refuses) the state database,
// binds the HTTP, gRPC and Raft listeners, and starts Raft, bootstrapping the
// cluster when configured and no Raft state exists yet. Call Start to serve
// and Close to stop. reg receives the node's metrics; nil makes a fresh
// registry.
func New(cfg config.Config, logger *slog.Logger, reg *prometheus.Registry) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %q: %w", cfg.DataDir, err)
	}
	id, err := resolveNodeID(cfg.NodeID, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	logger = logger.With("node", id)
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, logger: logger, id: id, reg: reg, ctx: ctx, cancel: cancel, peers: newPeerPool()}
	// On any failure below, release what was acquired, in reverse order. (n
	// is a local, not the named result, which is nil on failure.)
	defer func() {
		if err != nil {
			if rerr := n.release(); rerr != nil {
				logger.Warn("cleanup after failed start", "err", rerr)
			}
		}
	}()

	if n.validator, err = policy.NewValidator(cfg.Policy.ExtraKinds); err != nil {
		return nil, fmt.Errorf("policies.extra_kinds: %w", err)
	}
	var tokens *auth.AdminTokens
	if cfg.Auth.AdminTokensFile != "" {
		if tokens, err = auth.LoadAdminTokens(cfg.Auth.AdminTokensFile); err != nil {
			return nil, fmt.Errorf("auth.admin_tokens_file: %w", err)
		}
	}
	if n.store, err = store.Open(filepath.Join(cfg.DataDir, "state.db"), logger.With("component", "store")); err != nil {
		return nil, err
	}
	if n.httpLn, err = net.Listen("tcp", cfg.HTTP.Addr); err != nil {
		return nil, fmt.Errorf("listen http.addr %s: %w", cfg.HTTP.Addr, err)
	}
	if n.grpcLn, err = net.Listen("tcp", cfg.GRPC.Addr); err != nil {
		return nil, fmt.Errorf("listen grpc.addr %s: %w", cfg.GRPC.Addr, err)
	}
	if err = n.setupRaft(); err != nil {
		return nil, err
	}

	n.leaderTasks = []LeaderTask{
		// Followers forward writes to the leader's registered address, so a
		// new leader makes sure its own is current before anything else.
		{Name: "register-self", Run: n.ensureRegistered},
		{Name: "event-retention", Run: n.pruneEventsTask},
	}
	n.grpcSrv = grpc.NewServer(
		grpc.MaxRecvMsgSize(4 << 20),
	)
	clusterv1.RegisterClusterServer(n.grpcSrv, &clusterService{n: n})
	n.health = health.NewServer()
	healthpb.RegisterHealthServer(n.grpcSrv, n.health)
	reflection.Register(n.grpcSrv)

	n.api = adminapi.New(adminapi.Config{Tokens: tokens, Registry: reg}, logger.With("component", "adminapi"), n)
	n.httpSrv = &http.Server{
		Handler:           n.api,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	// Shutdown waits for handlers; long-lived streams must end first.
	n.httpSrv.RegisterOnShutdown(n.api.CloseStreams)
	n.registerMetrics()
	return n, nil
}

// AddLeaderTask registers work to run while this node leads. It must be
// called before Start.
func (n *Node) AddLeaderTask(t LeaderTask) {
	n.leaderTasks = append(n.leaderTasks, t)
}

// Start serves the listeners and starts the background loops. It returns at
// once.
func (n *Node) Start() {
	n.startOnce.Do(func() {
		n.goBackground("http", func() {
			if err := n.httpSrv.Serve(n.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.logger.Error("http server stopped", "err", err)
			}
		})
		n.goBackground("grpc", func() {
			if err := n.grpcSrv.Serve(n.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				n.logger.Error("grpc server stopped", "err", err)
			}
		})
		n.goBackground("leadership", n.leadershipLoop)
		n.goBackground("register", n.registerLoop)
		n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		n.logger.Info("node started",
			"http", n.HTTPAddr(), "grpc", n.GRPCAddr(), "raft", string(n.transport.LocalAddr()),
			"data_dir", n.cfg.DataDir, "applied_index", n.store.AppliedIndex())
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

// Close shuts the node down in order and waits for it. It is safe to call
// more than once; ctx bounds the graceful parts.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		n.logger.Info("shutting down")
		n.health.Shutdown()
		// 1. Listeners: stop accepting; in-flight requests finish, streams end
		// through RegisterOnShutdown.
		if err := n.httpSrv.Shutdown(ctx); err != nil {
			n.logger.Warn("http shutdown incomplete, closing", "err", err)
			_ = n.httpSrv.Close()
		}
		stopped := make(chan struct{})
		go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			n.grpcSrv.Stop()
			<-stopped
		}
		// 2. Background loops and leader tasks.
		n.cancel()
		n.wg.Wait()
		n.peers.Close()
		// 3. Raft: hand leadership over so the cluster doesn't wait out an
		// election timeout.
		if n.raft.State() == raft.Leader && n.otherVoters() > 0 {
			if err := n.raft.LeadershipTransfer().Error(); err != nil {
				// Expected when the whole cluster is stopping at once.
				n.logger.Info("leadership transfer before shutdown failed", "err", err)
			}
		}
		n.closeErr = n.release()
		n.logger.Info("shut down")
	})
	return n.closeErr
}

// release closes raft, the transport, the log store and the state database,
// whichever exist. It is also the cleanup path of a failed New.
func (n *Node) release() error {
	var errs []error
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
	if n.logStore != nil {
		if err := n.logStore.Close(); err != nil {
			errs = append(errs, fmt.Errorf("raft log store: %w", err))
		}
	}
	for _, ln := range []net.Listener{n.httpLn, n.grpcLn} {
		if ln != nil {
			_ = ln.Close() // already closed by Shutdown/Stop on the normal path
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

// HTTPAddr is the bound admin HTTP address.
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }

// GRPCAddr is the bound gRPC address.
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// RaftAddr is the address peers use for Raft.
func (n *Node) RaftAddr() string { return string(n.transport.LocalAddr()) }

// Store is the node's local replica. Reads from it are local and may trail
// the leader; see ConsistentRead.
func (n *Node) Store() *store.Store { return n.store }

// Validator validates policies and employees before they are proposed.
func (n *Node) Validator() *policy.Validator { return n.validator }

// IsLeader reports whether this node currently leads.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// advertised returns the configured advertise address, or the bound one.
func advertised(configured string, ln net.Listener) string {
	if configured != "" {
		return configured
	}
	return ln.Addr().String()
}

func (n *Node) self() store.Member {
	return store.Member{
		ID:       n.id,
		RaftAddr: string(n.transport.LocalAddr()),
		HTTPAddr: advertised(n.cfg.HTTP.Advertise, n.httpLn),
		GRPCAddr: advertised(n.cfg.GRPC.Advertise, n.grpcLn),
	}
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

// Ready reports nil when a leader is known and this node's state has caught
// up with the commit index it knows of (within maxReadyLag entries).
func (n *Node) Ready() error {
	if _, id := n.raft.LeaderWithID(); id == "" {
		return fmt.Errorf("no known leader: %w", ErrNoLeader)
	}
	commit, applied := n.raft.CommitIndex(), n.store.AppliedIndex()
	if commit > applied+maxReadyLag {
		return &unavailableError{msg: fmt.Sprintf("catching up: applied %d of %d", applied, commit)}
	}
	return nil
}

// maxReadyLag tolerates the few entries that are always in flight under write
// load; a node further behind is still replaying or installing a snapshot.
const maxReadyLag = 1024

var _ adminapi.Backend = (*Node)(nil)
