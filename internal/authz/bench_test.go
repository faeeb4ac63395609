package authz_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/authz"
	"github.com/policyd/policyd/internal/authz/benchset"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server"
	"github.com/policyd/policyd/internal/server/servertest"
)

// These benchmarks measure a decision: Server.Check in process
// and through a real ext_authz gRPC client on loopback, against an SDK
// client that a real single policyd node has synced with 20
// ValidatingPolicies and 20 ToolPolicies. `go run ./bench authz` measures
// the same against the policyd binary, as a separate process.
//
//	go test ./internal/authz -run '^$' -bench Check -benchtime 20000x

// startDecider starts a single policyd node, writes benchPolicies and
// returns an SDK client that holds all of them, everything stopped when b
// ends.
func startDecider(b *testing.B) *client.Client {
	b.Helper()
	logger := servertest.Logger(b)
	cfg := servertest.Config(filepath.Join(b.TempDir(), "node1"), "node1")
	cfg.Raft.Bootstrap = true
	n, err := server.New(cfg, logger, nil)
	if err != nil {
		b.Fatalf("start node: %v", err)
	}
	n.Start()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			b.Errorf("close node: %v", err)
		}
	})
	if poll.Until(context.Background(), 15*time.Second, poll.Holds(func() bool { return n.Ready(b.Context()) == nil })) != nil {
		b.Fatal("node not ready after 15s")
	}
	api, err := adminclient.New(adminclient.Config{Servers: []string{"http://" + n.HTTPAddr()}})
	if err != nil {
		b.Fatal(err)
	}
	set := benchset.Policies()
	for name, doc := range set {
		if _, err := api.PutPolicy(b.Context(), name, doc, adminclient.AnyRevision); err != nil {
			b.Fatalf("PUT %s: %v", name, err)
		}
	}

	c, err := client.New(client.Config{Servers: []string{n.GRPCAddr()}, Scope: client.Scope{Org: benchset.Org}}, logger)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			b.Errorf("SDK Run = %v", err)
		}
	})
	// The node's policy index may take in the last writes after the first
	// snapshot is sent; the update follows.
	if poll.Until(context.Background(), 15*time.Second, poll.Holds(func() bool { return c.State() == client.StateReady && len(c.Policies()) == len(set) })) != nil {
		b.Fatalf("SDK in state %s with %d policies after 15s, want ready with %d", c.State(), len(c.Policies()), len(set))
	}
	return c
}

func newServer(b *testing.B, d authz.Decider) *authz.Server {
	b.Helper()
	srv, err := authz.New(authz.Config{}, servertest.Logger(b), d, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// checkFunc is one way to call Check.
type checkFunc func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error)

// benchCases are the requests each benchmark times, and the gRPC status
// each must get.
var benchCases = []struct {
	name   string
	denied bool
	want   codes.Code
}{
	{"allow", false, codes.OK},
	{"deny", true, codes.PermissionDenied},
}

// runCases times check on every case, one call at a time, and reports
// p50 and p99 besides ns/op.
func runCases(b *testing.B, check checkFunc) {
	for _, tc := range benchCases {
		b.Run(tc.name, func(b *testing.B) {
			req := benchset.Request(tc.denied)
			if err := verify(b.Context(), check, req, tc.want); err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			lat := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				resp, err := check(ctx, req)
				lat = append(lat, time.Since(start))
				if err != nil || codes.Code(resp.GetStatus().GetCode()) != tc.want {
					b.Fatalf("Check = %v, %v; want status %v", resp.GetStatus(), err, tc.want)
				}
			}
			reportPercentiles(b, lat)
		})
	}
}

// verify checks one answer in full, so a benchmark cannot time the wrong
// decision.
func verify(ctx context.Context, check checkFunc, req *authv3.CheckRequest, want codes.Code) error {
	resp, err := check(ctx, req)
	if err != nil {
		return fmt.Errorf("Check: %w", err)
	}
	if got := codes.Code(resp.GetStatus().GetCode()); got != want {
		return fmt.Errorf("Check status = %v (%q), want %v", got, resp.GetStatus().GetMessage(), want)
	}
	if want == codes.OK {
		return nil
	}
	for _, h := range resp.GetDeniedResponse().GetHeaders() {
		if h.GetHeader().GetKey() == authz.HeaderPolicy {
			if got := h.GetHeader().GetValue(); got != benchset.DenyingPolicy {
				return fmt.Errorf("denied by %s, want %s", got, benchset.DenyingPolicy)
			}
			return nil
		}
	}
	return fmt.Errorf("denial without %s: %v", authz.HeaderPolicy, resp.GetDeniedResponse())
}

// reportPercentiles reports the p50 and p99 of lat (nearest rank).
func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(p float64) time.Duration {
		return lat[min(len(lat)-1, max(0, int(float64(len(lat))*p/100+0.999999)-1))]
	}
	b.ReportMetric(float64(at(50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(at(99).Nanoseconds()), "p99-ns")
}

// BenchmarkCheckInProcess calls Server.Check directly: attributes, the
// evaluation slot, the SDK's Evaluate and the response, without gRPC.
func BenchmarkCheckInProcess(b *testing.B) {
	srv := newServer(b, startDecider(b))
	runCases(b, srv.Check)
}

// BenchmarkCheckGRPC calls Check through a gRPC client on loopback, one
// call at a time (allow, deny), then from many goroutines (parallel: ns/op
// is wall time per decision, and decisions/s).
func BenchmarkCheckGRPC(b *testing.B) {
	srv := newServer(b, startDecider(b))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, authz.Listeners{GRPC: ln}, nil) }()
	b.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			b.Errorf("Serve = %v", err)
		}
	})
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	ac := authv3.NewAuthorizationClient(cc)
	check := func(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return ac.Check(ctx, req)
	}
	runCases(b, check)

	b.Run("parallel", func(b *testing.B) {
		req := benchset.Request(false)
		if err := verify(b.Context(), check, req, codes.OK); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		// Envoy keeps many checks in flight on one connection.
		b.SetParallelism(8)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := ac.Check(context.Background(), req)
				if err != nil || codes.Code(resp.GetStatus().GetCode()) != codes.OK {
					b.Errorf("Check = %v, %v", resp.GetStatus(), err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	})
}
