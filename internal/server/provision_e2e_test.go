package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
)

// These tests provision as scripts do: create the employee through a
// follower, then at once start its sidecar against that same follower, on
// a real 3-node cluster in auth.mode jwt. The follower has acknowledged the
// write but may not have applied it yet; it must serve the sidecar, not
// refuse it as unknown.

// provisionCluster is a 3-node cluster in auth.mode jwt with the release's
// raft.commit_timeout, which bounds how long a follower takes to learn of
// a commit, and a policy for org acme. It returns a follower.
func provisionCluster(t *testing.T) (*cluster, *Node) {
	t.Helper()
	jwt := jwtMode(t)
	c := newCluster(t, 3, func(cfg *config.Config) {
		jwt(cfg)
		cfg.Raft.CommitTimeout = config.Default().Raft.CommitTimeout
	})
	apiFor(t, c.leader()).put("/v1/policies/acme.all", scopedPolicy("acme.all", policy.Scope{Org: "acme"}, "deny"))
	c.waitConverged()
	return c, c.follower()
}

// provisionTransports connect a sidecar of the employee whose token is
// given to node n, and return once it holds its first set (its names), or
// fail the test. close ends the sidecar.
var provisionTransports = []struct {
	name    string
	connect func(t *testing.T, n *Node, cc *grpc.ClientConn, id, token string) (names []string, close func())
}{
	{"grpc", func(t *testing.T, _ *Node, cc *grpc.ClientConn, id, token string) ([]string, func()) {
		st := openStream(t, cc, id, policy.Scope{}, withCtx(bearer(context.Background(), token)))
		r := st.next()
		return grpcNames(r), st.close
	}},
	{"ws", func(t *testing.T, n *Node, _ *grpc.ClientConn, id, token string) ([]string, func()) {
		ws, status := feedE2EDial(t, n, token)
		if ws == nil {
			t.Fatalf("%s refused the feed connection of %s: HTTP %d", n.ID(), id, status)
		}
		m := ws.nextOf(feedv1.TypeInit)
		return feedNames(m.Policies), func() { _ = ws.ws.CloseNow() }
	}},
	{"sdk-grpc", func(t *testing.T, n *Node, _ *grpc.ClientConn, id, token string) ([]string, func()) {
		c := readySDK(t, client.Config{Servers: []string{n.GRPCAddr()}, Token: token, ClientAddress: id})
		return sdkNames(c.Client), c.stop
	}},
	{"sdk-ws", func(t *testing.T, n *Node, _ *grpc.ClientConn, id, token string) ([]string, func()) {
		c := readySDK(t, client.Config{Servers: []string{n.HTTPAddr()}, Transport: client.TransportWS, Token: token, ClientAddress: id})
		return sdkNames(c.Client), c.stop
	}},
}

// stoppableSDK is an SDK client running until stop.
type stoppableSDK struct {
	*client.Client
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned, with err
	err    error
}

func (s *stoppableSDK) stop() {
	s.cancel()
	<-s.done
}

// runSDK starts an SDK client; it is stopped when the test ends, if not
// before.
func runSDK(t *testing.T, cfg client.Config) *stoppableSDK {
	t.Helper()
	cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	c, err := client.New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &stoppableSDK{Client: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Error("SDK Run did not return")
		}
	})
	return s
}

// readySDK starts an SDK client and waits for it to be ready. Its
// UnknownIdentityGrace is as short as can be, so that any refusal of the
// identity revokes it: the node must not refuse.
func readySDK(t *testing.T, cfg client.Config) *stoppableSDK {
	t.Helper()
	cfg.UnknownIdentityGrace = time.Nanosecond
	s := runSDK(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatalf("SDK %s never ready: %v", cfg.ClientAddress, err)
	}
	return s
}

// provision creates employee id of acme through a and returns its token
// once the write is acknowledged.
func provision(t *testing.T, a *api, id string) string {
	t.Helper()
	token := signJWT(t, id, "acme", "red", time.Hour)
	a.put("/v1/employees/"+id, fmt.Appendf(nil, `{"id":%q,"org":"acme","team":"red","status":"active"}`, id))
	return token
}

