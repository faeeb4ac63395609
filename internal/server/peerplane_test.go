package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/peer"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/store"
	"github.com/policyd/policyd/internal/tlsfiles"
)

var (
	clusterSecret = bytes.Repeat([]byte("s"), 40)
	wrongSecret   = bytes.Repeat([]byte("w"), 40)
)

// withSecret gives a node the cluster secret.
func withSecret(t *testing.T) func(*config.Config) {
	path := filepath.Join(t.TempDir(), "cluster.secret")
	if err := os.WriteFile(path, append(clusterSecret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(c *config.Config) { c.Cluster.SecretFile = path }
}

// peerDialer dials addr's peer plane as node id with the given credentials;
// nil means a plain gRPC connection with no handshake at all.
func peerClient(t *testing.T, addr string, cfg *peer.Config) clusterv1.ClusterClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if cfg != nil {
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, _, err := cfg.Dial(ctx, a, peer.KindAPI)
			return c, err
		}))
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return clusterv1.NewClusterClient(cc)
}

func secretPeer(t *testing.T, id string, secret []byte) *peer.Config {
	k, err := peer.NewKeyring(secret)
	if err != nil {
		t.Fatal(err)
	}
	return &peer.Config{NodeID: id, Keys: k, TrustDomain: "policyd"}
}

