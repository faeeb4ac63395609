// Package limits holds the node's defences against resource exhaustion that
// its listeners share: caps on open connections, per listener and per
// source address (Conns, wrapping the TCP listener under any TLS), and a
// set-up gate bounding concurrent connection set-ups (Gate). It does not
// bound message sizes or send queues; each listener does. The keys, their
// defaults and the reasons for them are in docs/configuration.md.
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
