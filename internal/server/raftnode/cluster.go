package raftnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/grpccodec"
	"github.com/policyd/policyd/internal/server/peer"
	"github.com/policyd/policyd/internal/store"
)

// Membership errors wrap the sentinels every listener already maps: a bad
// request is policy.ErrInvalid (400), an address taken by another node is
// store.ErrConflict (409).
var (
	errInvalidJoin  = fmt.Errorf("invalid join request: %w", policy.ErrInvalid)
	errJoinConflict = fmt.Errorf("conflicting member: %w", store.ErrConflict)
)

// clusterService is the internal API other nodes call on the leader.
type clusterService struct {
	clusterv1.UnimplementedClusterServer
	n *Node
}

func (s *clusterService) Apply(ctx context.Context, req *clusterv1.ApplyRequest) (*clusterv1.ApplyResponse, error) {
	if req.GetCommand() == nil {
		return nil, toStatus(fmt.Errorf("%w: no command", errInvalidJoin))
	}
	if s.n.raft.State() != raft.Leader {
		return nil, toStatus(ErrNotLeader)
	}
	// The one decode of a forwarded payload on the leader.
	c, err := command.Decode(req.GetCommand())
	if err != nil {
		return nil, toStatus(fmt.Errorf("%w: %w", errInvalidCommand, err))
	}
	res, err := s.n.applyLocal(ctx, c, true)
	if err != nil {
		return nil, toStatus(err)
	}
	return &clusterv1.ApplyResponse{Result: res}, nil
}

