package server

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/proxystatus"
	"github.com/policyd/policyd/internal/server/servertest"
)

// TestReadyzMeansCaughtUp restarts a follower that missed writes and probes
// it from the moment it listens: every 200 from /readyz must come from a
// node whose local reads already return every acknowledged write. Under the
// old rule (commit index within 1,024 of applied) the node answered 200 as
// soon as it knew a leader, while it was still receiving the writes.
func TestReadyzMeansCaughtUp(t *testing.T) {
	c := newCluster(t, 3, nil)
	f := indexOf(c, c.follower())
	c.stop(f)

	const n = 400
	acked := map[string]uint64{}
	for i := range n {
		name := fmt.Sprintf("missed-%04d", i)
		acked[name] = apiFor(t, c.running()[i%2]).putPolicy(name, "acme", "r").Revision
	}

	restarted := c.restart(f)
	a := apiFor(t, restarted)
	var notReady, ready int
	deadline := time.Now().Add(30 * time.Second)
	for ready < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d answers 200 in 30 s (%d answers 503)", ready, notReady)
		}
		r := a.do(http.MethodGet, "/readyz", nil, nil)
		switch r.status {
		case http.StatusServiceUnavailable:
			notReady++
			continue
		case http.StatusOK:
			ready++
		default:
			t.Fatalf("/readyz = %d %s", r.status, r.body)
		}
		// A plain (local) read, served the moment /readyz said 200.
		l := a.do(http.MethodGet, "/v1/policies", nil, nil)
		if l.status != http.StatusOK {
			t.Fatalf("list after ready: %d %s", l.status, l.body)
		}
		var list struct {
			Policies []struct {
				Name     string `json:"name"`
				Revision uint64 `json:"revision"`
			} `json:"policies"`
		}
		l.decode(t, &list)
		have := map[string]uint64{}
		for _, p := range list.Policies {
			have[p.Name] = p.Revision
		}
		for name, rev := range acked {
			if have[name] < rev {
				t.Fatalf("/readyz answered 200 (after %d answers 503), but the node's read lacks %s (revision %d): it holds %d of %d acknowledged writes",
					notReady, name, rev, countAtLeast(have, acked), len(acked))
			}
		}
	}
	t.Logf("restarted node: %d answers 503 before ready", notReady)
}

func countAtLeast(have, want map[string]uint64) int {
	c := 0
	for k, v := range want {
		if have[k] >= v {
			c++
		}
	}
	return c
}

// TestHealthPerService: a node that cannot reach a leader is
// alive but not ready, on REST and on gRPC health per service.
func TestHealthPerService(t *testing.T) {
	c := newCluster(t, 2, nil)
	n := c.follower()
	other := c.leader()

	cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	hc := healthpb.NewHealthClient(cc)
	check := func(service string) (healthpb.HealthCheckResponse_ServingStatus, codes.Code) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		return resp.GetStatus(), status.Code(err)
	}
	a := apiFor(t, n)
	type want struct {
		live, discovery healthpb.HealthCheckResponse_ServingStatus
		readyz          int
	}
	assert := func(w want) {
		t.Helper()
		tests := []struct {
			name    string
			service string
			want    healthpb.HealthCheckResponse_ServingStatus
		}{
			{"overall", "", w.live},
			{"discovery", discoveryService, w.discovery},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				var got healthpb.HealthCheckResponse_ServingStatus
				if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool {
					got, _ = check(tc.service)
					return got == tc.want
				})) !=
					nil {
					t.Fatalf("health of %q = %v, want %v", tc.service, got, tc.want)
				}
			})
		}
		if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { return a.do(http.MethodGet, "/readyz", nil, nil).status == w.readyz })) != nil {
			t.Fatalf("/readyz is not %d", w.readyz)
		}
		for _, p := range []string{"/livez", "/healthz"} {
			if r := a.do(http.MethodGet, p, nil, nil); r.status != http.StatusOK {
				t.Fatalf("%s = %d %s", p, r.status, r.body)
			}
		}
	}
	if _, code := check("no.such.Service"); code != codes.NotFound {
		t.Fatalf("unknown service: %v, want NotFound", code)
	}

	assert(want{live: healthpb.HealthCheckResponse_SERVING, discovery: healthpb.HealthCheckResponse_SERVING, readyz: http.StatusOK})
	c.stop(indexOf(c, other))
	assert(want{live: healthpb.HealthCheckResponse_SERVING, discovery: healthpb.HealthCheckResponse_NOT_SERVING, readyz: http.StatusServiceUnavailable})
}

// TestSignalMetrics checks the node's own signal metrics on a live node:
// readiness, sidecars per state (every state reported, at 0 when empty,
// then with real discovery streams that ACK, NACK and stay silent) and
// drift reports per phase.
func TestSignalMetrics(t *testing.T) {
	cfg := testConfig(t, "node1")
	cfg.Raft.Bootstrap = true
	n := startNode(t, cfg)
	if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { return servertest.Metric(t, n.reg, "policyd_ready") == 1 })) != nil {
		t.Fatal("policyd_ready never 1 on a single-node cluster")
	}
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	tests := []struct {
		name   string
		series int
	}{
		{"proxy_state", 8}, // 4 states x 2 transports
		{"policyd_drift_reports", 2},
		{"policyd_ready", 1},
		{"policyd_raft_is_leader", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := series[tc.name]; got != tc.series {
				t.Fatalf("%s has %d series, want %d", tc.name, got, tc.series)
			}
		})
	}
	for _, st := range proxyStateNames {
		if got := servertest.Metric(t, n.reg, "proxy_state", "state", st); got != 0 {
			t.Errorf("proxy_state{state=%q} = %v with no sidecars", st, got)
		}
	}

	// Three gRPC sidecars: one ACKs its set, one NACKs it, one does not
	// answer.
	cc := dialGRPC(t, n.GRPCAddr())
	org := policy.Scope{Org: "acme"}
	acks := openStream(t, cc, "c-acks", org)
	acks.ack(acks.next())
	nacks := openStream(t, cc, "c-nacks", org)
	nacks.send("", nacks.next().GetNonce(), &discoveryv1.ErrorDetail{Message: "cannot compile"})
	silent := openStream(t, cc, "c-silent", org)
	silent.next()
	want := map[string]float64{stateConnected: 0, proxystatus.Pending: 1, proxystatus.Acked: 1, proxystatus.Nacked: 1}
	got := map[string]float64{}
	if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool {
		for st := range want {
			got[st] = servertest.Metric(t, n.reg, "proxy_state", "state", st, "transport", "grpc")
		}
		return cmp.Equal(want, got)
	})) !=
		nil {
		t.Fatalf("proxy_state{transport=grpc} (-want +got):\n%s", cmp.Diff(want, got))
	}
}
