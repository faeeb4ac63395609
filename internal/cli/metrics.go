package cli

import (
	"fmt"
	"slices"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/policyd/policyd/internal/buildinfo"
)

var bridgeOnce sync.Once

// bridgeRaftMetrics routes hashicorp/raft's go-metrics into reg. go-metrics
// is process-global by design, so this happens once per process, here in
// main, and never inside server.
func bridgeRaftMetrics(reg prometheus.Registerer) (err error) {
	bridgeOnce.Do(func() {
		sink, serr := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{Registerer: reg, Expiration: time.Minute})
		if serr != nil {
			err = fmt.Errorf("raft metrics sink: %w", serr)
			return
		}
		mc := gometrics.DefaultConfig("policyd")
		mc.EnableHostname = false
		mc.EnableRuntimeMetrics = false // the Go collector already reports them
		_, err = gometrics.NewGlobal(mc, peerLabelSink{sink})
	})
	return err
}

// peerLabelSink names raft's peer label "peer". Raft reports each
// replication metric once per peer with the peer's ID in a peer_id label
// (raftnode turns off the legacy copies that put it in the metric name), so
// policyd_raft_replication_appendEntries_rpc{peer="node2"} is one metric
// for all peers.
type peerLabelSink struct{ *gmprom.PrometheusSink }

func (s peerLabelSink) SetGaugeWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.PrometheusSink.SetGaugeWithLabels(key, val, renamePeer(labels))
}

func (s peerLabelSink) IncrCounterWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.PrometheusSink.IncrCounterWithLabels(key, val, renamePeer(labels))
}

func (s peerLabelSink) AddSampleWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.PrometheusSink.AddSampleWithLabels(key, val, renamePeer(labels))
}

func renamePeer(labels []gometrics.Label) []gometrics.Label {
	for i, l := range labels {
		if l.Name == "peer_id" {
			out := slices.Clone(labels)
			out[i].Name = "peer"
			return out
		}
	}
	return labels
}

// buildInfo is policyd_build_info: 1, labelled with the binary's version,
// Go version and VCS commit (buildinfo).
func buildInfo() prometheus.Collector {
	b := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "policyd_build_info", Help: "1, labelled with the version, Go version and commit of this binary.",
		ConstLabels: prometheus.Labels{"version": b.Version, "goversion": b.GoVersion, "commit": b.Commit},
	})
	g.Set(1)
	return g
}