func (s *clusterService) ReadIndex(ctx context.Context, _ *clusterv1.ReadIndexRequest) (*clusterv1.ReadIndexResponse, error) {
	idx, err := s.n.leaderReadIndex(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &clusterv1.ReadIndexResponse{Index: idx}, nil
}

func (s *clusterService) Join(ctx context.Context, req *clusterv1.JoinRequest) (*clusterv1.JoinResponse, error) {
	if s.n.raft.State() != raft.Leader {
		return nil, toStatus(ErrNotLeader)
	}
	idx, err := s.n.joinLocal(ctx, req.GetId(), req.GetRaftAddr())
	if err != nil {
		return nil, toStatus(err)
	}
	return &clusterv1.JoinResponse{Index: idx}, nil
}

func (s *clusterService) Remove(ctx context.Context, req *clusterv1.RemoveRequest) (*clusterv1.RemoveResponse, error) {
	if s.n.raft.State() != raft.Leader {
		return nil, toStatus(ErrNotLeader)
	}
	idx, err := s.n.removeLocal(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &clusterv1.RemoveResponse{Index: idx}, nil
}

// Join adds a voter with the given Raft address, through the leader. Joining
// again with the same ID and address is a no-op.
func (n *Node) Join(ctx context.Context, id, raftAddr string) (uint64, error) {
	if err := checkMember(id, raftAddr); err != nil {
		return 0, err
	}
	var idx uint64
	err := n.withLeader(ctx, func(ctx context.Context, leader bool, c clusterv1.ClusterClient) error {
		if leader {
			var err error
			idx, err = n.joinLocal(ctx, id, raftAddr)
			return err
		}
		resp, err := c.Join(ctx, &clusterv1.JoinRequest{Id: id, RaftAddr: raftAddr})
		if err != nil {
			return fromStatus(err)
		}
		idx = resp.GetIndex()
		return nil
	})
	return idx, err
}

// checkMember validates a member's id and Raft address, on every path that
// adds one (REST, the peer plane).
func checkMember(id, raftAddr string) error {
	if !config.ValidNodeID(id) {
		return fmt.Errorf("%w: id %q is not a valid node id", errInvalidJoin, id)
	}
	host, port, err := net.SplitHostPort(raftAddr)
	if err != nil || host == "" || port == "" || port == "0" || len(raftAddr) > 255 {
		return fmt.Errorf("%w: raft_addr %q is not host:port", errInvalidJoin, raftAddr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%w: raft_addr %q is not an address others can dial", errInvalidJoin, raftAddr)
	}
	return nil
}

// joinProbeTimeout bounds the check that a new member answers.
const joinProbeTimeout = 5 * time.Second

// probeMember checks that the node at addr answers the peer handshake as
// id and does not hold another cluster's state: a voter that cannot be
// reached, or that refuses this cluster, would only cost the cluster its
// quorum.
func (n *Node) probeMember(ctx context.Context, id, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, joinProbeTimeout)
	defer cancel()
	// A node started a moment before the join (policyd serve … & then
	// policyd cluster join) may not listen yet: wait for it a little.
	retry := backoff.New(50*time.Millisecond, 500*time.Millisecond, false)
	c, info, err := n.peerCfg.Dial(ctx, addr, peer.KindProbe)
	for errors.Is(err, syscall.ECONNREFUSED) && retry.Wait(ctx) {
		c, info, err = n.peerCfg.Dial(ctx, addr, peer.KindProbe)
	}
	if err != nil {
		var mm *peer.ClusterMismatchError
		if errors.As(err, &mm) {
			return fmt.Errorf("%w: node %q at %s holds the state of cluster %s, not %s: wipe its data dir before it joins",
				errJoinConflict, mm.RemoteNode, addr, mm.Remote, mm.Local)
		}
		return fmt.Errorf("%w: raft_addr %s does not answer as a member of this cluster: %w", errInvalidJoin, addr, err)
	}
	_ = c.Close()
	if info.NodeID != id {
		return fmt.Errorf("%w: raft_addr %s is node %q, not %q", errInvalidJoin, addr, info.NodeID, id)
	}
	return nil
}

func (n *Node) joinLocal(ctx context.Context, id, addr string) (uint64, error) {
	if err := checkMember(id, addr); err != nil {
		return 0, err
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, fmt.Errorf("read configuration: %w", err)
	}
	for _, s := range f.Configuration().Servers {
		switch {
		case string(s.ID) == id && string(s.Address) == addr:
			n.logger.Info("join: already a member", "id", id, "raft_addr", addr)
			return 0, nil
		case string(s.ID) != id && string(s.Address) == addr:
			return 0, fmt.Errorf("%w: address %s is used by member %q", errJoinConflict, addr, s.ID)
		}
	}
	if err := n.probeMember(ctx, id, addr); err != nil {
		return 0, err
	}
	af := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, n.cfg.Raft.ApplyTimeout)
	if err := af.Error(); err != nil {
		return 0, raftErr("add voter", err)
	}
	n.logger.Info("member joined", "id", id, "raft_addr", addr, "index", af.Index())
	return af.Index(), nil
}

// Remove removes a server from the Raft configuration and forgets its
// addresses, through the leader.
func (n *Node) Remove(ctx context.Context, id string) (uint64, error) {
	var idx uint64
	err := n.withLeader(ctx, func(ctx context.Context, leader bool, c clusterv1.ClusterClient) error {
		if leader {
			var err error
			idx, err = n.removeLocal(ctx, id)
			return err
		}
		resp, err := c.Remove(ctx, &clusterv1.RemoveRequest{Id: id})
		if err != nil {
			return fromStatus(err)
		}
		idx = resp.GetIndex()
		return nil
	})
	return idx, err
}

// removeLocal runs on the leader. The member record goes first, while this
// node surely leads: after RemoveServer it may not (it may have removed
// itself). If RemoveServer then fails, the node is still a voter and its
// register loop records its addresses again.
func (n *Node) removeLocal(ctx context.Context, id string) (uint64, error) {
	if !n.InConfiguration(id) {
		return 0, fmt.Errorf("member %q: %w", id, store.ErrNotFound)
	}
	if err := n.forgetMember(ctx, id); err != nil {
		return 0, err
	}
	rf := n.raft.RemoveServer(raft.ServerID(id), 0, n.cfg.Raft.ApplyTimeout)
	if err := rf.Error(); err != nil {
		return 0, raftErr("remove server", err)
	}
	n.logger.Info("member removed", "id", id, "index", rf.Index())
	// The removed node may have re-registered between the two steps; now
	// that it is out of the configuration, the leader refuses it for good.
	if _, err := n.store.Member(id); err == nil && n.IsLeader() {
		if err := n.forgetMember(ctx, id); err != nil {
			n.logger.Warn("forget addresses of removed member", "id", id, "err", err)
		}
	}
	return rf.Index(), nil
}

// forgetMember deletes the member record (addresses) of id, through this
// node, which must lead.
func (n *Node) forgetMember(ctx context.Context, id string) error {
	cmd, err := command.RemoveMember(id)
	if err != nil {
		return err
	}
	if _, err := n.applyLocal(ctx, cmd, false); err != nil {
		return fmt.Errorf("forget addresses of %q: %w", id, err)
	}
	return nil
}

func raftErr(op string, err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost):
		return ErrNotLeader
	case errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrRaftShutdown):
		return &unavailableError{msg: op + ": " + err.Error()}
	default:
		return fmt.Errorf("%s: %w", op, err)
	}
}

