package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/authz"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// These tests run `policyd authz` in-process, wired as internal/cli/authz.go wires
// it: an SDK client following one node of a real 3-node cluster in
// auth.mode jwt, and an authz.Server deciding from it on loopback
// listeners. A real gRPC client sends the CheckRequests Envoy sends, and
// net/http posts to /v1/check; policies and employees change through the
// REST API of the other nodes.

// authzSidecar is one `policyd authz` in the test.
type authzSidecar struct {
	sdk      *client.Client
	reg      *prometheus.Registry
	ext      authv3.AuthorizationClient
	health   healthpb.HealthClient
	grpcAddr string
	base     string // the HTTP listener, http://host:port
	hc       *http.Client
	runErr   chan error // what the SDK's Run returned
}

// startAuthz starts a sidecar with ccfg serving with acfg, and waits until
// it is ready. onState, when set, hears each state change after the
// server's gRPC health does.
func startAuthz(t *testing.T, ccfg client.Config, acfg authz.Config, onState func(from, to client.State)) *authzSidecar {
	t.Helper()
	logger := testLogger(t)
	var srv *authz.Server
	// Set before Run starts, so the callback always sees srv.
	ccfg.OnStateChange = func(from, to client.State) {
		srv.StateChanged(from, to)
		if onState != nil {
			onState(from, to)
		}
	}
	ccfg.BackoffMin, ccfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	sdk, err := client.New(ccfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if srv, err = authz.New(acfg, logger, sdk, reg); err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = gln.Close()
		t.Fatal(err)
	}
	s := &authzSidecar{
		sdk: sdk, reg: reg, grpcAddr: gln.Addr().String(), base: "http://" + hln.Addr().String(),
		hc: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}, runErr: make(chan error, 1),
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { s.runErr <- sdk.Run(ctx) }()
	go func() { served <- srv.Serve(ctx, authz.Listeners{GRPC: gln, HTTP: hln}, reg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("authz Serve = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("authz Serve did not return")
		}
		select {
		case err := <-s.runErr:
			if err != nil && !errors.Is(err, client.ErrRevoked) {
				t.Errorf("SDK Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("SDK Run did not return")
		}
	})
	// Registered after Serve's cleanup, so they run before it.
	t.Cleanup(s.hc.CloseIdleConnections)
	cc := dialGRPC(t, s.grpcAddr)
	s.ext, s.health = authv3.NewAuthorizationClient(cc), healthpb.NewHealthClient(cc)

	wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer wcancel()
	if err := sdk.WaitReady(wctx); err != nil {
		t.Fatalf("sidecar never ready: %v", err)
	}
	return s
}

// waitReady waits for the sidecar to be ready again, after the load of an
// earlier subtest starved the cluster of a leader for a while (and a node
// closed its sidecar streams).
func (s *authzSidecar) waitReady(t *testing.T) {
	t.Helper()
	if poll.Until(context.Background(), 20*time.Second, poll.Holds(func() bool { return s.sdk.State() == client.StateReady })) != nil {
		t.Fatalf("sidecar %s, not ready", s.sdk.State())
	}
}

// liveHeap is the heap the last GC found live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// verdict is an ext_authz answer as Envoy acts on it.
type verdict struct {
	Allowed bool
	Code    codes.Code // of the answer's status
	HTTP    int        // the denied response's status
	Body    string
	// The x-policyd-* headers of a denial.
	Policy, Reason, State string
}

func verdictOf(t *testing.T, r *authv3.CheckResponse) verdict {
	t.Helper()
	v := verdict{Code: codes.Code(r.GetStatus().GetCode())}
	v.Allowed = v.Code == codes.OK
	d := r.GetDeniedResponse()
	if v.Allowed != (r.GetOkResponse() != nil) || v.Allowed == (d != nil) {
		t.Errorf("answer with status %v and a %T: want OK with an OkResponse, or a denial with a DeniedResponse", r.GetStatus(), r.GetHttpResponse())
	}
	if d == nil {
		return v
	}
	v.HTTP, v.Body = int(d.GetStatus().GetCode()), d.GetBody()
	for _, h := range d.GetHeaders() {
		switch h.GetHeader().GetKey() {
		case authz.HeaderPolicy:
			v.Policy = h.GetHeader().GetValue()
		case authz.HeaderReason:
			v.Reason = h.GetHeader().GetValue()
		case authz.HeaderState:
			v.State = h.GetHeader().GetValue()
		}
	}
	return v
}

var allowed = verdict{Allowed: true, Code: codes.OK}

// policyDenial is the answer when policy denies with message and reason.
func policyDenial(policy, message, reason string) verdict {
	return verdict{Code: codes.PermissionDenied, HTTP: http.StatusForbidden, Body: message, Policy: policy, Reason: reason}
}

// check sends req to the sidecar's ext_authz listener.
func (s *authzSidecar) check(t *testing.T, req *authv3.CheckRequest) verdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := s.ext.Check(ctx, req)
	if err != nil {
		t.Fatalf("ext_authz Check: %v", err)
	}
	return verdictOf(t, resp)
}

// post sends body to POST /v1/check.
func (s *authzSidecar) post(ctx context.Context, contentType string, body []byte) (response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", contentType)
	return s.send(req)
}

func (s *authzSidecar) send(req *http.Request) (response, error) {
	resp, err := s.hc.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: read body: %w", req.Method, req.URL.Path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// decide asks POST /v1/check about req, which must be answered with 200.
func (s *authzSidecar) decide(t *testing.T, req authz.CheckRequest) authz.CheckResponse {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.post(t.Context(), "application/json", b)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusOK {
		t.Fatalf("POST /v1/check %s: %d %s", b, r.status, r.body)
	}
	var out authz.CheckResponse
	r.decode(t, &out)
	return out
}

func (s *authzSidecar) get(t *testing.T, path string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.send(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// serving is what the sidecar's gRPC health service says of ext_authz.
func (s *authzSidecar) serving(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	r, err := s.health.Check(ctx, &healthpb.HealthCheckRequest{Service: authv3.Authorization_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatalf("health Check: %v", err)
	}
	return r.GetStatus()
}

// wantBlocked checks that the sidecar denies everything because its SDK is
// in state: over gRPC, on /v1/check, and in /readyz and gRPC health.
func (s *authzSidecar) wantBlocked(t *testing.T, state client.State, grpcReqs []*authv3.CheckRequest, httpReqs []authz.CheckRequest) {
	t.Helper()
	for i, req := range grpcReqs {
		got := s.check(t, req)
		if !strings.HasSuffix(got.Body, "All requests blocked.") {
			t.Errorf("check %d: body %q, want the SDK's blocking reason", i, got.Body)
		}
		got.Body = ""
		want := verdict{Code: codes.PermissionDenied, HTTP: http.StatusForbidden, State: string(state)}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("check %d %s %s in state %s (-want +got):\n%s", i, req.GetAttributes().GetRequest().GetHttp().GetMethod(),
				req.GetAttributes().GetRequest().GetHttp().GetPath(), state, diff)
		}
	}
	for _, req := range httpReqs {
		got := s.decide(t, req)
		if !strings.HasSuffix(got.Message, "All requests blocked.") {
			t.Errorf("/v1/check %+v: message %q, want the SDK's blocking reason", req, got.Message)
		}
		got.Message = ""
		if diff := cmp.Diff(authz.CheckResponse{State: string(state)}, got); diff != "" {
			t.Errorf("/v1/check %+v in state %s (-want +got):\n%s", req, state, diff)
		}
	}
	if r := s.get(t, "/readyz"); r.status != http.StatusServiceUnavailable || string(r.body) != string(state)+"\n" {
		t.Errorf("/readyz = %d %q, want 503 %q", r.status, r.body, state)
	}
	if r := s.get(t, "/healthz"); r.status != http.StatusOK {
		t.Errorf("/healthz = %d, want 200 while the process runs", r.status)
	}
	if got := s.serving(t); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health %v, want NOT_SERVING", got)
	}
	if got := servertest.Metric(t, s.reg, "policyd_authz_state", "state", string(state)); got != 1 {
		t.Errorf("policyd_authz_state{state=%q} = %v, want 1", state, got)
	}
}

// Identities of the requests: Envoy reports the peers' SPIFFE IDs.
const (
	frontendID = "spiffe://acme.test/ns/web/sa/frontend"
	ordersID   = "spiffe://acme.test/ns/shop/sa/orders"
	strangerID = "spiffe://evil.test/ns/x/sa/y"
)

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// envoyCheck is the CheckRequest Envoy sends for a request from caller to
// the orders service, with extra headers.
func envoyCheck(method, path, caller string, extra map[string]string) *authv3.CheckRequest {
	headers := map[string]string{":authority": "orders.acme.test", ":method": method, ":path": path, "user-agent": "curl/8.5.0"}
	maps.Copy(headers, extra)
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: socketAddress("10.1.2.3", 50432), Principal: caller},
		Destination: &authv3.AttributeContext_Peer{Address: socketAddress("10.1.9.9", 8443), Principal: ordersID},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "0af7651916cd43dd8448eb211c80319c", Method: method, Path: path, Host: "orders.acme.test",
			Scheme: "https", Protocol: "HTTP/2", Headers: headers, Size: -1,
		}},
		ContextExtensions: map[string]string{"route": "orders"},
	}}
}