func tlsPeer(t *testing.T, id string, tc config.TLS) *peer.Config {
	r, err := tlsfiles.New(tc, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return &peer.Config{NodeID: id, TLS: r, TrustDomain: "policyd"}
}

// internalCalls calls every method of the node-to-node API once. A call
// that the receiver served returns nil or an error with a code the service
// itself answers with.
var internalCalls = []struct {
	method string
	call   func(ctx context.Context, c clusterv1.ClusterClient) error
}{
	{"Apply", func(ctx context.Context, c clusterv1.ClusterClient) error {
		typed, err := command.PutPolicy(&policy.Policy{Name: "peer.written", Kind: "ToolPolicy", Spec: []byte(`{"tool_name":"Bash","action":"deny"}`)}, nil)
		if err != nil {
			return err
		}
		cmd, err := command.Encode(typed)
		if err != nil {
			return err
		}
		_, err = c.Apply(ctx, &clusterv1.ApplyRequest{Command: cmd})
		return err
	}},
	{"ReadIndex", func(ctx context.Context, c clusterv1.ClusterClient) error {
		_, err := c.ReadIndex(ctx, &clusterv1.ReadIndexRequest{})
		return err
	}},
	{"Join", func(ctx context.Context, c clusterv1.ClusterClient) error {
		_, err := c.Join(ctx, &clusterv1.JoinRequest{Id: "../evil", RaftAddr: "127.0.0.1:1"})
		return err
	}},
	{"Remove", func(ctx context.Context, c clusterv1.ClusterClient) error {
		_, err := c.Remove(ctx, &clusterv1.RemoveRequest{Id: "nobody"})
		return err
	}},
	{"LocalClients", func(ctx context.Context, c clusterv1.ClusterClient) error {
		_, err := c.LocalClients(ctx, &clusterv1.LocalClientsRequest{})
		return err
	}},
}

// served reports whether err is an answer of the cluster service itself:
// success, or the codes its handlers use for bad requests.
func served(err error) bool {
	switch status.Code(err) {
	case codes.OK, codes.InvalidArgument, codes.NotFound:
		return true
	}
	return false
}

// TestInternalAPIOnlyOnThePeerPlane: every node-to-node method answers
// Unimplemented on the sidecar listener, is refused on the peer plane
// without credentials, with a wrong secret or a sidecar certificate of the
// cluster CA, and is served with the secret or a node certificate.
// Reflection on the sidecar listener lists only public services.
func TestInternalAPIOnlyOnThePeerPlane(t *testing.T) {
	p := newPKI(t)
	bySecret, _ := singleNode(t, func(c *config.Config) {
		withSecret(t)(c)
		jwtMode(t)(c)
	})
	byCert, _ := singleNode(t, func(c *config.Config) { c.Raft.TLS = p.node(t, c.NodeID) })

	doors := []struct {
		name   string
		client clusterv1.ClusterClient
		want   func(error) bool
		expect string
	}{
		{"sidecar listener", peerClient(t, bySecret.GRPCAddr(), nil),
			func(err error) bool { return status.Code(err) == codes.Unimplemented }, "Unimplemented"},
		{"peer plane, no handshake", peerClient(t, bySecret.RaftAddr(), nil),
			func(err error) bool { return status.Code(err) == codes.Unavailable }, "refused"},
		{"peer plane, wrong secret", peerClient(t, bySecret.RaftAddr(), secretPeer(t, "intruder", wrongSecret)),
			func(err error) bool {
				return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "secret does not match")
			}, "refused"},
		{"peer plane, sidecar certificate of the cluster CA", peerClient(t, byCert.RaftAddr(), tlsPeer(t, "sidecar", p.issue(t, "sidecar"))),
			func(err error) bool { return status.Code(err) == codes.Unavailable }, "refused"},
		{"peer plane, the secret, not a member", peerClient(t, bySecret.RaftAddr(), secretPeer(t, "stranger", clusterSecret)),
			func(err error) bool {
				return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "not a member")
			}, "refused"},
		{"peer plane, the secret", peerClient(t, bySecret.RaftAddr(), secretPeer(t, "solo", clusterSecret)), served, "served"},
		{"peer plane, a node certificate", peerClient(t, byCert.RaftAddr(), tlsPeer(t, "solo", p.node(t, "solo"))), served, "served"},
	}
	for _, door := range doors {
		for _, m := range internalCalls {
			t.Run(door.name+"/"+m.method, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				if err := m.call(ctx, door.client); !door.want(err) {
					t.Fatalf("%s: %v, want %s", m.method, err, door.expect)
				}
			})
		}
	}

	t.Run("reflection lists only public services", func(t *testing.T) {
		cc, err := grpc.NewClient(bySecret.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		stream, err := rpb.NewServerReflectionClient(cc).ServerReflectionInfo(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		slices.Sort(names)
		want := []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", "policyd.discovery.v1.PolicyDiscoveryService"}
		if !slices.Equal(names, want) {
			t.Fatalf("reflection lists %v, want %v", names, want)
		}
	})
}

// TestRaftRefusesStrangers: a Raft connection without the secret cannot
// append, vote or install a snapshot: the node's term and state do not move.
func TestRaftRefusesStrangers(t *testing.T) {
	n, _ := singleNode(t, withSecret(t))
	target := raft.ServerAddress(n.RaftAddr())
	id := raft.ServerID(n.ID())
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("stranger"), Addr: []byte("127.0.0.1:1")}
	rpcs := []struct {
		name string
		send func(tr *raft.NetworkTransport) error
	}{
		{"append entries of a later term", func(tr *raft.NetworkTransport) error {
			var resp raft.AppendEntriesResponse
			return tr.AppendEntries(id, target, &raft.AppendEntriesRequest{RPCHeader: header, Term: 1000,
				Entries: []*raft.Log{{Index: 999, Term: 1000, Type: raft.LogCommand, Data: []byte("x")}}}, &resp)
		}},
		{"request vote of a later term", func(tr *raft.NetworkTransport) error {
			var resp raft.RequestVoteResponse
			return tr.RequestVote(id, target, &raft.RequestVoteRequest{RPCHeader: header, Term: 1000, LastLogIndex: 1 << 40, LastLogTerm: 1000}, &resp)
		}},
		{"install snapshot", func(tr *raft.NetworkTransport) error {
			var resp raft.InstallSnapshotResponse
			return tr.InstallSnapshot(id, target, &raft.InstallSnapshotRequest{RPCHeader: header, SnapshotVersion: raft.SnapshotVersionMax,
				Term: 1000, LastLogIndex: 1 << 40, LastLogTerm: 1000, Size: 5}, &resp, strings.NewReader("hello"))
		}},
	}
	strangers := []struct {
		name string
		cfg  *peer.Config // nil: raft's own plain TCP transport
	}{
		{"plain TCP", nil},
		{"wrong secret", secretPeer(t, "stranger", wrongSecret)},
		{"no secret", &peer.Config{NodeID: "stranger"}},
	}
	term, last := n.consensus.Raft().CurrentTerm(), n.consensus.Raft().LastIndex()
	for _, s := range strangers {
		for _, rpc := range rpcs {
			t.Run(s.name+"/"+rpc.name, func(t *testing.T) {
				if err := rpc.send(strangerTransport(t, s.cfg)); err == nil {
					t.Fatal("the node answered")
				}
				if gotTerm, gotLast, state := n.consensus.Raft().CurrentTerm(), n.consensus.Raft().LastIndex(), n.consensus.Raft().State(); gotTerm != term || gotLast != last || state != raft.Leader {
					t.Fatalf("term %d -> %d, last index %d -> %d, state %v", term, gotTerm, last, gotLast, state)
				}
			})
		}
	}
}

