package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/policyd/policyd/client"
)

// defaultStartConcurrency is how many SDK sidecars start at once: a
// reconnect storm of thousands is the failover scenario's business, not
// the opening of a fleet.
const defaultStartConcurrency = 64

// startSlotTimeout frees a start slot whose sidecar is not ready yet, so
// that one node refusing connections does not stall the opening.
const startSlotTimeout = 10 * time.Second

// sdkFleetSpec describes the SDK sidecars to start, spread over every node
// of the cluster round robin (sidecar i of a kind on node i mod nodes).
type sdkFleetSpec struct {
	grpc, ws int
	// orgs: sidecar i of a kind is in org i mod orgs.
	orgs int
	// grpcScope is what a gRPC sidecar asks for (see fleetSpec).
	grpcScope string
	// streamsPerConn > 1 gives each run of that many gRPC sidecars of a
	// node one shared connection to that node (client.Config.GRPCConn), as
	// an agent serving many identities would; failover is then the
	// connection's. With 1 each sidecar dials every node itself, its own
	// first, and fails over between them as a real sidecar does.
	streamsPerConn int
	// startConcurrency bounds the sidecars starting at once: a slot is
	// freed when its sidecar is first ready, its Run ends, or after
	// startSlotTimeout.
	startConcurrency int
	// apply, when set, is every sidecar's Config.Apply, told which sidecar
	// it runs in (the rollout scenario rejects a marked candidate with it).
	apply func(c *sidecar, set []client.Policy) error
	// onUpdate, when set, is called from every sidecar's Config.OnUpdate
	// after the fleet has recorded the update, with its receipt time on the
	// fleet clock.
	onUpdate func(c *sidecar, u client.Update, at time.Duration)
	// shadowInterval, when set, is every sidecar's
	// Config.ShadowReportInterval.
	shadowInterval time.Duration
	// interceptor, when set, sees every unary RPC of the gRPC sidecars
	// (health checks, shadow reports); each sidecar then gets its own
	// connection to its own node, dialed by bench (the shadow scenario
	// counts and gates reports with it).
	interceptor grpc.UnaryClientInterceptor
}

// sdkFleet is a fleet of sidecars run by the client SDK (package client):
// every message goes through the SDK as in a real sidecar (decoded in
// full, compiled into the rules IsBlocked evaluates, ACKed over gRPC).
// Their received versions feed a fleet, so holdWait works as for the
// simulated sidecars.
type sdkFleet struct {
	*fleet
	clients []*client.Client
	readyAt []atomic.Int64 // per sidecar: the last transition to ready, on the fleet clock
}

// openSDKFleet starts the SDK sidecars of spec against cl, at most
// spec.startConcurrency at a time, and returns once every one has started;
// wait for a version with watch and wait. A sidecar whose Run ends with an
// error is dead (fleet.deaths).
func openSDKFleet(ctx context.Context, cl *cluster, spec sdkFleetSpec) (*sdkFleet, error) {
	fctx, cancel := context.WithCancel(context.Background())
	f := &sdkFleet{fleet: &fleet{base: time.Now(), ctx: fctx, cancel: cancel,
		http: &http.Client{Transport: &http.Transport{Proxy: nil}}}}
	nodes := len(cl.nodes)
	for i := range spec.grpc {
		f.cars = append(f.cars, &sidecar{idx: len(f.cars), kind: kindGRPC, node: i % nodes, org: i % spec.orgs, id: sidecarID(kindGRPC, i)})
	}
	for i := range spec.ws {
		f.cars = append(f.cars, &sidecar{idx: len(f.cars), kind: kindWS, node: i % nodes, org: i % spec.orgs, id: sidecarID(kindWS, i)})
	}
	f.readyAt = make([]atomic.Int64, len(f.cars))
	f.clients = make([]*client.Client, len(f.cars))

	// With one stream per connection each sidecar dials its nodes itself
	// (conns stays nil) and fails over between them.
	conns := make([]*grpc.ClientConn, len(f.cars))
	switch {
	case spec.interceptor != nil:
		var err error
		if conns, err = f.sharedConns(cl.grpcAddrs(), 1, grpc.WithChainUnaryInterceptor(spec.interceptor)); err != nil {
			f.close()
			return nil, err
		}
	case spec.streamsPerConn > 1:
		var err error
		if conns, err = f.sharedConns(cl.grpcAddrs(), spec.streamsPerConn); err != nil {
			f.close()
			return nil, err
		}
	}
	sem := make(chan struct{}, spec.startConcurrency)
	for _, c := range f.cars {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			f.close()
			return nil, ctx.Err()
		}
		var once sync.Once
		release := func() { once.Do(func() { <-sem }) }
		slotTimer := time.AfterFunc(startSlotTimeout, release)
		cfg := f.sdkConfig(cl, spec, c, conns[c.idx])
		onState := cfg.OnStateChange
		cfg.OnStateChange = func(from, to client.State) {
			onState(from, to)
			if to == client.StateReady {
				slotTimer.Stop()
				release()
			}
		}
		sdk, err := client.New(cfg, nil)
		if err != nil {
			release()
			f.close()
			return nil, fmt.Errorf("sidecar %s: %w", c.id, err)
		}
		f.clients[c.idx] = sdk
		f.wg.Go(func() {
			defer release()
			if err := sdk.Run(f.ctx); err != nil {
				f.fail(c, err)
			}
		})
	}
	return f, nil
}

