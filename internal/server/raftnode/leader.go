package raftnode

import (
	"context"
	"sync"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/store"
)

// leadershipLoop starts the leader tasks when this node gains leadership and
// stops them, waiting for them to return, when it loses it. A new term's
// tasks never overlap the previous term's.
func (n *Node) leadershipLoop() {
	var term *leaderTerm
	stop := func() {
		if term != nil {
			term.stop()
			term = nil
			n.readyTerm.Store(0)
			n.logger.Info("leader tasks stopped")
		}
	}
	defer stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case leader := <-n.raft.LeaderCh():
			// LeaderCh may coalesce transitions; always restart cleanly.
			stop()
			if leader {
				term = n.startTerm()
			}
		}
	}
}

// leaderTerm is one run of the leader tasks.
type leaderTerm struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (t *leaderTerm) stop() {
	t.cancel()
	t.wg.Wait()
}

func (n *Node) startTerm() *leaderTerm {
	ctx, cancel := context.WithCancel(n.ctx)
	t := &leaderTerm{cancel: cancel}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		n.lead(ctx, &t.wg)
	}()
	return t
}

// lead establishes this term's leadership, then starts every leader task.
func (n *Node) lead(ctx context.Context, wg *sync.WaitGroup) {
	term := n.raft.CurrentTerm()
	// The barrier commits an entry of this term and waits until the FSM has
	// applied everything before it: until then the commit index may lag
	// what earlier leaders acknowledged, and tasks would act on stale state.
	for {
		err := n.raft.Barrier(n.cfg.Raft.ApplyTimeout).Error()
		if err == nil {
			break
		}
		n.logger.Warn("leader barrier failed", "term", term, "err", err)
		if n.raft.State() != raft.Leader || !backoff.Sleep(ctx, 100*time.Millisecond) {
			return
		}
	}
	if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
		return
	}
	n.readyTerm.Store(term)
	n.logger.Info("leading", "term", term, "applied_index", n.store.AppliedIndex())
	for _, t := range n.leaderTasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.logger.Debug("leader task started", "task", t.Name)
			t.Run(ctx)
		}()
	}
}

// registerLoop keeps this node's member record current from any role. It
// runs for the node's life: a node added later, or one whose addresses
// changed across a restart, registers as soon as a leader accepts it. A
// change to its own record (another node's fresh registration resets every
// command version) is answered at once rather than at the next tick:
// until every member has registered again, writes use the oldest command
// version, without typed payloads or audit fields.
func (n *Node) registerLoop() {
	sub := n.store.Subscribe()
	defer sub.Close()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		n.ensureRegistered(n.ctx)
		for wait := true; wait; {
			select {
			case <-n.ctx.Done():
				return
			case <-tick.C:
				wait = false
			case _, ok := <-sub.Ready():
				if !ok {
					return // store closed
				}
				wait = !n.ownRecordChanged(sub.Next())
			}
		}
	}
}

// ownRecordChanged reports whether changes touch this node's member record.
func (n *Node) ownRecordChanged(changes []store.Change) bool {
	for _, c := range changes {
		if c.Resync {
			return true
		}
		for _, e := range c.Entities {
			if e.Type == store.EntityMember && e.ID == n.id {
				return true
			}
		}
	}
	return false
}

func (n *Node) ensureRegistered(ctx context.Context) {
	// The register loop and the leader's register-self task both call this;
	// one at a time, so the second sees the first's registration instead of
	// proposing a duplicate.
	n.registerMu.Lock()
	defer n.registerMu.Unlock()
	self := n.self()
	retry := backoff.New(50*time.Millisecond, 2*time.Second, false)
	for {
		m, err := n.store.Member(n.id)
		if err == nil && m == self {
			return
		}
		if n.InConfiguration(n.id) {
			// A node whose record holds an older command version ran an
			// older release, which applied the other members'
			// registrations without the fields it did not know: its first
			// registration since start asks every other member to register
			// again. A new node, or one that moved, registers plainly.
			register := command.RegisterMember
			if !n.registered && err == nil && m.CommandVersion < self.CommandVersion {
				register = command.RegisterMemberAfresh
			}
			cmd, err := register(self)
			if err != nil {
				n.logger.Error("encode member registration", "err", err)
				return
			}
			if res, err := n.Propose(ctx, cmd); err != nil {
				n.logger.Debug("member registration not accepted yet", "err", err)
			} else if err := n.store.WaitApplied(ctx, res.GetIndex()); err == nil {
				n.registered = true
				n.logger.Info("registered member addresses", "http", self.HTTPAddr, "grpc", self.GRPCAddr, "raft", self.RaftAddr)
			}
		}
		if !retry.Wait(ctx) {
			return
		}
	}
}

// forgetRemovedMembers deletes, at the start of a term, the member records
// of nodes that are not in the Raft configuration. removeLocal deletes a
// record before it removes the server, while it surely leads, and deletes
// it again afterwards if the node re-registered in between; but a leader
// that removed itself no longer leads afterwards, and its own register loop
// may have re-registered it in between. The next leader forgets it.
func (n *Node) forgetRemovedMembers(ctx context.Context) {
	members, err := n.store.Members()
	if err != nil {
		n.logger.Error("list members", "err", err)
		return
	}
	for _, m := range members {
		if n.InConfiguration(m.ID) {
			continue
		}
		if err := n.forgetMember(ctx, m.ID); err != nil {
			n.logger.Warn("forget addresses of a node not in the configuration", "id", m.ID, "err", err)
			return
		}
		n.logger.Info("forgot addresses of a node not in the configuration", "id", m.ID)
	}
}

// pruneEventsTask proposes the retention cutoff every cleanup interval
// (hourly by default, dropping events older than 24h).
func (n *Node) pruneEventsTask(ctx context.Context) {
	t := time.NewTicker(n.cfg.Events.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.pruneEvents(ctx, time.Now().Add(-n.cfg.Events.Retention))
		}
	}
}

func (n *Node) pruneEvents(ctx context.Context, cutoff time.Time) {
	total := 0
	for {
		cmd, err := command.PruneEvents(cutoff)
		if err != nil {
			n.logger.Error("encode prune command", "err", err)
			return
		}
		cmd.Actor = command.ActorRetention
		res, err := n.Propose(ctx, cmd)
		if err != nil {
			n.logger.Warn("event pruning failed; retrying next interval", "err", err)
			return
		}
		total += int(res.GetRevision())
		if res.GetRevision() < store.MaxPrunePerBatch {
			break
		}
	}
	if total > 0 {
		n.logger.Info("pruned events", "count", total, "cutoff", cutoff.UTC().Format(time.RFC3339))
	}
}
