package authz_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/authz"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/server"
	"github.com/policyd/policyd/server/servertest"
)

// These benchmarks measure a decision (issue 31): Server.Check in process
// and through a real ext_authz gRPC client on loopback, against an SDK
// client that a real single policyd node has synced with 20
// ValidatingPolicies and 20 ToolPolicies. `go run ./bench authz` measures
// the same against the policyd binary, as a separate process.
//
//	go test ./authz -run '^$' -bench Check -benchtime 20000x

// benchOrg is the org whose policies the SDK follows.
const benchOrg = "bench-authz"

// benchPolicies is the set every benchmark decides against: 20
// ValidatingPolicies of 4 validations each over the request's method, path,
// headers, host and principals, and 20 ToolPolicies (deny, with patterns).
func benchPolicies() map[string][]byte {
	type validation struct {
		Expression string `json:"expression"`
		Message    string `json:"message"`
		Reason     string `json:"reason,omitempty"`
	}
	doc := func(name, kind string, spec any) []byte {
		b, err := json.Marshal(map[string]any{"name": name, "kind": kind, "scope": map[string]string{"org": benchOrg}, "spec": spec})
		if err != nil {
			panic(err) // static shapes: a bug
		}
		return b
	}
	// One extra check per policy, in turn, so the set is not 20 copies.
	extra := []validation{
		{`!request.path.matches("[.][.]/|//")`, "path traversal", "BadPath"},
		{`!("x-debug" in request.headers) || request.headers["x-debug"] == "0"`, "debug requests are not allowed", "Forbidden"},
		{`request.size <= 1048576`, "request too large", "TooLarge"},
		{`request.host in ["api.example.com", "api.internal"]`, "unknown host", "Forbidden"},
	}
	tools := []string{"Bash", "Write", "Edit", "WebFetch", "Read"}
	out := map[string][]byte{}
	for i := range 20 {
		name := fmt.Sprintf("%s.http-%02d", benchOrg, i)
		out[name] = doc(name, "ValidatingPolicy", map[string]any{"validations": []validation{
			{`request.method in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]`, "method not allowed", "MethodNotAllowed"},
			{fmt.Sprintf(`!request.path.startsWith("/internal/%d/")`, i), "internal path", "Forbidden"},
			{`"authorization" in request.headers && request.headers["authorization"].startsWith("Bearer ")`, "bearer token required", "Unauthorized"},
			{fmt.Sprintf(`request.source.principal.startsWith("spiffe://cluster.local/ns/") && !request.source.principal.endsWith("/sa/blocked-%d")`, i), "caller not allowed", ""},
			extra[i%len(extra)],
		}})
		name = fmt.Sprintf("%s.tool-%02d", benchOrg, i)
		out[name] = doc(name, "ToolPolicy", map[string]any{
			"tool_name": tools[i%len(tools)], "action": "deny", "reason": fmt.Sprintf("bench rule %d", i),
			"conditions": map[string]any{"patterns": []string{fmt.Sprintf(`^rm -rf /%d`, i), fmt.Sprintf(`/etc/shadow%d\b`, i)}},
		})
	}
	return out
}

// denyingPolicy is the policy benchRequest(true) is denied by: the last in
// name order, so every policy is evaluated first.
const denyingPolicy = benchOrg + ".http-19"

// benchRequest is what Envoy sends for an API call between two meshed
// services: 11 headers, principals, a context extension. denied asks for a
// path the last ValidatingPolicy forbids.
func benchRequest(denied bool) *authv3.CheckRequest {
	path := "/api/v1/orders/12345?expand=items"
	if denied {
		path = "/internal/19/metrics"
	}
	sock := func(ip string, port uint32) *corev3.Address {
		return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{
			Address: sock("10.0.3.17", 43122), Principal: "spiffe://cluster.local/ns/shop/sa/frontend"},
		Destination: &authv3.AttributeContext_Peer{
			Address: sock("10.0.5.4", 8080), Principal: "spiffe://cluster.local/ns/shop/sa/orders"},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "7c1f5c2e-3b1a-4a43-9d0e-4f8a2d6b9e01", Method: "GET", Path: path,
			Host: "api.example.com", Scheme: "https", Protocol: "HTTP/1.1", Size: 0,
			Headers: map[string]string{
				":authority":                     "api.example.com",
				":method":                        "GET",
				":path":                          path,
				":scheme":                        "https",
				"accept":                         "application/json",
				"authorization":                  "Bearer eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl",
				"user-agent":                     "shop-frontend/2.3.1",
				"x-request-id":                   "7c1f5c2e-3b1a-4a43-9d0e-4f8a2d6b9e01",
				"x-forwarded-for":                "203.0.113.7",
				"x-forwarded-proto":              "https",
				"x-envoy-expected-rq-timeout-ms": "15000",
			},
		}},
		ContextExtensions: map[string]string{"virtual_host": "orders"},
	}}
}

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
	if !servertest.Poll(15*time.Second, func() bool { return n.Ready(b.Context()) == nil }) {
		b.Fatal("node not ready after 15s")
	}
	api, err := adminclient.New(adminclient.Config{Servers: []string{"http://" + n.HTTPAddr()}})
	if err != nil {
		b.Fatal(err)
	}
	set := benchPolicies()
	for name, doc := range set {
		if _, err := api.PutPolicy(b.Context(), name, doc, adminclient.AnyRevision); err != nil {
			b.Fatalf("PUT %s: %v", name, err)
		}
	}

	c, err := client.New(client.Config{Servers: []string{n.GRPCAddr()}, Scope: client.Scope{Org: benchOrg}}, logger)
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
	if !servertest.Poll(15*time.Second, func() bool { return c.State() == client.StateReady && len(c.Policies()) == len(set) }) {
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
			req := benchRequest(tc.denied)
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
			if got := h.GetHeader().GetValue(); got != denyingPolicy {
				return fmt.Errorf("denied by %s, want %s", got, denyingPolicy)
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
		req := benchRequest(false)
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