// TestSidecarRightAfterEmployeeCreated: a sidecar connecting to the
// follower that has just acknowledged its employee's creation gets its
// first set, over both transports, by hand and with the SDK, every time.
func TestSidecarRightAfterEmployeeCreated(t *testing.T) {
	_, f := provisionCluster(t)
	cc, a := dialGRPC(t, f.GRPCAddr()), apiFor(t, f)
	const tries = 5
	for _, tr := range provisionTransports {
		t.Run(tr.name, func(t *testing.T) {
			for i := range tries {
				id := fmt.Sprintf("new-%s-%d", tr.name, i)
				token := provision(t, a, id)
				names, closeSidecar := tr.connect(t, f, cc, id, token)
				if want := []string{"acme.all"}; !slices.Equal(names, want) {
					t.Errorf("%s: first set %v, want %v", id, names, want)
				}
				closeSidecar()
			}
		})
	}
}

// TestSDKUnknownEmployee: an SDK whose employee never exists is retried
// for its UnknownIdentityGrace, then revoked; one whose employee is
// inactive is revoked at once, whatever the grace. Both transports.
func TestSDKUnknownEmployee(t *testing.T) {
	c, f := provisionCluster(t)
	apiFor(t, c.leader()).put("/v1/employees/idle", []byte(`{"id":"idle","org":"acme","team":"red","status":"inactive"}`))
	c.waitConverged()
	const grace = 500 * time.Millisecond
	cfgs := map[string]func(token string) client.Config{
		"grpc": func(token string) client.Config { return client.Config{Servers: []string{f.GRPCAddr()}, Token: token} },
		"ws": func(token string) client.Config {
			return client.Config{Servers: []string{f.HTTPAddr()}, Transport: client.TransportWS, Token: token}
		},
	}
	for _, name := range []string{"grpc", "ws"} {
		t.Run(name+"/never created", func(t *testing.T) {
			cfg := cfgs[name](signJWT(t, "ghost", "acme", "red", time.Hour))
			cfg.UnknownIdentityGrace = grace
			start := time.Now()
			s := runSDK(t, cfg)
			err := waitRun(t, s, grace+10*time.Second)
			took := time.Since(start)
			if !errors.Is(err, client.ErrRevoked) {
				t.Fatalf("Run = %v, want revoked", err)
			}
			if took < grace {
				t.Errorf("revoked after %v, before the grace of %v", took, grace)
			}
			t.Logf("revoked after %v: %v", took.Round(time.Millisecond), err)
		})
		t.Run(name+"/inactive", func(t *testing.T) {
			cfg := cfgs[name](signJWT(t, "idle", "acme", "red", time.Hour))
			cfg.UnknownIdentityGrace = time.Hour
			s := runSDK(t, cfg)
			if err := waitRun(t, s, 10*time.Second); !errors.Is(err, client.ErrRevoked) {
				t.Fatalf("Run = %v, want revoked at once", err)
			}
		})
	}
}

// waitRun waits up to d for s's Run to return, and returns its error.
func waitRun(t *testing.T, s *stoppableSDK, d time.Duration) error {
	t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(d):
		t.Fatalf("Run still running after %v (state %s)", d, s.State())
		return nil
	}
}

// TestMeasureProvisionToReady measures, on a follower, the time from the
// acknowledged write of a new employee to its sidecar holding its first
// set (first snapshot, feed init, SDK ready), per transport. Tries per
// transport: POLICYD_PROVISION_TRIES (default 5, so that CI stays fast):
//
//	POLICYD_PROVISION_TRIES=100 go test -count=1 -run TestMeasureProvisionToReady -v ./internal/server/
func TestMeasureProvisionToReady(t *testing.T) {
	tries := 5
	if v := os.Getenv("POLICYD_PROVISION_TRIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("POLICYD_PROVISION_TRIES=%q: want a positive integer", v)
		}
		tries = n
	}
	_, f := provisionCluster(t)
	cc, a := dialGRPC(t, f.GRPCAddr()), apiFor(t, f)
	for _, tr := range provisionTransports {
		t.Run(tr.name, func(t *testing.T) {
			took := make([]time.Duration, 0, tries)
			for i := range tries {
				id := fmt.Sprintf("m-%s-%d", tr.name, i)
				token := provision(t, a, id)
				start := time.Now()
				_, closeSidecar := tr.connect(t, f, cc, id, token)
				took = append(took, time.Since(start))
				closeSidecar()
			}
			slices.Sort(took)
			// Nearest rank: the smallest value at or above q of the tries.
			at := func(q float64) time.Duration { return took[max(0, int(math.Ceil(q*float64(len(took))))-1)] }
			t.Logf("%s: write acknowledged → first set, %d tries on a follower: p50 %v, p99 %v, max %v",
				tr.name, tries, at(0.50).Round(10*time.Microsecond), at(0.99).Round(10*time.Microsecond), took[len(took)-1].Round(10*time.Microsecond))
		})
	}
}