func strangerTransport(t *testing.T, cfg *peer.Config) *raft.NetworkTransport {
	t.Helper()
	tc := &raft.NetworkTransportConfig{MaxPool: 1, Timeout: 5 * time.Second, Logger: raftnode.NewHCLog(testLogger(t), "stranger")}
	var tr *raft.NetworkTransport
	if cfg == nil {
		var err error
		if tr, err = raft.NewTCPTransportWithConfig("127.0.0.1:0", nil, tc); err != nil {
			t.Fatal(err)
		}
	} else {
		sl, err := raftnode.NewStreamLayer("127.0.0.1:0", nil, nil, cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		tc.Stream = sl
		tr = raft.NewNetworkTransportWithConfig(tc)
	}
	t.Cleanup(func() { tr.CloseStreams(); _ = tr.Close() })
	return tr
}

// TestLeaderVetsForwardedCommands: a peer with valid credentials and a
// forged command of invalid content is refused as the REST edge would
// refuse it, and nothing enters the log.
func TestLeaderVetsForwardedCommands(t *testing.T) {
	n, _ := singleNode(t, withSecret(t))
	c := peerClient(t, n.RaftAddr(), secretPeer(t, n.ID(), clusterSecret))
	mustCmd := func(c *command.Command, err error) *commandv1.Command {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := command.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	rawPolicy := func(p string) *commandv1.Command {
		return mustCmd(command.New(&commandv1.PutPolicy{PolicyJson: []byte(p)}))
	}
	rawEmployee := func(e string) *commandv1.Command {
		return mustCmd(command.New(&commandv1.PutEmployee{EmployeeJson: []byte(e)}))
	}
	tests := []struct {
		name string
		cmd  *commandv1.Command
		want string
	}{
		{"invalid RE2 pattern", rawPolicy(`{"name":"bad.re2","kind":"ToolPolicy","spec":{"tool_name":"Bash","action":"deny","conditions":{"patterns":["(unclosed"]}}}`), "patterns"},
		{"invalid policy name", rawPolicy(`{"name":"Bad Name","kind":"ToolPolicy","spec":{"tool_name":"Bash","action":"deny"}}`), "name"},
		{"unknown kind", rawPolicy(`{"name":"x","kind":"Nope","spec":{}}`), "kind"},
		{"unknown field", rawPolicy(`{"name":"x","kind":"ToolPolicy","spec":{"tool_name":"Bash","action":"deny"},"evil":1}`), "evil"},
		{"invalid UTF-8 in a policy", rawPolicy("{\"name\":\"x\",\"kind\":\"ToolPolicy\",\"spec\":{\"tool_name\":\"B\xffsh\",\"action\":\"deny\"}}"), "UTF-8"},
		{"employee re-activated with a bad status", rawEmployee(`{"id":"bob","org":"acme","status":"superuser"}`), "status"},
		{"employee without org", rawEmployee(`{"id":"bob"}`), "org"},
		{"delete with a bad name", mustCmd(command.DeletePolicy("../x", nil)), "name"},
		{"register a member with a bad id", mustCmd(command.RegisterMember(store.Member{ID: "../x", RaftAddr: "127.0.0.1:1"})), "node id"},
		{"register a member with a bad address", mustCmd(command.RegisterMember(store.Member{ID: "x", RaftAddr: "nowhere"})), "host:port"},
		{"rename the cluster", mustCmd(command.SetClusterID("0123456789abcdef0123456789abcdef")), "cluster ID"},
		{"oversize key", mustCmd(command.PutPolicy(&policy.Policy{Name: strings.Repeat("x", 40000), Kind: "ToolPolicy"}, nil)), "name"},
		{"unknown type", &commandv1.Command{Type: 0x7e}, "unknown command type"},
		{"truncated payload", &commandv1.Command{Type: uint32(command.TypePutPolicy), Payload: []byte{0x0a, 0x40, '{'}}, "invalid"},
		{"no command", nil, "no command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := n.consensus.Raft().LastIndex()
			_, err := c.Apply(t.Context(), &clusterv1.ApplyRequest{Command: tc.cmd})
			if got := status.Code(err); got != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply = %v (%v), want InvalidArgument naming %q", got, err, tc.want)
			}
			if after := n.consensus.Raft().LastIndex(); after != before {
				t.Fatalf("log grew from %d to %d", before, after)
			}
		})
	}
	if ps, err := n.store.ListPolicies(store.PolicyFilter{}); err != nil || len(ps) != 0 {
		t.Fatalf("stored policies %v, %v", ps, err)
	}
}

