//go:build linux

package upgrade

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/adminclient"
)

// auditedCommit is the last commit of command version 3 (audit fields, no
// rollout commands): its nodes stop on a rollout entry.
const auditedCommit = "080209cdc0acbdc01f945cf9d634c425557ba81a" // api: rollout messages, discovery capabilities, rollout tags on clients

// TestRolloutRefusedUntilUpgraded: while a node of command version 3 is a
// member, a rollout is refused with 409 through every node, and nothing
// reaches the log that would stop that node; once every node runs this
// tree and registered version 4, the same rollout starts.
func TestRolloutRefusedUntilUpgraded(t *testing.T) {
	skipShort(t)
	bins := buildBinaries(t, auditedCommit)
	c := startCluster(t, bins.old, 3)
	leader := c.waitHealthy()
	start := adminclient.StartRollout{
		Changes: []adminclient.StartChange{{Op: "put", Policy: []byte(`{"name":"acme.staged","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"deny"}}`)}},
		Stages:  []adminclient.StartStage{{Percent: 50, Bake: "1h"}, {Percent: 100, Bake: "1h"}},
	}
	// The followers first: a leader of the release and two new followers,
	// then a new leader with a release follower.
	for _, nd := range c.nodes {
		if nd == leader {
			continue
		}
		c.stop(nd)
		c.start(nd, bins.new)
		c.waitHealthy()
	}
	for round := range 2 {
		for _, nd := range c.nodes {
			if nd.bin != bins.new {
				continue
			}
			_, err := nd.api.StartRollout(c.ctx, start)
			var ae *adminclient.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "cluster not upgraded") {
				t.Fatalf("round %d: rollout through %s with a release member: %v, want 409 cluster not upgraded", round, nd.id, err)
			}
		}
		if round == 0 {
			// Its graceful stop hands leadership to a new node; the
			// release node then follows it.
			c.stop(leader)
			c.start(leader, bins.old)
			c.waitHealthy()
		}
	}
	c.stop(leader)
	c.start(leader, bins.new)
	c.waitHealthy()
	for _, nd := range c.nodes {
		c.waitCommandVersion(nd, command.CommandVersion)
	}
	ro, err := leader.api.StartRollout(c.ctx, start)
	if err != nil || ro.State != "running" {
		t.Fatalf("rollout after the upgrade: %+v %v", ro, err)
	}
	if err := c.exited(); err != nil {
		t.Fatal(err)
	}
}
