package raftnode

import (
	"time"

	"github.com/policyd/policyd/internal/third_party/raft"
)

// A node removed from the cluster has nothing current to serve: raft stops
// it campaigning once its configuration no longer holds it (a voter only
// campaigns while it has a vote), and removedLoop makes the rest of the
// node follow: /readyz answers 503, its sidecar streams are closed with the
// "try another node" refusal the staleness bound uses, new ones are
// refused, and it says so once at WARN. A node joined again (the same data
// dir and cluster) serves again.

// removedCheckInterval is how often the configuration is looked at.
const removedCheckInterval = 250 * time.Millisecond

// notMemberMemory is how long a peer's word that this node is not a member
// counts: a removed node that keeps campaigning hears it again at each try.
const notMemberMemory = 5 * time.Second

// mayPeer is the peer plane's membership check: a node with no
// configuration yet (waiting to be joined) hears everyone; otherwise only
// the members of its configuration may open Raft and API streams.
func (n *Node) mayPeer(id string) bool {
	if !n.raftUp.Load() {
		return true // raft is starting: its configuration is not loaded yet
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return true
	}
	servers := f.Configuration().Servers
	if len(servers) == 0 {
		return true
	}
	for _, s := range servers {
		if string(s.ID) == id {
			return true
		}
	}
	return false
}

// RemovedRefusal is the refusal given to sidecars by a removed node.
const RemovedRefusal = "this node was removed from the cluster; try another node"

func (n *Node) removedLoop() {
	t := time.NewTicker(removedCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		removed := n.removedFromConfiguration()
		was := n.removed.Swap(removed)
		switch {
		case removed:
			var streams, conns int
			if n.deps.DropSidecars != nil {
				streams, conns = n.deps.DropSidecars(RemovedRefusal)
			}
			if !was {
				n.logger.Warn("this node was removed from the cluster: it no longer campaigns, /readyz answers 503 and its sidecars are sent to other nodes; "+
					"stop it, or wipe its data dir and join it again with policyd cluster join",
					"grpc_streams", streams, "ws_connections", conns)
			}
		case was:
			n.logger.Info("this node is a member of the cluster again")
		}
	}
}

// removedFromConfiguration reports whether the node has a configuration
// (it was bootstrapped or joined) that no longer names it, or whether raft
// shut itself down after a leader removed itself. The leader's last
// replication to a removed node is best effort, so the node may never see
// the entry that removes it: it then learns it from its peers, which refuse
// its Raft connections as not a member (mayPeer), while no leader speaks
// to it.
func (n *Node) removedFromConfiguration() bool {
	if n.raft.State() == raft.Shutdown {
		return n.ctx.Err() == nil
	}
	if told := n.toldNotMember.Load(); told != 0 && time.Since(time.Unix(0, told)) < notMemberMemory {
		if _, leader := n.raft.LeaderWithID(); leader == "" {
			return true
		}
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	servers := f.Configuration().Servers
	if len(servers) == 0 {
		return false // not joined yet
	}
	for _, s := range servers {
		if string(s.ID) == n.id {
			return false
		}
	}
	return true
}