// TestJoinRefusesWhatWouldCostQuorum: a join of a bad id, a dead address,
// an address that answers as another node, or a node holding another
// cluster's state is refused; a single-node cluster keeps its quorum.
func TestJoinRefusesWhatWouldCostQuorum(t *testing.T) {
	secret := withSecret(t)
	n, a := singleNode(t, secret)
	spareCfg := testConfig(t, "spare")
	secret(&spareCfg)
	spare := startNode(t, spareCfg)
	otherCfg := testConfig(t, "other")
	otherCfg.Raft.Bootstrap = true
	secret(&otherCfg)
	other := startNode(t, otherCfg)
	poll.Eventually(t, "the other cluster named", func() error {
		if other.ClusterID() == "" || n.ClusterID() == "" {
			return errors.New("no cluster ID yet")
		}
		return nil
	}, poll.Within(15*time.Second))

	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	_ = dead.Close()

	tests := []struct {
		name, id, addr string
		want           error
		msg            string
	}{
		{"bad id", "../x", spare.RaftAddr(), policy.ErrInvalid, "not a valid node id"},
		{"unspecified address", "spare", "0.0.0.0:7000", policy.ErrInvalid, "others can dial"},
		{"dead address", "spare", deadAddr, policy.ErrInvalid, "does not answer"},
		{"address of another node id", "impostor", spare.RaftAddr(), policy.ErrInvalid, `is node "spare", not "impostor"`},
		{"node of another cluster", "other", other.RaftAddr(), store.ErrConflict, other.ClusterID()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			_, err := n.Join(ctx, tc.id, tc.addr)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Join = %v, want %v naming %q", err, tc.want, tc.msg)
			}
			if n.inConfiguration(tc.id) {
				t.Fatalf("%s is in the configuration", tc.id)
			}
			a.putPolicy(fmt.Sprintf("after.%d", n.consensus.Raft().LastIndex()), "acme", "quorum kept")
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if _, err := n.Join(ctx, "spare", spare.RaftAddr()); err != nil {
		t.Fatalf("control: join of the spare node: %v", err)
	}
}

// TestOtherClustersDataDirRefused: a member restarted on the data dir of
// another cluster is refused by the cluster, which keeps its state and
// digest, and a peer claiming the other cluster's ID is told both IDs and
// the way out.
func TestOtherClustersDataDirRefused(t *testing.T) {
	secret := withSecret(t)
	c := newCluster(t, 3, secret)
	a := apiFor(t, c.leader())
	a.putPolicy("acme.before", "acme", "x")
	c.waitConverged()
	clusterID := c.leader().ClusterID()

	// Another cluster, with a single node named like the member it will
	// replace, and state of its own.
	victim := indexOf(c, c.follower())
	otherCfg := testConfig(t, c.cfgs[victim].NodeID)
	otherCfg.Raft.Bootstrap = true
	secret(&otherCfg)
	other := startNode(t, otherCfg)
	waitLeads(t, other)
	apiFor(t, other).putPolicy("other.only", "other", "y")
	poll.Eventually(t, "the other cluster named", func() error {
		if other.ClusterID() == "" {
			return errors.New("no cluster ID yet")
		}
		return nil
	}, poll.Within(15*time.Second))

	otherID := other.ClusterID()
	closeNode(t, other)

	c.stop(victim)
	cfg := c.cfgs[victim]
	cfg.DataDir = otherCfg.DataDir
	intruder := startNode(t, cfg)
	a.putPolicy("acme.after", "acme", "x")
	leader := c.leader()
	want, _, err := leader.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.running() {
		if n == intruder {
			continue
		}
		poll.Eventually(t, "members converge", func() error {
			got, _, err := n.store.Digest()
			if err != nil || got != want {
				return fmt.Errorf("%s digest %.8s, want %.8s (%w)", n.ID(), got, want, err)
			}
			return nil
		}, poll.Within(10*time.Second))

		if _, err := n.store.GetPolicy("other.only"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s holds the other cluster's policy: %v", n.ID(), err)
		}
	}
	if _, err := intruder.store.GetPolicy("acme.after"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the intruder was replicated to: %v", err)
	}
	if got := intruder.ClusterID(); got != otherID {
		t.Fatalf("intruder's cluster ID %s, want the other cluster's %s", got, otherID)
	}

	// What the intruder hears when it dials the cluster.
	pc := secretPeer(t, intruder.ID(), clusterSecret)
	pc.ClusterID = func() string { return otherID }
	_, _, err = pc.Dial(t.Context(), leader.RaftAddr(), peer.KindRaft)
	var mm *peer.ClusterMismatchError
	if !errors.As(err, &mm) && !errors.Is(err, peer.ErrRefused) {
		t.Fatalf("dial = %v, want a cluster mismatch", err)
	}
	for _, part := range []string{clusterID, otherID, "policyd recover", "join"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("refusal %q does not name %q", err, part)
		}
	}
}

