package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/raftlog"
)

// TestLogStoreKinds runs a 3-node cluster on each raft.log_store: writes
// replicate, a stopped leader's successor takes writes, and the old leader
// catches up on restart. A node keeps the log it was created with when the
// setting changes.
func TestLogStoreKinds(t *testing.T) {
	for _, tc := range []struct{ kind, file, other string }{
		{raftlog.KindBoltDB, "raft.db", raftlog.KindWAL},
		{raftlog.KindWAL, "wal", raftlog.KindBoltDB},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c := newCluster(t, 3, func(cfg *config.Config) { cfg.Raft.LogStore = tc.kind })
			for i, cfg := range c.cfgs {
				if _, err := os.Stat(filepath.Join(cfg.DataDir, "raft", tc.file)); err != nil {
					t.Errorf("node%d: no %s log: %v", i+1, tc.kind, err)
				}
			}
			apiFor(t, c.follower()).putPolicy("acme.before", "acme", "1")
			l := indexOf(c, c.leader())
			c.stop(l)
			after := apiFor(t, c.leader()).putPolicy("acme.after", "acme", "2")

			// The restarted node is told to use the other kind, and keeps
			// its own.
			c.cfgs[l].Raft.LogStore = tc.other
			n := c.restart(l)
			poll.Eventually(t, "the restarted node to catch up", func() error {
				_, err := n.store.GetPolicy("acme.after")
				return err
			}, poll.Within(20*time.Second))

			if got, err := raftlog.Existing(raftlog.Layout{Dir: c.cfgs[l].DataDir}.RaftDir()); err != nil || got != tc.kind {
				t.Errorf("restarted node's log store = %q (%v), want %q", got, err, tc.kind)
			}
			c.waitConverged()
			if p, err := n.store.GetPolicy("acme.after"); err != nil || p.Revision != after.Revision {
				t.Errorf("restarted node holds %+v (%v), want revision %d", p, err, after.Revision)
			}
		})
	}
}
