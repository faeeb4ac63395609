package feed

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the feed's Prometheus collectors, named as in docs/operations.md.
type metrics struct {
	connections prometheus.Gauge
	byOrg       *prometheus.GaugeVec
	latency     prometheus.Histogram
	sent        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "policy_ws_connections_total",
			Help: "Open WebSocket policy feed connections on this node.",
		}),
		byOrg: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "policy_ws_connections_by_org",
			Help: "Open WebSocket policy feed connections on this node, by org.",
		}, []string{"org"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "policy_broadcast_latency_ms",
			Help:    "Milliseconds from a change's commit on this node to a feed message carrying it being written to a socket.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000},
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "policy_broadcast_count",
			Help: "Policy messages (init, upsert, delete) written to WebSocket feed connections.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.connections, m.byOrg, m.latency, m.sent} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("feed: register metrics: %w", err)
		}
	}
	return m, nil
}