// Status is the cluster as one node sees it.
type Status struct {
	NodeID, ClusterID, State, LeaderID, LeaderAddr string
	Term, CommitIndex, LastIndex, AppliedIndex     uint64
	// LastContact is how long ago the leader was heard from: "" on the
	// leader, "never" if it never was.
	LastContact string
	Digest      string
	// CommandVersion is the command encoding writes use (commandVersion).
	CommandVersion uint32
	Members        []Member
}

// Member is one server in the Raft configuration, with the addresses it
// registered.
type Member struct {
	ID, RaftAddr, HTTPAddr, GRPCAddr, Suffrage string
	Leader                                     bool
	// CommandVersion is what the member registered; 0 before versions.
	CommandVersion uint32
}

// Status describes the cluster as this node sees it.
func (n *Node) Status(ctx context.Context) (*Status, error) {
	leaderAddr, leaderID := n.raft.LeaderWithID()
	digest, idx, err := n.store.Digest()
	if err != nil {
		return nil, err
	}
	st := &Status{
		NodeID:       n.id,
		ClusterID:    n.ClusterID(),
		State:        n.raft.State().String(),
		LeaderID:     string(leaderID),
		LeaderAddr:   string(leaderAddr),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		LastIndex:    n.raft.LastIndex(),
		AppliedIndex: idx,
		Digest:       digest,
		LastContact:  lastContact(n.raft),
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	members, err := n.store.Members()
	if err != nil {
		return nil, err
	}
	byID := map[string]store.Member{}
	for _, m := range members {
		byID[m.ID] = m
	}
	st.CommandVersion = commandVersion(members)
	for _, s := range f.Configuration().Servers {
		m := byID[string(s.ID)]
		st.Members = append(st.Members, Member{
			ID:       string(s.ID),
			RaftAddr: string(s.Address),
			HTTPAddr: m.HTTPAddr,
			GRPCAddr: m.GRPCAddr,
			Suffrage: s.Suffrage.String(),
			Leader:   s.ID == leaderID,

			CommandVersion: m.CommandVersion,
		})
	}
	return st, nil
}

func lastContact(r *raft.Raft) string {
	if r.State() == raft.Leader {
		return ""
	}
	t := r.LastContact()
	if t.IsZero() {
		return "never"
	}
	return time.Since(t).Round(time.Millisecond).String()
}

// LocalClients is the proxystatus view's (Deps.LocalClients).
func (s *clusterService) LocalClients(ctx context.Context, req *clusterv1.LocalClientsRequest) (*clusterv1.LocalClientsResponse, error) {
	if s.n.deps.LocalClients == nil {
		return &clusterv1.LocalClientsResponse{NodeId: s.n.id}, nil
	}
	return s.n.deps.LocalClients(ctx, req)
}

// peerQueryTimeout bounds how long a cluster-wide view waits for one member.
const peerQueryTimeout = 2 * time.Second

// peerQueryContext bounds one member's call: by ctx's own deadline when the
// caller set one (an impact replay is given its time limit), else by
// peerQueryTimeout.
func peerQueryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, peerQueryTimeout)
}

// newPeerServer is the node-to-node API's gRPC server, on the peer plane
// only (docs/security.md).
func newPeerServer(s clusterv1.ClusterServer, opts []grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(append(grpccodec.New(encoding.GetCodecV2(protoenc.Name)).ServerOptions(), opts...)...)
	clusterv1.RegisterClusterServer(srv, s)
	return srv
}

// AskMembers asks every other member of the Raft configuration over the
// peer API, for a cluster-wide view: ask runs once per member, in parallel
// and each within peerQueryContext's bound, and AskMembers returns once
// every call has. The members whose call failed (what names the question
// in the log) come back sorted.
func (n *Node) AskMembers(ctx context.Context, what string, ask func(ctx context.Context, c clusterv1.ClusterClient) error) ([]string, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	type answer struct {
		id  string
		err error
	}
	var asks []string
	addrs := map[string]string{}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) != n.id {
			asks = append(asks, string(srv.ID))
			addrs[string(srv.ID)] = string(srv.Address)
		}
	}
	answers := make(chan answer, len(asks))
	for _, id := range asks {
		go func() {
			ctx, cancel := peerQueryContext(ctx)
			defer cancel()
			c, err := n.peers.client(addrs[id])
			if err != nil {
				answers <- answer{id: id, err: err}
				return
			}
			answers <- answer{id: id, err: ask(ctx, c)}
		}()
	}
	var unreachable []string
	for range asks {
		if a := <-answers; a.err != nil {
			n.logger.Debug("member did not "+what, "member", a.id, "err", a.err)
			unreachable = append(unreachable, a.id)
		}
	}
	slices.Sort(unreachable)
	return unreachable, nil
}
