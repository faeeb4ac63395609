package discovery

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	streams   *prometheus.GaugeVec
	pushes    prometheus.Counter
	responses *prometheus.CounterVec
	// The two series of responses, resolved once: a push writes 10,000s.
	fullSent, unchangedSent prometheus.Counter
	pushLatency             prometheus.Histogram
	acks                    prometheus.Counter
	nacks                   prometheus.Counter
	flushes                 prometheus.Counter
}

func newMetrics(node string, reg prometheus.Registerer) (*metrics, error) {
	labels := prometheus.Labels{"node": node}
	m := &metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "policyd_discovery_streams", ConstLabels: labels,
			Help: "Connected discovery streams by scope (org/team/employee).",
		}, []string{"scope"}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "policyd_discovery_pushes_total", ConstLabels: labels,
			Help: "Snapshots pushed to streams because a committed change altered their set.",
		}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_discovery_responses_total", ConstLabels: labels,
			Help: "Responses written to streams, by kind (full or unchanged).",
		}, []string{"kind"}),
		pushLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "policyd_discovery_push_latency_seconds", ConstLabels: labels,
			Help:    "Time from the local commit of a change to its snapshot being written to a stream.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "policyd_discovery_acks_total", ConstLabels: labels, Help: "ACKs received.",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "policyd_discovery_nacks_total", ConstLabels: labels, Help: "NACKs received.",
		}),
		flushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "policyd_discovery_flushes_total", ConstLabels: labels,
			Help: "Streams closed for inactivity.",
		}),
	}
	m.fullSent = m.responses.WithLabelValues("full")
	m.unchangedSent = m.responses.WithLabelValues("unchanged")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.streams, m.pushes, m.responses, m.pushLatency, m.acks, m.nacks, m.flushes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register discovery metrics: %w", err)
		}
	}
	return m, nil
}