// TestClusterSecretRotation rotates the cluster secret on a running
// cluster in the three documented steps (docs/security.md), reloading each
// node as SIGHUP does: at every step writes through a follower commit and a
// peer dialling with the secret in force is admitted; at the end the old
// secret is refused.
func TestClusterSecretRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.secret")
	write := func(nodes []*Node, lines ...[]byte) {
		t.Helper()
		if err := os.WriteFile(path, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if _, _, err := n.ApplySettings(n.cfg); err != nil {
				t.Fatalf("reload %s: %v", n.ID(), err)
			}
		}
	}
	write(nil, clusterSecret)
	c := newCluster(t, 3, func(cfg *config.Config) { cfg.Cluster.SecretFile = path })
	newSecret := bytes.Repeat([]byte("n"), 48)
	steps := []struct {
		name     string
		lines    [][]byte
		admitted [][]byte
		refused  [][]byte
	}{
		{"add the new secret second", [][]byte{clusterSecret, newSecret}, [][]byte{clusterSecret, newSecret}, nil},
		{"make it first", [][]byte{newSecret, clusterSecret}, [][]byte{clusterSecret, newSecret}, nil},
		{"remove the old one", [][]byte{newSecret}, [][]byte{newSecret}, [][]byte{clusterSecret}},
	}
	for i, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			write(c.nodes, step.lines...)
			apiFor(t, c.follower()).putPolicy(fmt.Sprintf("acme.step-%d", i), "acme", "x")
			c.waitConverged()
			for _, n := range c.nodes {
				for _, s := range step.admitted {
					if err := internalCalls[4].call(t.Context(), peerClient(t, n.RaftAddr(), secretPeer(t, c.nodes[0].ID(), s))); !served(err) {
						t.Errorf("%s refused a secret in force: %v", n.ID(), err)
					}
				}
				for _, s := range step.refused {
					if _, _, err := secretPeer(t, c.nodes[0].ID(), s).Dial(t.Context(), n.RaftAddr(), peer.KindAPI); err == nil {
						t.Errorf("%s admitted a retired secret", n.ID())
					}
				}
			}
		})
	}
}

