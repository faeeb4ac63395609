package raftnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/server/peer"
)

// A node started on a data dir of another cluster, with its usual config,
// would lead or follow that cluster's configuration and serve its policies
// to sidecars: its peers refuse it at the handshake, but its own state
// looks sound. So a node with raft.peers asks them their cluster ID, at
// start and every peerClusterInterval, and sooner when a peer's connection
// is refused for a mismatch. When a majority of the configured members
// (this node counted) answer with one cluster ID that is not this data
// dir's, the data dir is the foreign one: /readyz answers 503 naming both
// IDs and the way out, sidecars are refused and closed with "try another
// node", and it says so once at ERROR, until the process restarts. Only a
// majority decides, so the members of the right cluster never take
// themselves for the foreign one.
//
// Until the first round of answers is in, the node is not ready and
// refuses sidecars, so that it never serves them a set before it knows.
// Peers that cannot be reached do not count: a node restarted while its
// whole cluster is down serves its data, as it would without the check.

const (
	// peerClusterInterval is how often the configured peers are asked.
	peerClusterInterval = 10 * time.Second
	// peerClusterMinGap bounds how often a refused connection makes the
	// node ask again: peers retry their connections many times a second.
	peerClusterMinGap = time.Second
	// peerClusterTimeout bounds one question to one peer; a peer that
	// does not answer within it does not count.
	peerClusterTimeout = 2 * time.Second
)

// CheckingRefusal is the refusal given to sidecars while the node has not
// yet heard its configured peers' cluster IDs.
const CheckingRefusal = "this node is checking its data dir's cluster ID with its raft.peers; try another node"

// foreignDataError is why a node whose data dir belongs to another cluster
// than its configured peers' serves nothing.
type foreignDataError struct {
	node, dataDir string
	cluster       string // this data dir's
	peersCluster  string
	peers         []config.Peer // the configured peers that answered peersCluster
}

func (e *foreignDataError) peerList() string {
	parts := make([]string, len(e.peers))
	for i, p := range e.peers {
		parts[i] = fmt.Sprintf("%s (%s)", p.Address, p.ID)
	}
	return strings.Join(parts, ", ")
}

// recovery is the way out, in the words of docs/operations.md.
func (e *foreignDataError) recovery() string {
	return fmt.Sprintf("point data_dir at this node's data dir of cluster %s, or wipe it and join the node again "+
		"(policyd cluster remove %s, start it on an empty data dir with raft.bootstrap false, then policyd cluster join --id %s)",
		e.peersCluster, e.node, e.node)
}

func (e *foreignDataError) Error() string {
	return fmt.Sprintf("this data dir (%s) belongs to cluster %s but the peers at %s are cluster %s: %s",
		e.dataDir, e.cluster, e.peerList(), e.peersCluster, e.recovery())
}

func (e *foreignDataError) Unavailable() bool { return true }

// refusal is what sidecars are told.
func (e *foreignDataError) refusal() string {
	return fmt.Sprintf("this node's data dir belongs to cluster %s, not to its peers' cluster %s; try another node", e.cluster, e.peersCluster)
}

// Refusal is why this node refuses sidecars now, "" if it serves them: it
// was removed from the cluster, its data dir belongs to another cluster
// than its peers', or it has not heard its peers' cluster IDs yet.
func (n *Node) Refusal() string {
	if n.removed.Load() {
		return RemovedRefusal
	}
	if e := n.foreign.Load(); e != nil {
		return e.refusal()
	}
	if !n.peersChecked.Load() {
		return CheckingRefusal
	}
	return ""
}

// otherPeers is raft.peers without this node, and how many members
// raft.peers and this node make together.
func (n *Node) otherPeers() (others []config.Peer, members int) {
	for _, p := range n.cfg.Raft.Peers {
		if p.ID != n.id {
			others = append(others, p)
		}
	}
	return others, len(others) + 1
}

// peerMismatch is the peer plane's report of a connection refused for a
// cluster-ID mismatch: the peers are asked again soon. The node reports the
// mismatch itself, once, while it does not know yet, once it knows its
// data dir is the foreign one, and when the dialler is one of its
// raft.peers; the mux reports the rest.
func (n *Node) peerMismatch(mm *peer.ClusterMismatchError) bool {
	select {
	case n.askPeers <- struct{}{}:
	default:
	}
	if n.foreign.Load() != nil || !n.peersChecked.Load() {
		return true
	}
	others, _ := n.otherPeers()
	return slices.ContainsFunc(others, func(p config.Peer) bool { return p.ID == mm.RemoteNode })
}

