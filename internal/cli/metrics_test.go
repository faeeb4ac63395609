package cli

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// TestPeerLabelSink: raft's labelled per-peer metrics reach Prometheus as
// one metric with a peer label.
func TestPeerLabelSink(t *testing.T) {
	reg := prometheus.NewRegistry()
	sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{Registerer: reg, Expiration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s := peerLabelSink{sink}
	key := []string{"policyd", "raft", "replication", "appendEntries", "logs"}
	for _, peer := range []string{"node2", "node3"} {
		s.IncrCounterWithLabels(key, 2, []gometrics.Label{{Name: "peer_id", Value: peer}})
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				got[mf.GetName()] = append(got[mf.GetName()], l.GetName()+"="+l.GetValue())
			}
		}
	}
	want := map[string][]string{"policyd_raft_replication_appendEntries_logs": {"peer=node2", "peer=node3"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}