// rawHeaders moves req's headers to header_map, as Envoy sends them with
// encode_raw_headers: raw values, names as they came, repeats apart.
func rawHeaders(req *authv3.CheckRequest, extra ...*corev3.HeaderValue) *authv3.CheckRequest {
	req = proto.Clone(req).(*authv3.CheckRequest)
	h := req.GetAttributes().GetRequest().GetHttp()
	hm := &corev3.HeaderMap{}
	for k, v := range h.GetHeaders() {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	hm.Headers = append(hm.Headers, extra...)
	h.Headers, h.HeaderMap = nil, hm
	return req
}

// validation is one of a ValidatingPolicy's spec.validations.
type validation struct {
	Expression string `json:"expression"`
	Message    string `json:"message"`
	Reason     string `json:"reason,omitempty"`
}

// httpOnly makes a validation pass checks that carry no HTTP request (tool
// calls on /v1/check): until spec.matchConditions lands, every
// ValidatingPolicy of the set applies to every check.
func httpOnly(expr string) string { return "!has(request.method) || (" + expr + ")" }

func validatingPolicy(name string, scope policy.Scope, vs ...validation) []byte {
	b, _ := json.Marshal(map[string]any{
		"name": name, "kind": "ValidatingPolicy", "scope": scope,
		"spec": map[string]any{"validations": vs},
	})
	return b
}

// shellPolicy denies Bash commands matching pattern.
func shellPolicy(name string, scope policy.Scope, pattern, reason string) []byte {
	b, _ := json.Marshal(map[string]any{
		"name": name, "kind": "ToolPolicy", "scope": scope,
		"spec": map[string]any{"tool_name": "Bash", "action": "deny", "reason": reason, "conditions": map[string]any{"patterns": []string{pattern}}},
	})
	return b
}

func bash(command string) authz.CheckRequest {
	return authz.CheckRequest{Tool: "Bash", Input: map[string]any{"command": command}}
}

// untilChanged polls what until it returns want, for at most 5 s, and
// logs how long after since that took.
func untilChanged[T any](t *testing.T, since time.Time, change string, want T, what func() T) {
	t.Helper()
	var got T
	if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool { got = what(); return cmp.Equal(want, got) })) != nil {
		t.Fatalf("%s: not seen within 5 s of the write (-want +got):\n%s", change, cmp.Diff(want, got))
	}
	t.Logf("%s: decided %v after the write's response", change, time.Since(since).Round(time.Microsecond))
}

