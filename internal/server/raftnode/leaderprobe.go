package raftnode

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/policyd/policyd/internal/third_party/raft"
)

// Failover after a leader process dies (raft.leader_probe).
//
// hashicorp/raft followers notice a dead leader only when their heartbeat
// timer fires, at a random point between one and two heartbeat timeouts, and
// a follower refuses to vote while it still believes in a leader. So the
// election waits for the later of the two survivors' timers: 1 to 3 s with
// the default 1 s timeout, most of a failover's time. Shorter timeouts for
// everyone would make a loaded cluster depose healthy leaders.
//
// The probe uses evidence instead. A follower that has not heard from its
// leader for raft.leader_lease_timeout dials the leader's Raft address. A
// refused connection means the host is up and nothing listens on the port
// any more: the process has died or is restarting. Only then does the
// follower shorten its own heartbeat and election timeouts to the lease
// timeout (raft.ReloadConfig), which makes it campaign now.
//
// Survivors with equal logs that campaign at the same moment split the vote,
// and with short election timeouts on a loaded machine they split again and
// again (seen in the failover bench), so they take turns: sorted by ID, the
// first campaigns once the leader has been silent for a lease timeout and
// each next one a lease timeout later, unless a leader has appeared by then.
// The first usually loses its pre-vote to a survivor that still follows the
// dead leader, and the next one then wins, with the first's vote.
//
// The configured timeouts come back as soon as a leader is known and heard
// from again. A host that is down or cut off refuses nothing; those keep the
// ordinary timeouts. Safety never depends on timeouts in Raft, only
// liveness, and pre-vote keeps a follower that campaigns early from
// disturbing a leader the other follower still hears.

// probeInterval is how often a follower checks on its leader.
const probeInterval = 100 * time.Millisecond

// probeRestoreAfter bounds how long shortened timeouts may stay in force if
// no leader emerges (a lost quorum): then the ordinary ones apply again.
const probeRestoreAfter = 30 * time.Second

// leaderProbeLoop runs the probe until the node closes.
func (n *Node) leaderProbeLoop() {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	var p leaderProbe
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			p.step(n.ctx, n.raft, raft.ServerID(n.id), n.cfg.Raft.LeaderLeaseTimeout, n.logger)
		}
	}
}

// leaderProbe is the probe's state: whether this node's timeouts are
// shortened, since when, and what to restore.
type leaderProbe struct {
	// refusedAt is when the current leader's port was first found
	// refusing; zero while it is not.
	refusedAt time.Time
	shortened bool
	since     time.Time
	saved     raft.ReloadableConfig
}

func (p *leaderProbe) step(ctx context.Context, r *raft.Raft, self raft.ServerID, lease time.Duration, log *slog.Logger) {
	state := r.State()
	addr, id := r.LeaderWithID()
	heard := time.Since(r.LastContact()) < lease
	if p.shortened {
		if state == raft.Leader || (addr != "" && heard) || time.Since(p.since) > probeRestoreAfter {
			if err := r.ReloadConfig(p.saved); err != nil {
				log.Warn("restore raft timeouts after leader probe", "error", err)
				return
			}
			p.shortened = false
			log.Info("raft timeouts restored", "leader", id, "after", time.Since(p.since).Round(time.Millisecond))
		}
		return
	}
	if state != raft.Follower || addr == "" || heard {
		p.refusedAt = time.Time{}
		return
	}
	if p.refusedAt.IsZero() {
		if !refused(ctx, string(addr), probeInterval) {
			return
		}
		p.refusedAt = time.Now()
	}
	// Turns are counted from the last contact, which the survivors share
	// to within a heartbeat (the leader sent to both), rather than from
	// each one's own probe, which a busy node runs late.
	if time.Since(r.LastContact()) < time.Duration(campaignRank(r, self, id)+1)*lease {
		return
	}
	p.refusedAt = time.Time{}
	p.saved = r.ReloadableConfig()
	fast := p.saved
	fast.HeartbeatTimeout, fast.ElectionTimeout = lease, lease
	if err := r.ReloadConfig(fast); err != nil {
		log.Warn("shorten raft timeouts after leader probe", "error", err)
		return
	}
	p.shortened, p.since = true, time.Now()
	log.Warn("leader's raft port refuses connections; campaigning now", "leader", id, "leader_addr", addr,
		"last_contact", time.Since(r.LastContact()).Round(time.Millisecond))
}

// campaignRank is node self's turn to campaign after leader dead died: its
// place among the other voters, sorted by ID.
func campaignRank(r *raft.Raft, self, dead raft.ServerID) int {
	f := r.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	var ids []string
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && s.ID != dead {
			ids = append(ids, string(s.ID))
		}
	}
	slices.Sort(ids)
	return max(slices.Index(ids, string(self)), 0)
}

// refused reports whether a TCP connection to addr is actively refused.
func refused(ctx context.Context, addr string, timeout time.Duration) bool {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		_ = c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
