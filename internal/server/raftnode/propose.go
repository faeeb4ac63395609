package raftnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/store"
)

// unavailableError marks errors that mean "the cluster could not take this
// request now; retry later". Listeners map any error with an Unavailable
// method to 503 / codes.Unavailable.
type unavailableError struct{ msg string }

func (e *unavailableError) Error() string     { return e.msg }
func (e *unavailableError) Unavailable() bool { return true }

// Sentinel errors.
var (
	// ErrNoLeader is returned when no leader is known or reachable within
	// the leader wait. The request was not applied.
	ErrNoLeader error = &unavailableError{msg: "no leader is reachable"}
	// ErrNotLeader is returned by leader-only operations on a follower; Propose
	// and ConsistentRead retry it by finding the current leader.
	ErrNotLeader = errors.New("not the leader")
	// ErrAmbiguous is returned when a write was handed to Raft but its outcome
	// is unknown (leadership lost, timeout): it may or may not be applied.
	ErrAmbiguous error = &unavailableError{msg: "write outcome unknown: it may or may not have been applied"}
)

// leaderWait is how long a request waits for a leader to appear before it
// fails with ErrNoLeader: a heartbeat timeout for followers to notice a dead
// leader, plus three election timeouts for an ordinary election (4s with the
// defaults).
func (n *Node) leaderWait() time.Duration {
	return n.cfg.Raft.HeartbeatTimeout + 3*n.cfg.Raft.ElectionTimeout
}

// Propose commits c through the leader, forwarding it if this node is a
// follower, and returns the FSM's result. A business error (conflict, not
// found) is in the result (see command.ResultErr); the error is about
// getting the command committed.
func (n *Node) Propose(ctx context.Context, c *command.Command) (*commandv1.Result, error) {
	if c.OriginatedAtUnixNano == 0 {
		c.OriginatedAtUnixNano = time.Now().UnixNano()
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Forward.Timeout)
	defer cancel()
	var res *commandv1.Result
	err := n.withLeader(ctx, func(ctx context.Context, leader bool, cc clusterv1.ClusterClient) error {
		if leader {
			var err error
			res, err = n.applyLocal(ctx, c, false)
			return err
		}
		env, refused, err := n.forLeader(c)
		if refused != nil || err != nil {
			res = refused
			return err
		}
		resp, err := cc.Apply(ctx, &clusterv1.ApplyRequest{Command: env})
		if err != nil {
			return fromStatus(err)
		}
		res = resp.GetResult()
		return nil
	})
	if err == nil {
		n.acked.raise(res.GetIndex())
	}
	return res, err
}

// forLeader is c as the leader reads it. The leader may run an older
// release, which knows neither this release's encodings nor, before
// RolloutVersion, its refusals: so c is written for the oldest member, and
// refused here if that member cannot apply it. The leader's own checks are
// admit's.
func (n *Node) forLeader(c *command.Command) (*commandv1.Command, *commandv1.Result, error) {
	c, refused, err := n.forMembers(c)
	if refused != nil || err != nil {
		return nil, refused, err
	}
	env, err := command.Encode(c)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errInvalidCommand, err)
	}
	return env, nil, nil
}

// withLeader runs fn against the current leader: locally (leader true) or
// through a cluster client to it. It retries only while no leader is known
// or the addressed node said it is not the leader, which both mean fn had no
// effect, for up to leaderWait.
func (n *Node) withLeader(ctx context.Context, fn func(ctx context.Context, leader bool, c clusterv1.ClusterClient) error) error {
	deadline := time.Now().Add(n.leaderWait())
	retry := backoff.New(10*time.Millisecond, 250*time.Millisecond, false)
	for {
		err := n.tryLeader(ctx, fn)
		if err == nil || !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrNoLeader) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (%w)", ErrNoLeader, err)
		}
		if !retry.Wait(ctx) {
			return fmt.Errorf("%w (%w)", ErrNoLeader, ctx.Err())
		}
	}
}

