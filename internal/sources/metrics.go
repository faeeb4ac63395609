package sources

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sources' collectors (docs/sources.md).
type Metrics struct {
	syncs    *prometheus.CounterVec
	policies *prometheus.GaugeVec
	lastSync *prometheus.GaugeVec
	duration prometheus.Histogram
}

// NewMetrics registers the collectors with reg; nil keeps them private.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_source_syncs_total", Help: "Source syncs by result (committed, unchanged, invalid, prune_refused, error).",
		}, []string{"source", "result"}),
		policies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "policyd_source_policies", Help: "Policies a source owns, after its last sync.",
		}, []string{"source"}),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "policyd_source_last_sync_timestamp_seconds", Help: "When a source last synced successfully (committed or unchanged), as a Unix time.",
		}, []string{"source"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "policyd_source_sync_duration_seconds", Help: "Time from the start of a source's read to its sync's commit.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.syncs, m.policies, m.lastSync, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Seed creates a source's series at zero, so alerts on them see a series
// from the start.
func (m *Metrics) Seed(source string) {
	for _, r := range []string{ResultCommitted, ResultUnchanged, ResultInvalid, ResultPruneRefused, ResultError} {
		m.syncs.WithLabelValues(source, r)
	}
	m.policies.WithLabelValues(source)
	m.lastSync.WithLabelValues(source)
}

func (m *Metrics) observe(source, result string, took time.Duration, owned int) {
	m.syncs.WithLabelValues(source, result).Inc()
	m.duration.Observe(took.Seconds())
	if owned >= 0 {
		m.policies.WithLabelValues(source).Set(float64(owned))
	}
	if result == ResultCommitted || result == ResultUnchanged {
		m.lastSync.WithLabelValues(source).SetToCurrentTime()
	}
}
