package server

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/internal/server/apierror"
)

// A node serves sidecars from its local replica, so one cut off from the
// rest of the cluster would go on serving the last state it received, and
// its sidecars would stay "ready" while revocations made on the majority
// side never reach them. setup.max_staleness bounds that: a node that is
// not the leader and has not heard from one for longer closes its sidecar
// streams and refuses new ones until it hears from a leader again. A
// sidecar with other nodes in its list moves to one that is current (the
// read-index wait there makes sure of that); one without keeps its cached
// policies for its grace period and then blocks everything.
//
// A leader counts as current: hashicorp/raft steps a leader down once it
// has not reached a quorum for raft.leader_lease_timeout. A follower counts
// as current while it knows a leader and heard from it within the bound.
// Raft's own last-contact time alone would not do: a vote granted also sets
// it, and in a minority of two the candidates could grant each other votes
// forever (without pre-vote).

// lastHeard returns when this node last knew the cluster's state, given
// the previous answer: now while it leads, the last contact from the
// leader while it knows one, otherwise the previous answer.
func lastHeard(prev, now time.Time, leading, leaderKnown bool, lastContact time.Time) time.Time {
	switch {
	case leading:
		return now
	case leaderKnown && lastContact.After(prev):
		return lastContact
	default:
		return prev
	}
}

// stalenessLoop closes the sidecar streams of a node that has not heard
// from a leader for setup.max_staleness, and keeps n.stale, which refuses
// new ones, up to date. It checks four times per bound, so a stream is
// closed at most a quarter bound late.
func (n *Node) stalenessLoop() {
	bound := n.cfg.Setup.MaxStaleness
	t := time.NewTicker(max(bound/4, 10*time.Millisecond))
	defer t.Stop()
	// Start-up counts as contact: a node that has just started has had no
	// chance to hear a leader yet. A restart cut off from the cluster thus
	// serves its local state for at most one bound, as a running node does.
	heard := time.Now()
	for {
		var now time.Time
		select {
		case <-n.ctx.Done():
			return
		case now = <-t.C:
		}
		heard = lastHeard(heard, now, n.IsLeader(), n.LeaderID() != "", n.LastContact())
		silent := now.Sub(heard)
		stale := silent > bound
		was := n.stale.Swap(stale)
		switch {
		case stale:
			// Every tick, not only the first: a stream may have been
			// set up just before the flag was raised.
			msg := fmt.Sprintf("this node has not heard from a Raft leader for %v; try another node", silent.Round(time.Millisecond))
			streams, conns := n.discovery.DropAll(msg), n.feed.DropAll(msg)
			if !was || streams+conns > 0 {
				n.logger.Warn("lost the cluster: closed sidecar streams and refusing new ones",
					"silent", silent.Round(time.Millisecond), "max_staleness", bound, "grpc_streams", streams, "ws_connections", conns)
			}
		case was:
			n.logger.Info("in contact with a leader again: serving sidecars")
		}
	}
}

// errStale is the refusal given to a sidecar while the node is stale.
const errStale = "this node has not heard from a Raft leader for longer than setup.max_staleness; try another node"

// refusal is why the node refuses new sidecars now, "" if it does not:
// the Raft owner's reasons (removed, a data dir of another cluster), then
// staleness.
func (n *Node) refusal() string {
	if msg := n.Refusal(); msg != "" {
		return msg
	}
	if n.stale.Load() {
		return errStale
	}
	return ""
}

// refuseWhenStaleHTTP refuses the WebSocket feed's handshake with 503 (and
// Retry-After) while the node is stale.
func (n *Node) refuseWhenStaleHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := n.refusal(); msg != "" {
			apierror.Write(w, http.StatusServiceUnavailable, apierror.CodeUnavailable, msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseWhenStaleGRPC refuses the given stream methods with Unavailable
// while the node is stale.
func (n *Node) refuseWhenStaleGRPC(methods ...string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if msg := n.refusal(); msg != "" && slices.Contains(methods, info.FullMethod) {
			return status.Error(codes.Unavailable, msg)
		}
		return handler(srv, ss)
	}
}