func (n *Node) tryLeader(ctx context.Context, fn func(ctx context.Context, leader bool, c clusterv1.ClusterClient) error) error {
	if n.raft.State() == raft.Leader {
		return fn(ctx, true, nil)
	}
	leaderAddr, leaderID := n.raft.LeaderWithID()
	if leaderID == "" {
		return ErrNoLeader
	}
	if string(leaderID) == n.id {
		// We just lost leadership; wait for the next leader.
		return ErrNotLeader
	}
	c, err := n.peers.client(string(leaderAddr))
	if err != nil {
		return err
	}
	return fn(ctx, false, c)
}

// ProposeLocal commits c on this node, which must lead: it never
// forwards, and answers ErrNotLeader on a follower.
func (n *Node) ProposeLocal(ctx context.Context, c *command.Command) (*commandv1.Result, error) {
	if !n.IsLeader() {
		return nil, ErrNotLeader
	}
	return n.applyLocal(ctx, c, false)
}

// applyLocal proposes c on this node, which must be the leader, once admit
// has passed it; forwarded says it came from another node.
func (n *Node) applyLocal(ctx context.Context, c *command.Command, forwarded bool) (*commandv1.Result, error) {
	data, stamped, refused, err := n.admit(c, forwarded)
	if refused != nil || err != nil {
		return refused, err
	}
	forget := func() {}
	if forwarded {
		// Decoded once, from the forward: the apply here takes that
		// command. A command this node built stays its proposer's, so its
		// entry is decoded at apply, as on every other node.
		forget = n.fsm.Decoded(data, stamped)
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Raft.ApplyTimeout)
	defer cancel()
	f := n.raft.Apply(data, n.cfg.Raft.ApplyTimeout)
	// The waiter ends once raft answers, which it also does at shutdown
	// (internal/third_party/raft), so a caller that gave up leaves nothing behind.
	done := make(chan error, 1)
	go func() {
		err := f.Error() // after the FSM applied the entry, if it did
		forget()
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrAmbiguous, ctx.Err())
	}
	switch {
	case err == nil:
	case errors.Is(err, raft.ErrNotLeader):
		return nil, ErrNotLeader // rejected before it was appended
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return nil, &unavailableError{msg: "raft is overloaded: " + err.Error()}
	default:
		// Leadership lost, or raft shut down, which answers a queued or
		// appended entry too (internal/third_party/raft): "never queued" and "maybe
		// committed" look the same from here.
		return nil, fmt.Errorf("%w: %w", ErrAmbiguous, err)
	}
	res, ok := f.Response().(*commandv1.Result)
	if !ok || res == nil {
		return nil, fmt.Errorf("entry %d produced no result", f.Index())
	}
	return res, nil
}

// admit is the leader's one check of a command before it enters the log,
// and its encoding: a forwarded command must pass the content rules the
// REST edge applies (vetCommand), since its sender may be buggy or hostile;
// a removed node may not register again; the audit fields must be well
// formed; nothing may enter that every replica would stop on
// (raftfsm.Check); and the command is written for the oldest member, or
// refused as a conflict if that member cannot apply it. The leader stamps
// the processed time, so the event log follows one clock. It returns the
// entry's bytes and the command they encode.
func (n *Node) admit(c *command.Command, forwarded bool) ([]byte, *command.Command, *commandv1.Result, error) {
	if forwarded {
		if err := n.vetCommand(c); err != nil {
			return nil, nil, nil, err
		}
	}
	if reg := c.Body.GetRegisterMember(); reg != nil && !n.InConfiguration(reg.GetId()) {
		return nil, nil, nil, fmt.Errorf("register member %q: %w", reg.GetId(), errNotMember)
	}
	if err := command.CheckEnvelope(c); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", errInvalidCommand, err)
	}
	c, refused, err := n.forMembers(c)
	if refused != nil || err != nil {
		return nil, nil, refused, err
	}
	if err := raftfsm.Check(c); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", errInvalidCommand, err)
	}
	stamped := *c
	stamped.ProcessedAtUnixNano = time.Now().UnixNano()
	data, err := command.Marshal(&stamped)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", errInvalidCommand, err)
	}
	return data, &stamped, nil, nil
}

var errNotMember = errors.New("not a member of the raft configuration")

// errInvalidCommand marks a command refused before proposing; it maps to 400
// and InvalidArgument.
var errInvalidCommand = fmt.Errorf("invalid command: %w", policy.ErrInvalid)

