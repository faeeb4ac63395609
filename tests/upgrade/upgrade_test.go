//go:build linux

package upgrade

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/adminclient"
)

func TestRollingUpgrade(t *testing.T) {
	skipShort(t)
	rollingUpgrade(t, releaseCommit, releaseVersion)
}

// TestRollingUpgradeFromTyped upgrades from command version 2, whose nodes
// drop the envelope's audit fields: the events of every write, in the
// mixed cluster too, must be the same on every node.
func TestRollingUpgradeFromTyped(t *testing.T) {
	skipShort(t)
	rollingUpgrade(t, typedCommit, 2)
}

// rollingUpgrade upgrades a 3-node cluster of commit, whose nodes read
// command version oldVersion, to this tree's binary node by node.
func rollingUpgrade(t *testing.T, commit string, oldVersion uint32) {
	bins := buildBinaries(t, commit)
	start := time.Now()
	defer func() { t.Logf("cluster scenario took %v", time.Since(start).Round(time.Millisecond)) }()
	c := startCluster(t, bins.old, 3)
	m := newModel()

	// The release cluster's own history, which the new binary must read.
	c.writeThroughEvery(m, "r0")
	c.checkConverged(m, "release cluster")

	// Followers first, the leader last, as an operator would.
	leader := c.waitHealthy()
	order := slices.DeleteFunc(slices.Clone(c.nodes), func(nd *node) bool { return nd == leader })
	order = append(order, leader)
	for i, nd := range order {
		step := fmt.Sprintf("step %d (%s)", i+1, nd.id)
		t.Logf("%s: SIGTERM %s, then the new binary on its data dir", step, nd.id)
		c.stop(nd)
		// The cluster keeps taking writes while a node is down; the
		// restarted node must catch up on them.
		c.writeThrough(m, c.anyRunning(), fmt.Sprintf("s%d-down", i+1))
		c.start(nd, bins.new)
		c.waitHealthy()
		c.checkConverged(m, step+": restarted on the new binary")
		if i == 1 { // two new nodes and one release node
			c.writeUnderNewLeader(m, bins, oldVersion)
		}
		c.writeThroughEvery(m, fmt.Sprintf("s%d", i+1))
		c.checkConverged(m, step+": writes through every node")
	}

	// Every node runs the new binary and has registered so: writes use the
	// typed commands from here on.
	for _, nd := range c.nodes {
		c.waitCommandVersion(nd, command.CommandVersion)
	}
	c.writeThroughEvery(m, "typed")
	c.checkConverged(m, "typed writes")
	c.checkActors()

	// All nodes run the new binary. One loses its state.db and rebuilds it
	// by applying the whole Raft log, entries of both versions.
	nd := c.nodes[0]
	t.Logf("replay: %s restarts without state.db", nd.id)
	c.stop(nd)
	if err := os.Remove(filepath.Join(nd.dir, "data", "state.db")); err != nil {
		t.Fatalf("remove %s's state.db to make it replay the log: %v", nd.id, err)
	}
	c.start(nd, bins.new)
	c.waitHealthy()
	c.checkConverged(m, "after "+nd.id+" rebuilt its state from the log")
	c.writeThrough(m, nd, "final")
	c.checkConverged(m, "final writes")
}

// writeThroughEvery makes a round of writes through each node in turn.
func (c *cluster) writeThroughEvery(m *model, tag string) {
	c.t.Helper()
	for _, nd := range c.nodes {
		c.writeThrough(m, nd, tag)
	}
}

// writeThrough makes a round of writes through nd, tagged with tag and nd.
func (c *cluster) writeThrough(m *model, nd *node, tag string) {
	c.t.Helper()
	if err := m.writeRound(c, nd, tag+"-"+nd.id); err != nil {
		c.t.Fatalf("writes through %s (%s): %v", nd.id, nd.bin, err)
	}
}

// anyRunning returns a running node.
func (c *cluster) anyRunning() *node {
	c.t.Helper()
	for _, nd := range c.nodes {
		if nd.running() {
			return nd
		}
	}
	c.t.Fatal("no node is running")
	return nil
}

// writeUnderNewLeader makes a node of the new binary lead while a release
// node follows, and writes through every node in one term of that leader:
// the release node applies entries the new leader proposed, and forwards
// writes to it. The only way to move leadership is a leader's graceful
// stop, so a release leader is stopped and restarted on its own binary
// until a new node wins, a bounded number of times.
func (c *cluster) writeUnderNewLeader(m *model, bins binaries, oldVersion uint32) {
	c.t.Helper()
	const attempts = 4
	for attempt := range attempts {
		leader := c.waitHealthy()
		if leader.bin != bins.new {
			c.t.Logf("leader %s runs the release: SIGTERM hands leadership over, then it restarts on the release", leader.id)
			c.stop(leader)
			c.start(leader, leader.bin)
			continue
		}
		old := slices.IndexFunc(c.nodes, func(nd *node) bool { return nd.bin == bins.old })
		if old < 0 {
			c.t.Fatal("no node runs the release")
		}
		term := c.term(leader)
		// A release node reads only its own command version (1: JSON
		// policies; 2: no audit fields), so the new leader writes that
		// until every node is upgraded.
		c.waitCommandVersion(leader, oldVersion)
		c.writeThroughEvery(m, fmt.Sprintf("mixed%d", attempt))
		if after := c.waitHealthy(); after == leader && c.term(leader) == term {
			c.t.Logf("%s (new) led term %d while %s (release) followed; writes through every node committed",
				leader.id, term, c.nodes[old].id)
			return
		}
		c.t.Logf("leadership moved during the writes; again")
	}
	c.t.Fatalf("no node of the new binary led a whole round of writes while a release node followed in %d attempts", attempts)
}

// term is the Raft term nd reports.
func (c *cluster) term(nd *node) uint64 {
	c.t.Helper()
	st, err := c.status(nd)
	if err != nil {
		c.t.Fatal(err)
	}
	return st.Term
}

// checkActors: every node holds the same events with the same actors (the
// audit fields were written only once every node read them, so no replica
// recorded what another dropped), and the writes after the upgrade name
// their actor.
func (c *cluster) checkActors() {
	c.t.Helper()
	type audited struct {
		ID    uint64
		Actor string
	}
	var ref []audited
	for _, nd := range c.nodes {
		var got []audited
		for after := uint64(0); ; {
			page, err := nd.api.Events(c.ctx, adminclient.EventFilter{After: after, Limit: 1000})
			if err != nil {
				c.t.Fatalf("%s: GET /v1/events: %v", nd.id, err)
			}
			for _, ev := range page.Events {
				got = append(got, audited{ev.ID, ev.Actor})
			}
			if len(page.Events) == 0 {
				break
			}
			after = page.LastID
		}
		if len(got) == 0 || got[len(got)-1].Actor == "" {
			c.t.Fatalf("%s: the last event after the upgrade names no actor (%d events)", nd.id, len(got))
		}
		if ref == nil {
			ref = got
		} else if diff := cmp.Diff(ref, got); diff != "" {
			c.t.Fatalf("%s: events and actors differ from %s's (-%s +%s):\n%s", nd.id, c.nodes[0].id, c.nodes[0].id, nd.id, diff)
		}
	}
}
