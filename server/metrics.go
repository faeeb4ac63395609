package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics exposes the node's Raft position. Raft's own go-metrics
// (commit times, replication) are bridged into the same registry by main,
// because hashicorp/raft reports them through a process-global sink.
func (n *Node) registerMetrics() {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "policyd", Name: name, Help: help}, f)
	}
	n.reg.MustRegister(
		gauge("raft_is_leader", "1 if this node is the Raft leader.", func() float64 {
			if n.rn.IsLeader() {
				return 1
			}
			return 0
		}),
		gauge("raft_term", "Current Raft term.", func() float64 { return float64(n.rn.Term()) }),
		gauge("raft_commit_index", "Raft commit index known to this node.", func() float64 { return float64(n.rn.CommitIndex()) }),
		gauge("sidecars_refused_stale", "1 while this node has not heard from a Raft leader for longer than setup.max_staleness: it has closed its sidecar streams and refuses new ones.", func() float64 {
			if n.stale.Load() {
				return 1
			}
			return 0
		}),
		gauge("store_applied_index", "Last Raft index applied to the state database.", func() float64 { return float64(n.store.AppliedIndex()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "policyd", Name: "raft_entries_skipped_total",
			Help: "Log entries of a command type this node does not know, marked ignorable, that it skipped (a newer node's commands during a rolling upgrade).",
		}, func() float64 { return float64(n.rn.SkippedEntries()) }),
	)
}