// forMembers is c in the newest command encoding every registered member
// reads (command.ForVersion), read from one look at the members; a command
// that member cannot apply (a rollout, a shadow policy before
// RolloutVersion) is refused as a conflict result. A node running the
// previous release registered no version and reads version 1, so until it
// is upgraded and registers again, policies and employees travel as JSON;
// likewise, until every member reads version 3, commands travel without
// actor and request id (their events record none). A node that has not
// registered yet is not counted: one joining an upgraded cluster runs this
// release or a later one.
func (n *Node) forMembers(c *command.Command) (*command.Command, *commandv1.Result, error) {
	members, err := n.store.Members()
	if err != nil {
		return nil, nil, fmt.Errorf("read member command versions: %w", err)
	}
	out, err := command.ForVersion(c, commandVersion(members))
	var nu *command.NotUpgradedError
	switch {
	case errors.As(err, &nu):
		return nil, command.ConflictResult(nu.Error()), nil
	case err != nil:
		return nil, nil, fmt.Errorf("%w: %w", errInvalidCommand, err)
	}
	return out, nil, nil
}

// commandVersion is the newest command encoding every member reads. A
// member that registered none predates command versions and reads 1.
func commandVersion(members []store.Member) uint32 {
	v := uint32(command.CommandVersion)
	for _, m := range members {
		v = min(v, max(m.CommandVersion, 1))
	}
	return v
}

// InConfiguration reports whether id is in the Raft configuration.
func (n *Node) InConfiguration(id string) bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id {
			return true
		}
	}
	return false
}

// ConsistentRead returns once this node's local state includes every write
// acknowledged before the call: the leader confirms it still leads and names
// its commit index (the read index), and this node waits until it has
// applied up to it.
func (n *Node) ConsistentRead(ctx context.Context) error {
	var idx uint64
	err := n.withLeader(ctx, func(ctx context.Context, leader bool, c clusterv1.ClusterClient) error {
		if leader {
			var err error
			idx, err = n.leaderReadIndex(ctx)
			return err
		}
		resp, err := c.ReadIndex(ctx, &clusterv1.ReadIndexRequest{})
		if err != nil {
			return fromStatus(err)
		}
		idx = resp.GetIndex()
		return nil
	})
	if err != nil {
		return err
	}
	return n.waitReadIndex(ctx, idx)
}

// maxNoopScan bounds how many log entries waitReadIndex inspects.
const maxNoopScan = 64

// waitReadIndex returns once the local state is current as of read index
// idx. The read index can name entries the FSM never receives (a new
// leader's no-op, barriers), so the store's applied index may stop short of
// it until the next write; the state is current as soon as every entry
// between the two is of such a kind.
func (n *Node) waitReadIndex(ctx context.Context, idx uint64) error {
	for {
		applied := n.store.AppliedIndex()
		if applied >= idx || n.onlyNoops(applied+1, idx) {
			return nil
		}
		// Wake on the next apply, or soon, to look at the log again: the
		// entries may not have reached this node's log yet.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		err := n.store.WaitApplied(wctx, applied+1)
		cancel()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("wait for read index %d (applied %d): %w", idx, n.store.AppliedIndex(), ctx.Err())
		}
	}
}

// onlyNoops reports whether every entry in [from, to] is in the local log
// and of a kind the FSM does not apply.
func (n *Node) onlyNoops(from, to uint64) bool {
	if to < from || to-from >= maxNoopScan || n.logStore == nil {
		return false
	}
	for i := from; i <= to; i++ {
		var l raft.Log
		if err := n.logStore.GetLog(i, &l); err != nil {
			return false
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return false
		}
	}
	return true
}

// leaderReadIndex implements the leader half of a read index: it is valid
// only once the leader has committed an entry of its own term (the barrier
// run at the start of every term), and only if a quorum still follows it
// after the index is taken.
func (n *Node) leaderReadIndex(ctx context.Context) (uint64, error) {
	term := n.raft.CurrentTerm()
	for n.readyTerm.Load() != term {
		if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
			return 0, ErrNotLeader
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("leader not ready for reads: %w", ErrNoLeader)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The commit index, not the leader's applied index: a follower may
	// apply (and serve) an entry before the leader does, and a later read
	// must not see less than an earlier one (the chaos suite caught that).
	idx := n.raft.CommitIndex()
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return 0, ErrNotLeader
	}
	if n.raft.CurrentTerm() != term {
		return 0, ErrNotLeader
	}
	return idx, nil
}