// sdkConfig is sidecar c's SDK configuration: every node in Servers, its
// own first, or only the node of conn when it shares one.
func (f *sdkFleet) sdkConfig(cl *cluster, spec sdkFleetSpec, c *sidecar, conn *grpc.ClientConn) client.Config {
	cfg := client.Config{ClientAddress: c.id, MaxMessageBytes: maxRecvMsgSize,
		OnUpdate: func(u client.Update) {
			at := f.since()
			f.msgs[c.kind].Add(1)
			c.received(u.Version, at)
			if spec.onUpdate != nil {
				spec.onUpdate(c, u, at)
			}
		},
		OnStateChange: func(_, to client.State) {
			if to == client.StateReady {
				f.readyAt[c.idx].Store(int64(f.since()))
			}
		},
	}
	cfg.ShadowReportInterval = spec.shadowInterval
	if spec.apply != nil {
		cfg.Apply = func(set []client.Policy) error { return spec.apply(c, set) }
	}
	if c.kind == kindWS {
		cfg.Transport = client.TransportWS
		cfg.Employee = c.id
		for j := range cl.nodes {
			cfg.Servers = append(cfg.Servers, cl.nodes[(c.node+j)%len(cl.nodes)].httpAddr)
		}
		return cfg
	}
	cfg.Transport = client.TransportGRPC
	s := grpcScope(spec.grpcScope, c)
	cfg.Scope = client.Scope{Org: s.GetOrg(), Team: s.GetTeam(), Employee: s.GetEmployee()}
	if conn != nil {
		cfg.GRPCConn = conn
		cfg.Servers = []string{cl.nodes[c.node].grpcAddr}
		return cfg
	}
	for j := range cl.nodes {
		cfg.Servers = append(cfg.Servers, cl.nodes[(c.node+j)%len(cl.nodes)].grpcAddr)
	}
	return cfg
}

// connectedTo returns the sidecars whose current connection is to nd.
func (f *sdkFleet) connectedTo(nd *node) []int {
	var out []int
	for i, sdk := range f.clients {
		if host := serverHost(sdk.Stats().Server); host == nd.grpcAddr || host == nd.httpAddr {
			out = append(out, i)
		}
	}
	return out
}

// serverHost is the host:port of an SDK server entry: host:port, or a URL.
func serverHost(s string) string {
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		return u.Host
	}
	return s
}

// readyAfter returns the latest, over sidecars idxs, of their first
// transition to ready after t (t itself when idxs is empty). A sidecar
// that has not become ready since counts as now.
func (f *sdkFleet) readyAfter(idxs []int, t time.Duration) time.Duration {
	last := t
	for _, i := range idxs {
		at := time.Duration(f.readyAt[i].Load())
		if at <= t {
			at = f.since()
		}
		last = max(last, at)
	}
	return last
}
