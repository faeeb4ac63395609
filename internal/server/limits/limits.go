// Package limits holds the node's defences against resource exhaustion that
// are shared by its listeners: caps on open connections, per listener and
// per source address, and a set-up gate bounding concurrent connection
// set-ups.
//
// # Connection caps
//
// Every listener counts its connections from accept to close:
//
//   - http.max_connections (default 20000) and grpc.max_connections
//     (10000) bound the descriptors, goroutines and buffers a flood of
//     connects can take. The HTTP count includes connections upgraded to
//     the WebSocket feed until they close, so the HTTP cap is the node's
//     feed capacity plus its admin clients: the default leaves room for
//     the 10,000 feed connections per node the bench measures, and for
//     the overlap of a reconnect storm, when a client's new connection
//     arrives before the node has seen its old one close.
//   - http.max_connections_per_ip and grpc.max_connections_per_ip bound
//     what one source address may take of that. They are off (0) by
//     default: sidecars behind a NAT gateway, an L4 load balancer or a
//     node-local proxy all share one source address, so any fixed default
//     would either refuse such a deployment or be too high to matter.
//     Where every client has its own address (pod IPs), set them to a few
//     times what one host legitimately opens (a few hundred), so one
//     misbehaving host cannot fill the listener. An IPv6 client counts
//     per address, not per prefix. The loopback clients of the flood test
//     and the bench all come from 127.0.0.1, one address.
//   - raft.max_connections (1024) bounds the Raft listener. Peers hold a
//     few connections each (a pool of 3 and the replication pipeline), so
//     the cap only ever bites on something that is not a peer. Raft keeps
//     an inbound connection that sends nothing open indefinitely, so a
//     flood can hold this cap: established connections, which carry
//     replication, keep working, but a peer's new connection is refused
//     until the flood ends. The cap turns what would be descriptor
//     exhaustion of the whole process (every listener failing accept)
//     into that. Keep the Raft port reachable only by peers, with mutual
//     TLS (raft.tls).
//   - drift.max_connections (1024) bounds the drift webhook's listener;
//     an API server calling it holds one connection per review in flight.
//
// Connections are counted by wrapping the TCP listener (Conns.Listener),
// under any TLS, so that a refused connection costs no handshake and the
// count follows net.Conn.Close whoever closes the connection: the server,
// or the feed after net/http handed it over. The counted connection passes
// the socket through (SyscallConn), so the feed's epoll poller still
// watches the socket itself.
//
// A connection accepted over a cap is closed immediately and counted in
// policyd_connections_rejected_total{listener,reason}, reason being the
// cap's key (max_connections, max_connections_per_ip), rather than left in
// the kernel's accept backlog. Waiting in the backlog looks kinder but is
// worse under a flood: the backlog fills with the flood's connections, a
// well-behaved client's connect then hangs until its own timeout instead of
// failing fast, and nothing tells the operator. Closing at once keeps the
// node's file descriptors bounded and makes the client's
// retry-with-backoff (the SDK's) the queue. Envoy's overload manager does
// the same for downstream connections. Refusals are logged at most once
// every 10 seconds per listener.
//
// # Set-up gate
//
// Setting a connection up is the expensive part of serving a sidecar: token
// verification, an employee look-up, a read-index round trip to the leader,
// and on the feed the init message. A reconnect storm (every sidecar of a
// failed node reconnecting at once) would run all of them concurrently. The
// Gate lets at most setup.max_concurrent set-ups run on a node; the rest
// wait, in arrival order as far as the runtime schedules them, for at most
// setup.max_wait and are then refused as retryable: gRPC Unavailable,
// HTTP 503 with Retry-After. The wait keeps a storm from turning into
// failures; the bound keeps a stuck set-up from pinning callers forever.
package limits

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrBusy is returned by Gate.Enter when no set-up slot freed up within the
// configured wait: the caller should retry later, preferably elsewhere.
var ErrBusy = errors.New("too many connections being set up")

// Metrics are the rejection counters and gauges of every limit in this
// package, registered once per node.
type Metrics struct {
	connsRejected *prometheus.CounterVec
	connsOpen     *prometheus.GaugeVec
	admRejected   *prometheus.CounterVec
	admInFlight   prometheus.Gauge
	admWaiting    prometheus.Gauge
}

// NewMetrics registers the limits' metrics with reg; nil registers nothing.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		connsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_connections_rejected_total",
			Help: "Connections closed at once because their listener was at a connection cap (reason: the cap's key).",
		}, []string{"listener", "reason"}),
		connsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "policyd_connections_open",
			Help: "Connections counted against their listener's max_connections.",
		}, []string{"listener"}),
		admRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_setup_rejected_total",
			Help: "Connection set-ups refused after waiting setup.max_wait for a slot.",
		}, []string{"transport"}),
		admInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "policyd_setup_in_flight",
			Help: "Connection set-ups running (at most setup.max_concurrent).",
		}),
		admWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "policyd_setup_waiting",
			Help: "Connection set-ups waiting for an set-up slot.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.connsRejected, m.connsOpen, m.admRejected, m.admInFlight, m.admWaiting} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register limits metrics: %w", err)
		}
	}
	return m, nil
}

// Gate bounds concurrent connection set-ups. The zero value is not usable;
// build one with NewGate.
type Gate struct {
	slots   chan struct{}
	maxWait time.Duration
	m       *Metrics
}

// NewGate admits at most maxConcurrent set-ups at once; a set-up waits at
// most maxWait for a slot.
func NewGate(maxConcurrent int, maxWait time.Duration, m *Metrics) *Gate {
	return &Gate{slots: make(chan struct{}, max(1, maxConcurrent)), maxWait: maxWait, m: m}
}

// Enter waits for a set-up slot. On success the caller must call release
// exactly once (further calls do nothing) when its set-up is done. It
// returns ErrBusy after the gate's wait, or ctx's error if ctx ends first.
// transport labels the rejection metric.
func (g *Gate) Enter(ctx context.Context, transport string) (release func(), err error) {
	select {
	case g.slots <- struct{}{}:
		return g.acquired(), nil
	default:
	}
	g.m.admWaiting.Inc()
	defer g.m.admWaiting.Dec()
	t := time.NewTimer(g.maxWait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return g.acquired(), nil
	case <-t.C:
		g.m.admRejected.WithLabelValues(transport).Inc()
		return nil, fmt.Errorf("%w: waited %v", ErrBusy, g.maxWait)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// RetryAfter is the delay suggested to a refused client: the gate's wait,
// at least a second.
func (g *Gate) RetryAfter() time.Duration { return max(time.Second, g.maxWait) }

func (g *Gate) acquired() func() {
	g.m.admInFlight.Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.m.admInFlight.Dec()
			<-g.slots
		})
	}
}
