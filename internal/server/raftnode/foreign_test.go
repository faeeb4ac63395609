package raftnode

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/internal/config"
)

// TestForeignVerdict: only a majority of the configured members (this node
// counted) naming one other cluster makes the data dir foreign, so that the
// members of the right cluster never take themselves for the stray one.
func TestForeignVerdict(t *testing.T) {
	p := func(id string) config.Peer { return config.Peer{ID: id, Address: id + ":7000"} }
	answer := func(id, cluster string) peerAnswer { return peerAnswer{peer: p(id), cluster: cluster} }
	tests := []struct {
		name      string
		members   int
		answers   []peerAnswer
		want      string
		wantPeers []config.Peer
	}{
		{name: "both peers of three name another cluster", members: 3,
			answers: []peerAnswer{answer("n1", "B"), answer("n3", "B")}, want: "B", wantPeers: []config.Peer{p("n1"), p("n3")}},
		{name: "the stray peer of three is not a majority", members: 3,
			answers: []peerAnswer{answer("n2", "B"), answer("n3", "A")}},
		{name: "one peer answers, the other is down", members: 3,
			answers: []peerAnswer{answer("n1", "B"), answer("n3", "")}},
		{name: "two peers of three name two other clusters", members: 3,
			answers: []peerAnswer{answer("n1", "B"), answer("n3", "C")}},
		{name: "three of five", members: 5,
			answers: []peerAnswer{answer("n1", "B"), answer("n2", "B"), answer("n3", "B"), answer("n4", "A")},
			want:    "B", wantPeers: []config.Peer{p("n1"), p("n2"), p("n3")}},
		{name: "two stray peers of five", members: 5,
			answers: []peerAnswer{answer("n4", "B"), answer("n5", "B"), answer("n2", "A"), answer("n3", "A")}},
		{name: "the only peer of two is no majority", members: 2,
			answers: []peerAnswer{answer("n1", "B")}},
		{name: "every peer agrees", members: 3,
			answers: []peerAnswer{answer("n1", "A"), answer("n3", "A")}},
		{name: "not in raft.peers, which all name another cluster", members: 4,
			answers: []peerAnswer{answer("n1", "B"), answer("n2", "B"), answer("n3", "B")},
			want:    "B", wantPeers: []config.Peer{p("n1"), p("n2"), p("n3")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, peers := foreignVerdict("A", tc.members, tc.answers)
			if got != tc.want {
				t.Errorf("cluster = %q, want %q", got, tc.want)
			}
			if diff := cmp.Diff(tc.wantPeers, peers); diff != "" {
				t.Errorf("peers (-want +got):\n%s", diff)
			}
		})
	}
}
