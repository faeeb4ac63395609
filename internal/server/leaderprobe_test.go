package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
)

// TestLeaderProbeFailover crashes the leader of a cluster whose heartbeat
// and election timeouts are 30 s, so without the probe no survivor could
// campaign for at least 30 s. With it, the survivors find the dead leader's
// Raft port refusing connections and elect a new leader within seconds, and
// then go back to the 30 s timeouts. With the probe off they must still be
// leaderless well after the probe would have acted.
func TestLeaderProbeFailover(t *testing.T) {
	const slow = 30 * time.Second
	for _, probe := range []bool{true, false} {
		t.Run(fmt.Sprintf("leader_probe=%v", probe), func(t *testing.T) {
			c := newCluster(t, 3, func(cfg *config.Config) { cfg.Raft.LeaderProbe = probe })
			for _, n := range c.running() {
				rc := n.consensus.Raft().ReloadableConfig()
				rc.HeartbeatTimeout, rc.ElectionTimeout = slow, slow
				if err := n.consensus.Raft().ReloadConfig(rc); err != nil {
					t.Fatalf("slow down %s: %v", n.ID(), err)
				}
			}
			old := c.leader()
			var i int
			for i = range c.nodes {
				if c.nodes[i] == old {
					break
				}
			}
			c.crash(i)

			if !probe {
				// Long enough for the probe (lease 150 ms, then a dial)
				// to have made a survivor campaign several times over.
				poll.Throughout(t, "no survivor leads with the probe off", 3*time.Second, func() error {
					for _, n := range c.running() {
						if n.IsLeader() {
							return fmt.Errorf("%s became leader within 3 s with the probe off and %v timeouts", n.ID(), slow)
						}
					}
					return nil
				})
				return
			}
			leader := c.leader()
			if leader == old {
				t.Fatal("the crashed node is still the leader")
			}
			poll.Eventually(t, "survivors back on their own timeouts", func() error {
				for _, n := range c.running() {
					if got := n.consensus.Raft().ReloadableConfig().HeartbeatTimeout; got != slow {
						return fmt.Errorf("%s heartbeat timeout %v, want %v", n.ID(), got, slow)
					}
				}
				return nil
			}, poll.Within(5*time.Second))

			// The new leader takes writes.
			apiFor(t, leader).putPolicy("after-probe", "acme", "written after failover")
		})
	}
}
