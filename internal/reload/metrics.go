package reload

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/policyd/policyd/internal/buildinfo"
)

// metrics are the reload controller's collectors, plus
// configmap_reload_stopped, which reports a fatal stop that would otherwise
// only be logged.
// The env label carries the scope value, whatever reload.scope_label is. The
// seed's Info metric configmap_reload is exposed as configmap_reload_info,
// the name the Prometheus Python client gives an Info metric.
type metrics struct {
	restarts          *prometheus.CounterVec
	errors            *prometheus.CounterVec
	debounced         *prometheus.CounterVec
	retries           *prometheus.CounterVec
	watchErrors       prometheus.Counter
	watchReconnects   prometheus.Counter
	leaderTransitions *prometheus.CounterVec
	leaderState       prometheus.Gauge
	acquireLatency    prometheus.Histogram
	pending           prometheus.Gauge
	dropped           prometheus.Counter
	stopped           *prometheus.GaugeVec
}

// Stop reasons (the stopped metric's label and the status reason).
const (
	reasonUnauthorized = "unauthorized"
	reasonForbidden    = "forbidden"
)

func newMetrics(reg prometheus.Registerer, namespace, selector string) (*metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "configmap_reload_" + name, Help: help}, labels)
	}
	m := &metrics{
		restarts:  counter("restarts_total", "Successful deployment restarts.", "env"),
		errors:    counter("errors_total", "Failed restart patch attempts.", "env"),
		debounced: counter("debounced_total", "Events suppressed by debounce.", "env"),
		retries:   counter("retry_total", "Retry attempts scheduled after failed restart operations.", "env"),
		watchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configmap_reload_watch_errors_total", Help: "Watch stream errors.",
		}),
		watchReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configmap_reload_watch_reconnects_total", Help: "Watch stream reconnects after first connect.",
		}),
		leaderTransitions: counter("leader_transitions_total", "Leadership transitions (acquired/lost).", "transition"),
		leaderState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configmap_reload_leader_state", Help: "1 when this replica is leader, otherwise 0.",
		}),
		acquireLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "configmap_reload_leader_acquire_latency_seconds",
			Help: "Time spent waiting to acquire leadership: from the last contact with the previous Raft leader to this node's controller starting.",
			// From a leadership transfer (tens of ms) to a lost quorum (minutes).
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configmap_reload_pending_restarts", Help: "Pending debounced restart queue depth.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configmap_reload_dropped_restarts_total",
			Help: "Pending restart flush failures during shutdown/leadership handoff (the queue is replicated through Raft, so a handoff drops none).",
		}),
		stopped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "configmap_reload_stopped", Help: "1 while the controller is stopped by a fatal API error (unauthorized/forbidden) until the next leadership term.",
		}, []string{"reason"}),
	}
	b := buildinfo.Read()
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "configmap_reload_info", Help: "Build metadata.",
		ConstLabels: prometheus.Labels{"version": b.Version, "go_version": b.GoVersion, "namespace": namespace, "selector": selector},
	})
	info.Set(1)
	m.setStopped("")
	for _, tr := range []string{"acquired", "lost"} {
		m.leaderTransitions.WithLabelValues(tr)
	}
	for _, c := range []prometheus.Collector{
		m.restarts, m.errors, m.debounced, m.retries, m.watchErrors, m.watchReconnects, m.leaderTransitions,
		m.leaderState, m.acquireLatency, m.pending, m.dropped, m.stopped, info,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// setStopped sets the stopped gauge to 1 for reason and 0 for the others
// ("": running or not leading).
func (m *metrics) setStopped(reason string) {
	for _, r := range []string{reasonUnauthorized, reasonForbidden} {
		v := 0.0
		if r == reason {
			v = 1
		}
		m.stopped.WithLabelValues(r).Set(v)
	}
}

// seedScope creates scope's labelled series at 0, so that a scope's
// restarts, errors, debounces and retries are present from the moment the
// controller sees one of its ConfigMaps, not only after the first event,
// and alert rules on their rate see a series.
func (m *metrics) seedScope(scope string) {
	for _, c := range []*prometheus.CounterVec{m.restarts, m.errors, m.debounced, m.retries} {
		c.WithLabelValues(scope)
	}
}
