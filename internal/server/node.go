// Package server runs one policyd node. It wires Raft
// (internal/server/raftnode, the one owner of hashicorp/raft) to the
// listeners (admin REST in internal/server/adminapi, gRPC discovery, the
// WebSocket feed, metrics), the in-memory policy index, the settings SIGHUP
// may change (settings.go), TLS (tls.go), the resource limits of
// internal/server/limits, and the leader tasks of the reload controller,
// drift detection and staged rollouts. A damaged Raft log or state.db stops
// New before any listener opens; a failed write while running closes
// Faulted. It serves no protocol itself. See docs/design.md and
// docs/operations.md.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/server/adminapi"
	"github.com/policyd/policyd/internal/server/decisionlog"
	"github.com/policyd/policyd/internal/server/discovery"
	"github.com/policyd/policyd/internal/server/feed"
	"github.com/policyd/policyd/internal/server/limits"
	"github.com/policyd/policyd/internal/server/peer"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/server/proxystatus"
	"github.com/policyd/policyd/internal/server/raftlog"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/server/shadow"
	"github.com/policyd/policyd/internal/sources"
	"github.com/policyd/policyd/internal/store"
)

// consensus is the Raft side of a node, embedded so that its methods are
// the node's own rather than copied as forwarders.
type consensus = raftnode.Node