// peerClusterLoop asks the configured peers their cluster ID until the
// data dir is found foreign or the node stops.
func (n *Node) peerClusterLoop() {
	defer n.peersChecked.Store(true)
	others, members := n.otherPeers()
	t := time.NewTicker(peerClusterInterval)
	defer t.Stop()
	var reported string // the peers of other clusters last logged
	for {
		asked := time.Now()
		own, answers := n.askPeerClusters(others)
		if cluster, peers := foreignVerdict(own, members, answers); cluster != "" {
			n.becomeForeign(&foreignDataError{node: n.id, dataDir: n.cfg.DataDir, cluster: own, peersCluster: cluster, peers: peers})
			return
		}
		n.peersChecked.Store(true)
		if s := strayPeers(own, answers); s != reported {
			if s != "" {
				n.logger.Error("peers in raft.peers hold the data of another cluster and are refused; "+
					"wipe their data dir and join them again (policyd cluster remove, then policyd cluster join)",
					"cluster", own, "peers", s)
			}
			reported = s
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.askPeers:
			gap := time.NewTimer(peerClusterMinGap - time.Since(asked))
			select {
			case <-n.ctx.Done():
				gap.Stop()
				return
			case <-gap.C:
			}
		}
	}
}

// peerAnswer is the cluster ID a configured peer answered with.
type peerAnswer struct {
	peer    config.Peer
	cluster string
}

// askPeerClusters returns this data dir's cluster ID and the answers of
// others, asked together; none while the data dir has no cluster ID yet,
// since it then belongs to no other cluster.
func (n *Node) askPeerClusters(others []config.Peer) (string, []peerAnswer) {
	own := n.ClusterID()
	if own == "" {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, peerClusterTimeout)
	defer cancel()
	answers := make([]peerAnswer, len(others))
	var wg sync.WaitGroup
	for i, p := range others {
		wg.Go(func() { answers[i] = peerAnswer{peer: p, cluster: n.askCluster(ctx, p)} })
	}
	wg.Wait()
	return own, answers
}

// askCluster returns the cluster ID of the peer, "" if it does not answer
// as the node raft.peers names there or has no cluster ID yet.
func (n *Node) askCluster(ctx context.Context, p config.Peer) string {
	c, info, err := n.peerCfg.Dial(ctx, p.Address, peer.KindProbe)
	var mm *peer.ClusterMismatchError
	switch {
	case errors.As(err, &mm):
		if mm.RemoteNode == p.ID {
			return mm.Remote
		}
		return ""
	case err != nil:
		n.logger.Debug("ask a peer its cluster ID", "peer", p.ID, "addr", p.Address, "err", err)
		return ""
	}
	_ = c.Close()
	if info.NodeID != p.ID {
		return ""
	}
	return info.ClusterID
}

// foreignVerdict returns the cluster ID that answers from more than half of
// members (the configured peers and this node) name, if it is not own, and
// the peers that named it; "" otherwise.
func foreignVerdict(own string, members int, answers []peerAnswer) (string, []config.Peer) {
	by := map[string][]config.Peer{}
	for _, a := range answers {
		if a.cluster != "" && a.cluster != own {
			by[a.cluster] = append(by[a.cluster], a.peer)
		}
	}
	for cluster, peers := range by {
		if 2*len(peers) > members {
			return cluster, peers
		}
	}
	return "", nil
}

// strayPeers lists the peers that answered with another cluster ID than
// own, "" if none.
func strayPeers(own string, answers []peerAnswer) string {
	var parts []string
	for _, a := range answers {
		if a.cluster != "" && a.cluster != own {
			parts = append(parts, fmt.Sprintf("%s (%s): cluster %s", a.peer.Address, a.peer.ID, a.cluster))
		}
	}
	return strings.Join(parts, ", ")
}

// becomeForeign takes the node out of service for good: the state is set
// before the sidecars are closed, and the sidecar doors check it as they
// register a stream, so none is served after this.
func (n *Node) becomeForeign(e *foreignDataError) {
	if !n.foreign.CompareAndSwap(nil, e) {
		return
	}
	var streams, conns int
	if n.deps.DropSidecars != nil {
		streams, conns = n.deps.DropSidecars(e.refusal())
	}
	n.logger.Error("this data dir belongs to another cluster than the peers in raft.peers: /readyz answers 503 and sidecars are sent to other nodes",
		"data_dir", e.dataDir, "cluster", e.cluster, "peers_cluster", e.peersCluster, "peers", e.peerList(),
		"grpc_streams", streams, "ws_connections", conns, "recovery", e.recovery())
}
