package authz

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/policyd/policyd/client"
)

// The APIs a decision came through, the values of the api label.
const (
	apiGRPC = "grpc"
	apiHTTP = "http"
)

type metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	rejected  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, d Decider) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_authz_decisions_total",
			Help: "Decisions by API, result (allow, deny) and the policy that denied (empty for allow or a state denial).",
		}, []string{"api", "result", "policy"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "policyd_authz_decision_duration_seconds",
			Help:    "Time to decide one request, from its attributes to the decision, by API.",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3},
		}, []string{"api"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_authz_rejected_total",
			Help: "Requests denied before evaluation: headers_too_large, body_too_large, invalid_utf8, overloaded, bad_request.",
		}, []string{"reason"}),
	}
	for _, r := range []string{reasonHeaders, reasonBody, reasonUTF8, reasonOverloaded, reasonBadRequest} {
		m.rejected.WithLabelValues(r)
	}
	cs := []prometheus.Collector{
		m.decisions, m.latency, m.rejected,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "policyd_authz_eval_errors_total",
			Help: "Evaluations denied because an expression failed: run-time error, cost limit, non-bool result.",
		}, func() float64 { return float64(d.EvalErrors()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "policyd_authz_policies",
			Help: "Policies in the set in force.",
		}, func() float64 { return float64(len(d.Policies())) }),
	}
	for _, st := range []client.State{client.StateConnecting, client.StateReady, client.StateDisconnected, client.StateRevoked} {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "policyd_authz_state",
			Help:        "The SDK's state: 1 for the current one.",
			ConstLabels: prometheus.Labels{"state": string(st)},
		}, func() float64 {
			if d.State() == st {
				return 1
			}
			return 0
		}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register authz metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(api string, d client.Decision, start time.Time) {
	m.latency.WithLabelValues(api).Observe(time.Since(start).Seconds())
	result := "allow"
	if !d.Allowed {
		result = "deny"
	}
	m.decisions.WithLabelValues(api, result, d.Policy).Inc()
}
