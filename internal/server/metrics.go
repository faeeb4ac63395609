package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/server/proxystatus"
)

// registerMetrics exposes the node's Raft position, its readiness, its
// sidecars by state and the drift reports it holds. Raft's own go-metrics
// (commit times, replication, with the peer as a label) and
// policyd_build_info are registered by main, because hashicorp/raft reports
// through a process-global sink and the build's version is main's.
func (n *Node) registerMetrics() {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "policyd", Name: name, Help: help}, f)
	}
	n.reg.MustRegister(
		gauge("raft_is_leader", "1 if this node is the Raft leader.", func() float64 {
			if n.IsLeader() {
				return 1
			}
			return 0
		}),
		gauge("raft_term", "Current Raft term.", func() float64 { return float64(n.Term()) }),
		gauge("raft_commit_index", "Raft commit index known to this node.", func() float64 { return float64(n.CommitIndex()) }),
		gauge("sidecars_refused_stale", "1 while this node has not heard from a Raft leader for longer than setup.max_staleness: it has closed its sidecar streams and refuses new ones.", func() float64 {
			if n.stale.Load() {
				return 1
			}
			return 0
		}),
		gauge("ready", "1 while /readyz answers 200: a leader is known and this node has applied the leader's commit index as of the scrape.", func() float64 {
			ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
			defer cancel()
			if n.Ready(ctx) != nil {
				return 0
			}
			return 1
		}),
		gauge("store_applied_index", "Last Raft index applied to the state database.", func() float64 { return float64(n.store.AppliedIndex()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "policyd", Name: "raft_entries_skipped_total",
			Help: "Log entries of a command type this node does not know, marked ignorable, that it skipped (a newer node's commands during a rolling upgrade).",
		}, func() float64 { return float64(n.SkippedEntries()) }),
		&proxyStates{clients: n.localClients},
		&driftReports{store: n.store},
	)
}

// Sidecar states of proxy_state. A sidecar is in exactly one:
//   - connected: its stream or feed connection is open and it has not been
//     sent a policy set yet (it waits for the node to catch up, or has not
//     sent its first request);
//   - pending: it was sent the newest set for its scope and has not
//     answered (gRPC discovery only);
//   - acked: it accepted the last set it was sent (a feed client counts as
//     acked once the set is written, as the feed has no ACKs);
//   - nacked: it rejected the last set it was sent and runs its last good
//     one (gRPC discovery only).
const stateConnected = "connected"

var proxyStateNames = []string{stateConnected, proxystatus.Pending, proxystatus.Acked, proxystatus.Nacked}

// proxyStates is proxy_state: the sidecars connected to this
// node, by state and transport (grpc, ws). It is per node; sum over nodes
// for the cluster. Every state is reported, at 0 when empty, so that alert
// expressions see a series.
type proxyStates struct {
	clients func() []*clusterv1.ClientInfo
}

var proxyStateDesc = prometheus.NewDesc("proxy_state",
	"Sidecars connected to this node by state: connected (no set sent yet), pending (newest set sent, no answer), acked, nacked.",
	[]string{"state", "transport"}, nil)

func (p *proxyStates) Describe(ch chan<- *prometheus.Desc) { ch <- proxyStateDesc }

func (p *proxyStates) Collect(ch chan<- prometheus.Metric) {
	type key struct{ state, transport string }
	counts := map[key]int{}
	for _, c := range p.clients() {
		st := c.GetState()
		if st == "" {
			st = stateConnected
		}
		counts[key{st, c.GetTransport()}]++
	}
	for _, tr := range []string{"grpc", "ws"} {
		for _, st := range proxyStateNames {
			ch <- prometheus.MustNewConstMetric(proxyStateDesc, prometheus.GaugeValue, float64(counts[key{st, tr}]), st, tr)
		}
	}
}