// TestAuthzE2E runs two sidecars against a 3-node cluster: alice's (team
// red) for decisions, limits, load and revocation; bob's (team blue) for
// what happens when every node stops.
func TestAuthzE2E(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	// Registered first, so it runs after every other cleanup.
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })

	c := newCluster(t, 3, jwtMode(t))
	a := apiFor(t, c.nodes[2])
	a.put("/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red","status":"active"}`))
	a.put("/v1/employees/bob", []byte(`{"id":"bob","org":"acme","team":"blue","status":"active"}`))

	red, blue := policy.Scope{Org: "acme", Team: "red"}, policy.Scope{Org: "acme", Team: "blue"}
	gateV1 := []validation{
		{httpOnly(`request.source.principal.startsWith("spiffe://acme.test/") && request.destination.principal == "` + ordersID +
			`" && request.host == "orders.acme.test" && request.contextExtensions["route"] == "orders"`), "caller outside acme.test", "UnknownCaller"},
		{httpOnly(`request.method in ["GET", "HEAD"] || ("x-role" in request.headers && request.headers["x-role"] == "admin")`), "writes need the admin role", ""},
	}
	maintenance := validation{httpOnly(`!request.path.startsWith("/admin")`), "the admin API is closed for maintenance", "Maintenance"}
	gateV2 := append([]validation{maintenance}, gateV1...)
	a.put("/v1/policies/acme.red.gate", validatingPolicy("acme.red.gate", red, gateV1...))
	a.put("/v1/policies/acme.blue.gate", validatingPolicy("acme.blue.gate", blue,
		validation{httpOnly(`!request.path.startsWith("/admin")`), "blue has no admin", "NoAdmin"}))
	a.put("/v1/policies/acme.deny-shell", shellPolicy("acme.deny-shell", policy.Scope{Org: "acme"}, "rm -rf", "no shell"))
	c.waitConverged()

	// Alice's sidecar follows node 0 alone; writes go through nodes 1 and 2.
	alice := startAuthz(t, client.Config{
		Servers: []string{c.nodes[0].GRPCAddr()}, Token: signJWT(t, "alice", "acme", "red", time.Hour), ClientAddress: "authz-alice",
	}, authz.Config{MaxInFlight: 2}, nil)
	// Bob's follows node 1, with a short grace; lost hears it lose its node.
	const grace = 1500 * time.Millisecond
	lost := make(chan time.Time, 1)
	bob := startAuthz(t, client.Config{
		Servers: []string{c.nodes[1].GRPCAddr()}, Token: signJWT(t, "bob", "acme", "blue", time.Hour), ClientAddress: "authz-bob", Grace: grace,
	}, authz.Config{}, func(from, to client.State) {
		if from == client.StateReady && to == client.StateDisconnected {
			select {
			case lost <- time.Now():
			default:
			}
		}
	})

	read := envoyCheck("GET", "/orders/7", frontendID, nil)
	admin := envoyCheck("GET", "/admin/users?page=2", frontendID, nil)
	write := envoyCheck("POST", "/orders", frontendID, nil)
	adminWrite := envoyCheck("POST", "/orders", frontendID, map[string]string{"x-role": "admin"})
	stranger := envoyCheck("GET", "/orders/7", strangerID, nil)
	// The same request as admin, as /v1/check takes it.
	adminHTTP := authz.CheckRequest{Request: map[string]any{
		"method": "GET", "path": "/admin/users?page=2", "host": "orders.acme.test", "headers": map[string]any{},
		"source": map[string]any{"principal": frontendID}, "destination": map[string]any{"principal": ordersID},
		"contextExtensions": map[string]any{"route": "orders"},
	}}

	t.Run("a ValidatingPolicy write changes ext_authz decisions", func(t *testing.T) {
		if got := alice.serving(t); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("gRPC health %v while ready, want SERVING", got)
		}
		cases := []struct {
			name string
			req  *authv3.CheckRequest
			v1   verdict // under gateV1; under gateV2 only admin changes
		}{
			{"read", read, allowed},
			{"admin read", admin, allowed},
			{"write without the role", write, policyDenial("acme.red.gate", "writes need the admin role", "")},
			{"write with the role", adminWrite, allowed},
			{"write with the role in raw headers", rawHeaders(write, &corev3.HeaderValue{Key: "X-Role", RawValue: []byte("admin")}), allowed},
			{"role repeated in raw headers", rawHeaders(write, &corev3.HeaderValue{Key: "X-Role", RawValue: []byte("admin")},
				&corev3.HeaderValue{Key: "x-role", RawValue: []byte("admin")}), policyDenial("acme.red.gate", "writes need the admin role", "")},
			{"caller from another trust domain", stranger, policyDenial("acme.red.gate", "caller outside acme.test", "UnknownCaller")},
		}
		checkAll := func(t *testing.T, adminWant verdict) {
			t.Helper()
			for _, tc := range cases {
				want := tc.v1
				if tc.req == admin {
					want = adminWant
				}
				if diff := cmp.Diff(want, alice.check(t, tc.req)); diff != "" {
					t.Errorf("%s (-want +got):\n%s", tc.name, diff)
				}
			}
		}
		checkAll(t, allowed)

		closed := policyDenial("acme.red.gate", maintenance.Message, maintenance.Reason)
		apiFor(t, c.nodes[1]).put("/v1/policies/acme.red.gate", validatingPolicy("acme.red.gate", red, gateV2...))
		untilChanged(t, time.Now(), "admin closed", closed, func() verdict { return alice.check(t, admin) })
		checkAll(t, closed)
		want := authz.CheckResponse{Policy: "acme.red.gate", Message: maintenance.Message, Reason: maintenance.Reason, State: "ready"}
		if diff := cmp.Diff(want, alice.decide(t, adminHTTP)); diff != "" {
			t.Errorf("POST /v1/check with the request (-want +got):\n%s", diff)
		}

		apiFor(t, c.nodes[2]).put("/v1/policies/acme.red.gate", validatingPolicy("acme.red.gate", red, gateV1...))
		untilChanged(t, time.Now(), "admin open again", allowed, func() verdict { return alice.check(t, admin) })
		checkAll(t, allowed)
		if diff := cmp.Diff(authz.CheckResponse{Allowed: true, State: "ready"}, alice.decide(t, adminHTTP)); diff != "" {
			t.Errorf("POST /v1/check with the request (-want +got):\n%s", diff)
		}
		if got := servertest.Metric(t, alice.reg, "policyd_authz_decisions_total", "api", "grpc", "result", "deny", "policy", "acme.red.gate"); got < 1 {
			t.Errorf("policyd_authz_decisions_total{api=grpc,result=deny,policy=acme.red.gate} = %v", got)
		}
	})

	t.Run("ToolPolicy decisions on POST /v1/check", func(t *testing.T) {
		ready := func(allow bool, policy, message string) authz.CheckResponse {
			return authz.CheckResponse{Allowed: allow, Policy: policy, Message: message, State: "ready"}
		}
		cases := []struct {
			name string
			req  authz.CheckRequest
			want authz.CheckResponse
		}{
			{"allowed command", bash("ls -l /tmp"), ready(true, "", "")},
			{"denied command", bash("rm -rf /tmp/x"), ready(false, "acme.deny-shell", "no shell")},
			{"curl before its policy", bash("curl -sS https://example.test"), ready(true, "", "")},
			{"another tool", authz.CheckRequest{Tool: "Read", Input: map[string]any{"path": "rm -rf"}}, ready(true, "", "")},
		}
		for _, tc := range cases {
			if diff := cmp.Diff(tc.want, alice.decide(t, tc.req)); diff != "" {
				t.Errorf("%s (-want +got):\n%s", tc.name, diff)
			}
		}
		// The body is JSON whatever the Content-Type says.
		r, err := alice.post(t.Context(), "application/x-www-form-urlencoded", []byte(`{"tool":"Bash","input":{"command":"rm -rf /"}}`))
		if err != nil {
			t.Fatal(err)
		}
		var got authz.CheckResponse
		if r.decode(t, &got); r.status != http.StatusOK || got != ready(false, "acme.deny-shell", "no shell") {
			t.Errorf("form-encoded POST: %d %+v", r.status, got)
		}

		curl := bash("curl -sS https://example.test")
		apiFor(t, c.nodes[1]).put("/v1/policies/acme.deny-curl", shellPolicy("acme.deny-curl", policy.Scope{Org: "acme"}, "curl ", "no curl"))
		untilChanged(t, time.Now(), "curl denied", ready(false, "acme.deny-curl", "no curl"), func() authz.CheckResponse { return alice.decide(t, curl) })
		apiFor(t, c.nodes[2]).del("/v1/policies/acme.deny-curl")
		untilChanged(t, time.Now(), "curl allowed again", ready(true, "", ""), func() authz.CheckResponse { return alice.decide(t, curl) })
	})

	t.Run("bad input through the listeners", func(t *testing.T) {
		rejected := func(reason string) float64 {
			return servertest.Metric(t, alice.reg, "policyd_authz_rejected_total", "reason", reason)
		}
		before := map[string]float64{}
		for _, r := range []string{"headers_too_large", "body_too_large", "invalid_utf8", "bad_request"} {
			before[r] = rejected(r)
		}
		body := func(n int) *authv3.CheckRequest {
			req := proto.Clone(write).(*authv3.CheckRequest)
			req.GetAttributes().GetRequest().GetHttp().Body = strings.Repeat("b", n)
			return req
		}
		grpcCases := []struct {
			name string
			req  *authv3.CheckRequest
			http int
		}{
			{"headers over 64 KiB", envoyCheck("GET", "/orders/7", frontendID, map[string]string{"x-big": strings.Repeat("h", 64<<10)}), http.StatusRequestHeaderFieldsTooLarge},
			{"raw headers over 64 KiB", rawHeaders(read, &corev3.HeaderValue{Key: "x-big", RawValue: bytes.Repeat([]byte("h"), 64<<10)}), http.StatusRequestHeaderFieldsTooLarge},
			{"path over 64 KiB", envoyCheck("GET", "/"+strings.Repeat("p", 64<<10), frontendID, nil), http.StatusRequestHeaderFieldsTooLarge},
			{"body over 1 MiB", body(authz.DefaultMaxBodyBytes + 1), http.StatusRequestEntityTooLarge},
			{"raw header not UTF-8", rawHeaders(read, &corev3.HeaderValue{Key: "x-name", RawValue: []byte{'a', 0xff, 0xfe}}), http.StatusBadRequest},
		}
		for _, tc := range grpcCases {
			got := alice.check(t, tc.req)
			if got.Body == "" {
				t.Errorf("%s: a denial without a body", tc.name)
			}
			want := verdict{HTTP: tc.http}
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(verdict{}, "Code", "Body")); diff != "" {
				t.Errorf("%s (-want +got):\n%s", tc.name, diff)
			}
		}
		// A body at the limit is decided.
		if diff := cmp.Diff(policyDenial("acme.red.gate", "writes need the admin role", ""), alice.check(t, body(authz.DefaultMaxBodyBytes))); diff != "" {
			t.Errorf("body of exactly 1 MiB (-want +got):\n%s", diff)
		}

		// Larger than the server's gRPC limit: refused by gRPC itself, which
		// Envoy (failure_mode_allow false) turns into a deny.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := alice.ext.Check(ctx, body(2<<20)); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a 2 MiB CheckRequest: %v, want ResourceExhausted", err)
		}
		if got := alice.check(t, read); got != allowed {
			t.Errorf("the check after the oversized one: %+v", got)
		}

		// Envoy's C++ protobuf may put a path that is not UTF-8 on the wire;
		// whatever the server makes of it, it must not allow it.
		marked := envoyCheck("GET", "/orders/@@", frontendID, nil)
		wire, err := proto.Marshal(marked)
		if err != nil {
			t.Fatal(err)
		}
		wire = bytes.Replace(wire, []byte("/orders/@@"), []byte("/orders/\xff\xfe"), 1)
		var resp authv3.CheckResponse
		cc := dialGRPC(t, alice.grpcAddr)
		err = cc.Invoke(ctx, "/envoy.service.auth.v3.Authorization/Check", wire, &resp, sendRaw)
		switch {
		case err != nil:
			t.Logf("a path that is not UTF-8: RPC error %v (Envoy's failure_mode_allow decides)", err)
		case resp.GetStatus().GetCode() == int32(codes.OK):
			t.Errorf("a path that is not UTF-8 was allowed")
		default:
			t.Logf("a path that is not UTF-8: denied %d", resp.GetDeniedResponse().GetStatus().GetCode())
		}

		httpCases := []struct {
			name, body string
			status     int
		}{
			{"malformed JSON", `{"tool":"Bash","input":`, http.StatusBadRequest},
			{"invalid UTF-8", "{\"tool\":\"Bash\",\"input\":{\"command\":\"\xff\"}}", http.StatusBadRequest},
			{"unknown field", `{"tool":"Bash","input":{},"user":"root"}`, http.StatusBadRequest},
			{"duplicate key", `{"tool":"Read","tool":"Bash","input":{"command":"rm -rf /"}}`, http.StatusBadRequest},
			{"nothing to decide", `{}`, http.StatusBadRequest},
			{"body over 1 MiB", `{"tool":"Bash","input":{"command":"` + strings.Repeat("c", authz.DefaultMaxBodyBytes) + `"}}`, http.StatusRequestEntityTooLarge},
		}
		for _, tc := range httpCases {
			r, err := alice.post(t.Context(), "application/json", []byte(tc.body))
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if r.status != tc.status {
				t.Errorf("%s: %d %s, want %d", tc.name, r.status, r.body, tc.status)
				continue
			}
			if code := r.errCode(t); code != "invalid" {
				t.Errorf("%s: error code %q, want invalid", tc.name, code)
			}
		}

		for reason, want := range map[string]float64{"headers_too_large": 3, "body_too_large": 2, "invalid_utf8": 1, "bad_request": 5} {
			if got := rejected(reason) - before[reason]; got != want {
				t.Errorf("policyd_authz_rejected_total{reason=%q} grew by %v, want %v", reason, got, want)
			}
		}
	})

	t.Run("10000 concurrent checks", func(t *testing.T) {
		const checks, conns = 10_000, 8
		// Every goroutine serving a stream, and the one per connection,
		// is created by grpc's serveStreams.
		const streamFrames = "google.golang.org/grpc.(*Server).serveStreams"
		// A policy that takes about a millisecond to evaluate (9,216
		// iterations, CEL cost about 66k, within the limit so the SDK
		// runs it untracked): 2 slots decide a couple of thousand checks
		// a second at best, so of 2,048 streams queued some wait past
		// maxQueueWait and are answered 503.
		var list strings.Builder
		for i := range 96 {
			fmt.Fprintf(&list, "%s%d", map[bool]string{true: "[", false: ", "}[i == 0], i)
		}
		list.WriteString("]")
		l := list.String()
		apiFor(t, c.nodes[1]).put("/v1/policies/acme.red.heavy", validatingPolicy("acme.red.heavy", red, validation{
			httpOnly(l + ".all(a, " + l + ".all(b, a + b >= 0))"), "unreachable", ""}))
		if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool { return len(alice.sdk.Policies()) == 3 })) != nil {
			t.Fatalf("the sidecar holds %d policies, want 3 with acme.red.heavy", len(alice.sdk.Policies()))
		}
		clients := make([]authv3.AuthorizationClient, conns)
		for i := range clients {
			clients[i] = authv3.NewAuthorizationClient(dialGRPC(t, alice.grpcAddr))
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			_, err := clients[i].Check(ctx, read) // connected before the baseline
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		overloaded0 := servertest.Metric(t, alice.reg, "policyd_authz_rejected_total", "reason", "overloaded")
		allowed0 := servertest.Metric(t, alice.reg, "policyd_authz_decisions_total", "api", "grpc", "result", "allow")
		runtime.GC()
		var ms0 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		live0 := liveHeap()
		goroutines0, streams0 := runtime.NumGoroutine(), servertest.Goroutines(streamFrames)

		// No deadline: a check waits for an evaluation slot as long as the
		// server lets it, then is answered 503. The watchdog only ends a
		// hung test.
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		watchdog := time.AfterFunc(45*time.Second, cancel)
		defer watchdog.Stop()

		type peak struct {
			goroutines, streams int
			heap, live          uint64
		}
		stopSampling, sampled := make(chan struct{}), make(chan peak, 1)
		go func() {
			var p peak
			// A dump of every goroutine's stack stops the world for long
			// (most of a second under -race): every 2 s, as the streams
			// stay at their bound while the checks queue.
			tick := time.NewTicker(25 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				p.heap, p.live = max(p.heap, ms.HeapInuse), max(p.live, liveHeap())
				p.goroutines = max(p.goroutines, runtime.NumGoroutine())
				if i%80 == 20 {
					p.streams = max(p.streams, servertest.Goroutines(streamFrames))
				}
				select {
				case <-stopSampling:
					sampled <- p
					return
				case <-tick.C:
				}
			}
		}()
		start := make(chan struct{})
		resps, errs := make([]*authv3.CheckResponse, checks), make([]error, checks)
		var wg sync.WaitGroup
		for i := range checks {
			wg.Go(func() {
				<-start
				resps[i], errs[i] = clients[i%conns].Check(ctx, read)
			})
		}
		began := time.Now()
		close(start)
		wg.Wait()
		took := time.Since(began)
		close(stopSampling)
		p := <-sampled

		var allows, overloads int
		for i := range checks {
			if errs[i] != nil {
				t.Fatalf("check %d: %v", i, errs[i])
			}
			switch v := verdictOf(t, resps[i]); {
			case v.Allowed:
				allows++
			case v.HTTP == http.StatusServiceUnavailable && v.Policy == "" && v.State == "":
				overloads++
			default:
				t.Fatalf("check %d: %+v, want an allow or the 503 overloaded deny", i, v)
			}
		}
		t.Logf("%d checks over %d connections in %v: %d allowed, %d overloaded; peak %d goroutines (%d before), %d serving streams (%d before), heap in use %d MiB (%d before), live heap %d MiB (%d before)",
			checks, conns, took.Round(time.Millisecond), allows, overloads, p.goroutines, goroutines0, p.streams, streams0,
			p.heap>>20, ms0.HeapInuse>>20, p.live>>20, live0>>20)
		if overloads == 0 {
			t.Errorf("no check was answered overloaded: the 503 path went untried")
		}
		if got := servertest.Metric(t, alice.reg, "policyd_authz_rejected_total", "reason", "overloaded") - overloaded0; int(got) != overloads {
			t.Errorf("policyd_authz_rejected_total{reason=overloaded} grew by %v, %d answers said overloaded", got, overloads)
		}
		if got := servertest.Metric(t, alice.reg, "policyd_authz_decisions_total", "api", "grpc", "result", "allow") - allowed0; int(got) != allows {
			t.Errorf("policyd_authz_decisions_total{api=grpc,result=allow} grew by %v, %d answers allowed", got, allows)
		}
		// The server holds at most MaxStreamsPerConn streams per connection,
		// so the rest queue in the clients' goroutines, which the test owns.
		if limit := conns*authz.MaxStreamsPerConn + 64; p.streams-streams0 > limit {
			t.Errorf("%d goroutines serving streams at the peak (%d before), want at most %d more", p.streams, streams0, limit)
		}
		if limit := checks + conns*authz.MaxStreamsPerConn + 512; p.goroutines-goroutines0 > limit {
			t.Errorf("%d goroutines at the peak (%d before), want at most %d more", p.goroutines, goroutines0, limit)
		}
		// Heap in use also holds the garbage of the last GC cycle, up to
		// as much again as the live heap (GOGC 100): the bound is on the
		// live heap, which the clients' 10,000 calls dominate.
		if grew := int64(p.live) - int64(live0); grew > 256<<20 {
			t.Errorf("live heap grew by %d MiB at the peak, want < 256 MiB", grew>>20)
		}
		// Nothing of the checks lingers in the server.
		if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { return servertest.Goroutines("policyd/internal/authz.(*Server).Check") == 0 })) != nil {
			t.Errorf("%d goroutines still in the authz server after the checks", servertest.Goroutines("policyd/internal/authz.(*Server).Check"))
		}
	})

	t.Run("revoking the employee denies everything", func(t *testing.T) {
		grpcReqs := []*authv3.CheckRequest{read, admin, write, adminWrite, stranger}
		httpReqs := []authz.CheckRequest{bash("ls"), bash("rm -rf /"), adminHTTP}
		alice.waitReady(t)
		if got := alice.check(t, read); got != allowed {
			t.Fatalf("before the revocation: %+v", got)
		}
		apiFor(t, c.nodes[1]).put("/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red","status":"inactive"}`))
		wrote := time.Now()
		if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool { return alice.check(t, read).State == string(client.StateRevoked) })) != nil {
			t.Fatalf("still %+v 5 s after the deactivation", alice.check(t, read))
		}
		t.Logf("revocation denied %v after the write's response", time.Since(wrote).Round(time.Millisecond))
		select {
		case err := <-alice.runErr:
			alice.runErr <- err // for the cleanup
			if !errors.Is(err, client.ErrRevoked) {
				t.Errorf("SDK Run = %v, want ErrRevoked", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("SDK Run did not return after the revocation")
		}
		alice.wantBlocked(t, client.StateRevoked, grpcReqs, httpReqs)
	})

	t.Run("every node stopped: cached set until grace, then deny", func(t *testing.T) {
		readHTTP, rm := authz.CheckRequest{Request: map[string]any{"method": "GET", "path": "/orders/7"}}, bash("rm -rf /")
		cached := struct {
			read, admin verdict
			rm          authz.CheckResponse
		}{allowed, policyDenial("acme.blue.gate", "blue has no admin", "NoAdmin"), authz.CheckResponse{Policy: "acme.deny-shell", Message: "no shell"}}
		bob.waitReady(t)
		if got := bob.check(t, read); got != cached.read {
			t.Fatalf("read before the stop: %+v", got)
		}
		if diff := cmp.Diff(cached.admin, bob.check(t, admin)); diff != "" {
			t.Fatalf("admin before the stop (-want +got):\n%s", diff)
		}
		if st := bob.sdk.State(); st != client.StateReady {
			t.Fatalf("bob's sidecar is %s before the stop", st)
		}
		select {
		case <-lost: // an earlier blip, since recovered
		default:
		}

		// Decided the moment the sidecar sees its node go: the cached set.
		type answers struct {
			lostAt, at time.Time
			read       *authv3.CheckResponse
			admin      *authv3.CheckResponse
			rm         response
			err        error
		}
		afterStop := make(chan answers, 1)
		go func() {
			var a answers
			defer func() { afterStop <- a }()
			select {
			case a.lostAt = <-lost:
			case <-time.After(30 * time.Second):
				a.err = errors.New("the sidecar never lost its node")
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			if a.read, a.err = bob.ext.Check(ctx, read); a.err != nil {
				return
			}
			if a.admin, a.err = bob.ext.Check(ctx, admin); a.err != nil {
				return
			}
			b, _ := json.Marshal(rm)
			a.rm, a.err = bob.post(ctx, "application/json", b)
			a.at = time.Now()
		}()
		// Bob's node last: stopping the others does not touch its stream.
		for _, i := range []int{0, 2, 1} {
			c.stop(i)
		}
		a := <-afterStop
		if a.err != nil {
			t.Fatalf("right after the stop: %v", a.err)
		}
		if took := a.at.Sub(a.lostAt); took >= grace {
			t.Fatalf("the checks right after the stop took %v, past the grace period", took)
		}
		if got := verdictOf(t, a.read); got != cached.read {
			t.Errorf("read right after the stop: %+v, want the cached allow", got)
		}
		if diff := cmp.Diff(cached.admin, verdictOf(t, a.admin)); diff != "" {
			t.Errorf("admin right after the stop (-want +got):\n%s", diff)
		}
		var rmGot authz.CheckResponse
		a.rm.decode(t, &rmGot)
		wantRM := cached.rm
		wantRM.State = string(client.StateDisconnected)
		if diff := cmp.Diff(wantRM, rmGot); a.rm.status != http.StatusOK || diff != "" {
			t.Errorf("rm right after the stop: %d (-want +got):\n%s", a.rm.status, diff)
		}

		if poll.Until(context.Background(), grace+5*time.Second, poll.Holds(func() bool { return bob.check(t, read).State == string(client.StateDisconnected) })) != nil {
			t.Fatalf("read still %+v %v after the sidecar lost its node", bob.check(t, read), grace+5*time.Second)
		}
		denied := time.Since(a.lostAt)
		t.Logf("denied %v after the sidecar lost its node (grace %v)", denied.Round(time.Millisecond), grace)
		if denied < grace-100*time.Millisecond {
			t.Errorf("denied %v after the loss, before the grace period of %v ended", denied, grace)
		}
		bob.wantBlocked(t, client.StateDisconnected, []*authv3.CheckRequest{read, admin, write, stranger}, []authz.CheckRequest{bash("ls"), rm, readHTTP})
	})
}