// peerPool keeps one gRPC client connection per peer's Raft address, each
// dialled through the peer plane's handshake (internal/server/peer), which also
// carries TLS: gRPC itself sees an authenticated connection.
type peerPool struct {
	mu     sync.Mutex
	closed bool // after Close, no connection is made: it would never close
	conns  map[string]*grpc.ClientConn
	dial   func(ctx context.Context, addr string) (net.Conn, error)
	opts   []grpc.DialOption
}

// errPoolClosed is a peer call made while the node shuts down: a leader
// task still finishing (a source's status, say) must not open a connection
// nothing would close. It is Unavailable, as for a peer that is down.
var errPoolClosed error = &unavailableError{msg: "the node is shutting down"}

func newPeerPool(dial func(ctx context.Context, addr string) (net.Conn, error), opts []grpc.DialOption) *peerPool {
	return &peerPool{conns: map[string]*grpc.ClientConn{}, dial: dial, opts: opts}
}

func (p *peerPool) client(addr string) (clusterv1.ClusterClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("dial peer %s: %w", addr, errPoolClosed)
	}
	if cc, ok := p.conns[addr]; ok {
		return clusterv1.NewClusterClient(cc), nil
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(p.dial)}, p.opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial peer %s: %w", addr, err)
	}
	p.conns[addr] = cc
	return clusterv1.NewClusterClient(cc), nil
}

func (p *peerPool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for a, cc := range p.conns {
		_ = cc.Close()
		delete(p.conns, a)
	}
}

// toStatus and fromStatus are the one place where node errors and gRPC codes
// meet on the internal API.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var u interface{ Unavailable() bool }
	switch {
	case errors.Is(err, ErrNotLeader):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, errNotMember):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, errInvalidJoin), errors.Is(err, errInvalidCommand):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errJoinConflict):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, store.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.As(err, &u):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
}

func fromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.FailedPrecondition:
		return ErrNotLeader
	case codes.PermissionDenied:
		return fmt.Errorf("%s: %w", st.Message(), errNotMember)
	case codes.InvalidArgument:
		return fmt.Errorf("%s: %w", st.Message(), policy.ErrInvalid)
	case codes.AlreadyExists:
		return fmt.Errorf("%s: %w", st.Message(), errJoinConflict)
	case codes.NotFound:
		return fmt.Errorf("%s: %w", st.Message(), store.ErrNotFound)
	case codes.Canceled:
		return fmt.Errorf("forwarded request: %w", context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("forwarded request: %w", context.DeadlineExceeded)
	case codes.Unavailable:
		if notSent(st.Message()) {
			// The connection was never made, so the request was not
			// sent: typically a follower still naming a leader that just
			// died. Safe to retry once a new leader is known.
			return fmt.Errorf("leader unreachable (%s): %w", st.Message(), ErrNoLeader)
		}
		// Possibly sent: the outcome is unknown from here.
		return &unavailableError{msg: "leader unreachable: " + st.Message()}
	default:
		return fmt.Errorf("leader: %s", st.Message())
	}
}

// notSent recognises grpc-go's Unavailable errors for a connection that was
// never established, as opposed to one that broke mid-call. grpc-go only
// hands a transport to calls once it has read the server's preface (its
// first SETTINGS frame), so a failure to dial, to complete TLS or to read
// that preface means no call was written. The last is what a follower sees
// for seconds after the leader is killed: its TCP connect to the dead
// leader's port can still succeed (or be reset) while nothing answers.
// Taken as "outcome unknown", these made most writes of a failover fail
// with 503 instead of waiting for the next leader.
func notSent(msg string) bool {
	return strings.Contains(msg, "Error while dialing") || strings.Contains(msg, "connection refused") ||
		strings.Contains(msg, "authentication handshake failed") || // TLS refused before any request
		strings.Contains(msg, "error reading server preface") ||
		strings.Contains(msg, "initial http2 frame from server is not a settings frame")
}