// Node is one running policyd server.
type Node struct {
	cfg    config.Config
	logger *slog.Logger
	id     string
	reg    *prometheus.Registry

	// consensus owns Raft, the data directory and the peer API; its
	// methods (Propose, Join, Status, …) are the node's own. store is its
	// local replica.
	*consensus
	store     *store.Store
	validator *policy.Validator

	httpLn  net.Listener
	grpcLn  net.Listener
	httpSrv *http.Server
	grpcSrv *grpc.Server
	health  *health.Server
	api     *adminapi.API
	tls     nodeTLS
	keys    *peer.Keyring // nil without cluster.secret_file
	// driftConns caps the drift webhook listener, which setupDrift binds;
	// nil without drift.addr.
	driftConns *limits.Conns

	// Sidecar-facing serving: the in-memory policy index, fed by one
	// subscription in commit order, and the two transports reading it.
	verifier  *auth.JWTVerifier
	changes   *store.Subscription
	policies  *policyset.Index
	discovery *discovery.Service
	feed      *feed.Hub

	// ctx ends when Close starts; background loops watch it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// stale is set while the node has not heard from a leader for longer
	// than setup.max_staleness (see staleness.go).
	stale  atomic.Bool
	reload *reload.Controller // nil unless reload.enabled
	drift  *driftWebhook      // nil unless drift.addr is set
	// sources reconciles the policy sources on the leader; nil without any.
	sources *sources.Engine

	// shadow aggregates this node's sidecars' shadow reports.
	shadow *shadow.Aggregator
	// decisions keeps this node's sidecars' decision records; nil when
	// decisions.enabled is false. masker hides identities from read tokens.
	decisions *decisionlog.Log
	masker    *decisionlog.Masker
	// settings are what SIGHUP may change at run time (settings.go).
	settings settings

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
	id, err := raftnode.ResolveNodeID(cfg.NodeID, raftlog.Layout{Dir: cfg.DataDir})
	if err != nil {
		return nil, err
	}
	logger = logger.With("node", id)
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, logger: logger, id: id, reg: reg, ctx: ctx, cancel: cancel}
	// On any failure below, release what was acquired, in reverse order. (n
	// is a local, not the named result, which is nil on failure.)
	defer func() {
		if err != nil {
			if rerr := n.release(func() error { return n.Release() }); rerr != nil {
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
	if cfg.Cluster.SecretFile != "" {
		if n.keys, err = peer.LoadKeyring(cfg.Cluster.SecretFile); err != nil {
			return nil, fmt.Errorf("cluster.secret_file: %w", err)
		}
	}
	if cfg.Auth.Mode == "jwt" {
		if n.verifier, err = auth.NewJWTVerifier(cfg.Auth.JWT, logger.With("component", "jwt")); err != nil {
			return nil, fmt.Errorf("auth.jwt: %w", err)
		}
	}
	if n.consensus, err = raftnode.New(cfg, logger, id); err != nil {
		return nil, err
	}
	n.store = n.consensus.Store()
	// Subscribe before the index loads, so no commit falls between the two.
	n.changes = n.store.SubscribeWithData()
	if n.policies, err = policyset.New(n.store); err != nil {
		return nil, err
	}
	if err = n.setupTLS(); err != nil {
		return nil, err
	}
	lm, err := limits.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	// Every listener counts its TCP connections under any TLS, so that a
	// connection over a cap costs no handshake, and until they close: the
	// HTTP count includes connections upgraded to the feed.
	limitsLog := logger.With("component", "limits")
	if n.httpLn, err = net.Listen("tcp", cfg.HTTP.Addr); err != nil {
		return nil, fmt.Errorf("listen http.addr %s: %w", cfg.HTTP.Addr, err)
	}
	n.httpLn = n.httpListener(limits.NewConns("http",
		limits.Caps{Max: cfg.HTTP.MaxConnections, PerIP: cfg.HTTP.MaxConnectionsPerIP}, lm, limitsLog).Listener(n.httpLn))
	if n.grpcLn, err = net.Listen("tcp", cfg.GRPC.Addr); err != nil {
		return nil, fmt.Errorf("listen grpc.addr %s: %w", cfg.GRPC.Addr, err)
	}
	n.grpcLn = limits.NewConns("grpc",
		limits.Caps{Max: cfg.GRPC.MaxConnections, PerIP: cfg.GRPC.MaxConnectionsPerIP}, lm, limitsLog).Listener(n.grpcLn)
	raftConns := limits.NewConns("raft", limits.Caps{Max: cfg.Raft.MaxConnections}, lm, limitsLog)
	if cfg.Drift.Addr != "" {
		n.driftConns = limits.NewConns("drift", limits.Caps{Max: cfg.Drift.MaxConnections}, lm, limitsLog)
	}
	gate := limits.NewGate(cfg.Setup.MaxConcurrent, cfg.Setup.MaxWait, lm)
	if n.shadow, err = shadow.New(shadow.Config{}, logger.With("component", "shadow"), id, reg); err != nil {
		return nil, err
	}
	if err = n.setupDecisions(); err != nil {
		return nil, err
	}
	if err = n.Setup(raftnode.Deps{
		Validator: n.validator, Keys: n.keys, TLS: n.tls.raft, Conns: raftConns,
		Addrs: func() (string, string) {
			return advertised(cfg.HTTP.Advertise, n.httpLn), advertised(cfg.GRPC.Advertise, n.grpcLn)
		},
		LocalClients:   proxystatus.Local{NodeID: id, Clients: n.localClients}.LocalClients,
		LocalShadow:    n.shadow.LocalShadow,
		LocalDecisions: n.localDecisions,
		LocalImpact:    n.localImpact,
		DropSidecars:   func(reason string) (int, int) { return n.discovery.DropAll(reason), n.feed.DropAll(reason) },
		ServerOptions: []grpc.ServerOption{
			grpc.MaxRecvMsgSize(maxGRPCMessage),
			grpc.StaticStreamWindowSize(grpcStreamWindow),
			grpc.StaticConnWindowSize(grpcConnWindow),
			grpc.ConnectionTimeout(handshakeTimeout),
		},
		DialOptions: []grpc.DialOption{grpc.WithStaticStreamWindowSize(grpcStreamWindow), grpc.WithStaticConnWindowSize(grpcConnWindow)},
	}); err != nil {
		return nil, err
	}

	// One gate for both transports: sidecars of both kinds that fail over
	// together share the consistent reads.
	caughtUp := n.NewReadGate()
	if n.discovery, err = discovery.New(cfg.Discovery, logger.With("component", "discovery"), discovery.Deps{
		NodeID: id, LeaderID: n.LeaderID, Store: n.store, Policies: n.policies, Verifier: n.verifier, Registry: reg,
		CaughtUp: caughtUp, Shadow: n.shadow, Decisions: n.decisions, Refusal: n.refusal,
	}); err != nil {
		return nil, err
	}
	if n.feed, err = feed.New(cfg.Feed, logger.With("component", "feed"), feed.Deps{
		NodeID: id, Store: n.store, Policies: n.policies, Verifier: n.verifier, Registry: reg, CaughtUp: caughtUp,
		OwnWrites: n.ReadOwnWrites, Shadow: n.shadow, Decisions: n.decisions, Refusal: n.refusal,
	}); err != nil {
		return nil, err
	}
	n.grpcSrv = grpc.NewServer(append(append(discovery.ServerOptions(),
		grpc.MaxRecvMsgSize(maxGRPCMessage),
		grpc.StaticStreamWindowSize(grpcStreamWindow),
		grpc.StaticConnWindowSize(grpcConnWindow),
		grpc.MaxConcurrentStreams(uint32(cfg.GRPC.MaxConcurrentStreams)), //nolint:gosec // validated >= 1
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.GRPC.KeepaliveMinTime}),
		// The TLS handshake and HTTP/2 preface of a new connection, bounded
		// like an HTTP request's headers (grpc-go's default is 2 minutes).
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.ChainStreamInterceptor(
			n.refuseWhenStaleGRPC(discoveryv1.PolicyDiscoveryService_StreamPolicies_FullMethodName),
			gate.StreamInterceptor("grpc", discoveryv1.PolicyDiscoveryService_StreamPolicies_FullMethodName)),
	), n.grpcServerOptions()...)...)
	n.discovery.Register(n.grpcSrv)
	n.health = health.NewServer()
	// Not serving until the first readiness check says otherwise
	// (health.go).
	n.health.SetServingStatus(discoveryService, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(n.grpcSrv, n.health)
	reflection.Register(n.grpcSrv)

	n.api = adminapi.New(adminapi.Config{Tokens: tokens, Registry: reg}, logger.With("component", "adminapi"), n)
	mux := http.NewServeMux()
	mux.Handle(feedv1.Path, n.refuseWhenStaleHTTP(gate.HTTP("websocket", n.feed)))
	mux.Handle("/", n.api)
	n.httpSrv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: handshakeTimeout,
		MaxHeaderBytes:    cfg.HTTP.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	// Shutdown waits for handlers; long-lived streams must end first.
	n.httpSrv.RegisterOnShutdown(n.api.CloseStreams)
	n.httpSrv.RegisterOnShutdown(n.feed.CloseAll)
	if err = n.setupConsole(mux); err != nil {
		return nil, err
	}
	if err = n.setupReload(); err != nil {
		return nil, err
	}
	if err = n.setupDrift(); err != nil {
		return nil, err
	}
	if err = n.setupSources(); err != nil {
		return nil, err
	}
	n.setupRollouts()
	n.registerMetrics()
	return n, nil
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
		n.consensus.Start()
		n.goBackground("changes", n.dispatchChanges)
		n.goBackground("discovery", func() { n.discovery.Run(n.ctx) })
		n.goBackground("feed", func() { n.feed.Run(n.ctx) })
		if n.cfg.Setup.MaxStaleness > 0 {
			n.goBackground("staleness", n.stalenessLoop)
		}
		n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		n.goBackground("health", n.healthLoop)
		n.logger.Info("node started",
			"http", n.HTTPAddr(), "grpc", n.GRPCAddr(), "raft", n.RaftAddr(),
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
	if n.Parked() {
		// Raft waits on a failed write that never returns: it cannot shut
		// down, and the process exits instead.
		return n.Fault()
	}
	n.closeOnce.Do(func() {
		n.logger.Info("shutting down")
		n.health.Shutdown()
		// 1. Listeners: stop accepting; in-flight requests finish, streams end
		// through RegisterOnShutdown.
		if err := n.httpSrv.Shutdown(ctx); err != nil {
			n.logger.Warn("http shutdown incomplete, closing", "err", err)
			_ = n.httpSrv.Close()
		}
		// GracefulStop waits for every stream, and discovery streams only
		// end when told to.
		n.discovery.CloseAll()
		stopped := make(chan struct{})
		go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			n.grpcSrv.Stop()
			<-stopped
		}
		n.closeDrift(ctx)
		// 2. Background loops and leader tasks.
		n.cancel()
		n.Stop()
		n.wg.Wait()
		// 3. Raft: hand leadership over so the cluster doesn't wait out an
		// election timeout, then shut it down.
		n.closeErr = n.release(n.consensus.Close)
		n.logger.Info("shut down")
	})
	return n.closeErr
}

// release closes Raft with closeRaft (raftnode's Close, or its Release
// after a failed New), then what the wiring holds. It is also the cleanup
// path of a failed New.
func (n *Node) release(closeRaft func() error) error {
	var errs []error
	if n.consensus != nil {
		if err := closeRaft(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.changes != nil {
		n.changes.Close()
	}
	if n.decisions != nil {
		if err := n.decisions.Close(); err != nil {
			errs = append(errs, fmt.Errorf("decision log: %w", err))
		}
	}
	if n.verifier != nil {
		if err := n.verifier.Close(); err != nil {
			errs = append(errs, fmt.Errorf("jwt verifier: %w", err))
		}
	}
	for _, ln := range []net.Listener{n.httpLn, n.grpcLn} {
		if ln != nil {
			_ = ln.Close() // already closed by Shutdown/Stop on the normal path
		}
	}
	n.cancel()
	return errors.Join(errs...)
}

// maxGRPCMessage bounds every message a node receives over gRPC: forwarded
// commands (policies are at most 1 MiB as REST bodies) and sidecar requests
// (a NACK's error text is the largest part).
const maxGRPCMessage = 4 << 20

// Fixed HTTP/2 flow-control windows for the gRPC server and the peer
// connections. grpc-go's default dynamic windows estimate the bandwidth-delay
// product by answering received data with a PING whenever none is out, so
// every sidecar ACK cost the node a PING and the sidecar a PING ACK, and
// every response the reverse: about one extra write per stream per change
// on each side (bench propagation, 1,000 gRPC sidecars with a connection
// each). A stream's window takes a forwarded policy of the largest size the
// REST API accepts (1 MiB) in one go; a connection's, four. A window is what
// a client may send before the node reads it: these stay below the 16 MiB
// the dynamic windows could grow to, so a client that sends faster than the
// node reads can make it hold no more than before.
const (
	grpcStreamWindow = adminapi.MaxBodyBytes
	grpcConnWindow   = 4 * grpcStreamWindow
)

// handshakeTimeout bounds how long a new connection may take to say what it
// wants (HTTP request headers; TLS handshake and HTTP/2 preface on gRPC), so
// that connections that send nothing do not hold a descriptor for long.
const handshakeTimeout = 10 * time.Second

// dispatchChanges feeds committed batches, in commit order, first to the
// policy index and then to the transports, so that a transport reacting to a
// change reads sets that include it.
func (n *Node) dispatchChanges() {
	for {
		select {
		case <-n.ctx.Done():
			return
		case _, ok := <-n.changes.Ready():
			if !ok {
				return
			}
		}
		for _, c := range n.changes.Next() {
			n.NoteChange(c)
			if err := n.policies.Update(c); err != nil {
				// The index would serve stale sets; start over from the store.
				n.logger.Error("policy index update failed, reloading", "index", c.Index, "err", err)
				if err := n.policies.Update(store.Change{Index: c.Index, Resync: true}); err != nil {
					n.logger.Error("policy index reload failed", "err", err)
				}
				c = store.Change{Index: c.Index, Resync: true, At: c.At}
			}
			n.discovery.OnChange(c)
			n.feed.OnChange(c)
		}
	}
}

// ID is this node's Raft server ID.
func (n *Node) ID() string { return n.id }

// HTTPAddr is the bound admin HTTP address.
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }

// GRPCAddr is the bound gRPC address.
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// Store is the node's local replica. Reads from it are local and may trail
// the leader; see ConsistentRead.
func (n *Node) Store() *store.Store { return n.store }

// Validator validates policies and employees before they are proposed.
func (n *Node) Validator() *policy.Validator { return n.validator }

// advertised returns the configured advertise address, or the bound one.
func advertised(configured string, ln net.Listener) string {
	if configured != "" {
		return configured
	}
	return ln.Addr().String()
}

// Ready reports nil when this node is caught up (raftnode.Node.Ready: a
// leader is known, the node is not removed and has applied the leader's
// commit index as of the call) and not stale (staleness.go).
func (n *Node) Ready(ctx context.Context) error {
	if n.stale.Load() {
		return &staleError{}
	}
	return n.consensus.Ready(ctx)
}

// TransferLeadership hands leadership to voter id ("" lets raft choose); on
// a follower it refuses with a conflict naming the leader.
func (n *Node) TransferLeadership(_ context.Context, id string) (from, to string, err error) {
	from = n.LeaderID()
	if err := n.consensus.TransferLeadership(id); err != nil {
		if errors.Is(err, raftnode.ErrNotLeader) {
			return "", "", fmt.Errorf("%w: node %s is not the leader (%q leads): send the transfer to the leader", store.ErrConflict, n.consensus.ID(), from)
		}
		return "", "", err
	}
	return from, n.LeaderID(), nil
}

// Status describes the cluster as this node sees it.
func (n *Node) Status(ctx context.Context) (*adminapi.ClusterStatus, error) {
	rs, err := n.consensus.Status(ctx)
	if err != nil {
		return nil, err
	}
	st := &adminapi.ClusterStatus{
		NodeID: rs.NodeID, ClusterID: rs.ClusterID, State: rs.State, LeaderID: rs.LeaderID, LeaderAddr: rs.LeaderAddr,
		Term: rs.Term, CommitIndex: rs.CommitIndex, LastIndex: rs.LastIndex, AppliedIndex: rs.AppliedIndex,
		LastContact: rs.LastContact, Digest: rs.Digest, CommandVersion: rs.CommandVersion,
	}
	for _, m := range rs.Members {
		st.Members = append(st.Members, adminapi.MemberStatus{
			ID: m.ID, RaftAddr: m.RaftAddr, HTTPAddr: m.HTTPAddr, GRPCAddr: m.GRPCAddr, Suffrage: m.Suffrage, Leader: m.Leader,
			CommandVersion: m.CommandVersion,
		})
	}
	return st, nil
}

// Clients lists the sidecars connected to every member of the cluster, this
// node's first (proxystatus.Clients).
func (n *Node) Clients(ctx context.Context) ([]*clusterv1.ClientInfo, []string, error) {
	return proxystatus.Clients(ctx, n.consensus, n.localClients())
}

// localClients lists the sidecars connected to this node, on both
// transports.
func (n *Node) localClients() []*clusterv1.ClientInfo {
	return append(n.discovery.Clients(), n.feed.Clients()...)
}

var _ adminapi.Backend = (*Node)(nil)