// TestPeerPlaneUnderAttack: while strangers flood the leader's peer port
// with garbage, wrong secrets and handshakes that stop half-way, and a
// member sends an oversized message, writes through a follower still
// commit everywhere and nothing of the strangers' gets in.
func TestPeerPlaneUnderAttack(t *testing.T) {
	c := newCluster(t, 3, withSecret(t))
	leader := c.leader()
	addr := leader.RaftAddr()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The strangers come from another address than the members, as on a
	// real network (every 127/8 address is this machine).
	stranger := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	// An attack's own failures (refused, reset) are what it should get;
	// only an admitted stranger is an error.
	attacks := []func() error{
		func() error { // garbage
			if conn, err := stranger.Dial("tcp", addr); err == nil {
				_, _ = conn.Write(bytes.Repeat([]byte{0xde, 0xad}, 512))
				_ = conn.Close()
			}
			return nil
		},
		func() error { // a wrong secret
			raw, err := stranger.Dial("tcp", addr)
			if err != nil {
				return nil
			}
			defer raw.Close()
			if _, _, err := secretPeer(t, "node2", wrongSecret).Client(raw, addr, peer.KindRaft); err == nil {
				return errors.New("a wrong secret was admitted")
			}
			return nil
		},
		func() error { // a handshake that stops half-way, left open
			if conn, err := stranger.Dial("tcp", addr); err == nil {
				_, _ = conn.Write([]byte("PDP1\x01"))
				go func() { <-ctx.Done(); _ = conn.Close() }()
			}
			return nil
		},
	}
	errs := make(chan error, len(attacks))
	for _, attack := range attacks {
		go func() {
			for i := 0; i < 2000 && ctx.Err() == nil; i++ {
				if err := attack(); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	a := apiFor(t, c.follower())
	for i := range 20 {
		a.putPolicy(fmt.Sprintf("acme.under-attack-%d", i), "acme", "x")
	}
	c.waitConverged()

	member := peerClient(t, addr, secretPeer(t, c.follower().ID(), clusterSecret))
	huge := &commandv1.Command{Type: uint32(command.TypePutPolicy), Payload: bytes.Repeat([]byte("x"), 5<<20)}
	before := leader.consensus.Raft().LastIndex()
	if _, err := member.Apply(t.Context(), &clusterv1.ApplyRequest{Command: huge}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized Apply = %v, want ResourceExhausted", err)
	}
	if after := leader.consensus.Raft().LastIndex(); after != before {
		t.Fatalf("log grew from %d to %d", before, after)
	}
	for range attacks {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestPeerPlaneRefusesInvalidUTF8: a member's request whose strings are not
// valid UTF-8 gets InvalidArgument naming the field, and changes nothing.
func TestPeerPlaneRefusesInvalidUTF8(t *testing.T) {
	n, _ := singleNode(t, withSecret(t))
	cfg := secretPeer(t, n.ID(), clusterSecret)
	cc, err := grpc.NewClient("passthrough:///"+n.RaftAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, _, err := cfg.Dial(ctx, a, peer.KindAPI)
			return c, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	tests := []struct {
		method, field string
		req           []byte
	}{
		{clusterv1.Cluster_Join_FullMethodName, "id", wireString(wireString(nil, 2, "127.0.0.1:1"), 1, "n\xff")},
		{clusterv1.Cluster_Join_FullMethodName, "raft_addr", wireString(wireString(nil, 1, "n9"), 2, "127.0.0.1:\xff")},
		{clusterv1.Cluster_Remove_FullMethodName, "id", wireString(nil, 1, "\xc3")},
	}
	for _, tc := range tests {
		t.Run(tc.method+"/"+tc.field, func(t *testing.T) {
			before := n.consensus.Raft().LastIndex()
			err := cc.Invoke(t.Context(), tc.method, tc.req, new(emptypb.Empty), sendRaw)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("%s = %v, want InvalidArgument naming %s", tc.method, err, tc.field)
			}
			if after := n.consensus.Raft().LastIndex(); after != before {
				t.Fatalf("log grew from %d to %d", before, after)
			}
		})
	}
}
