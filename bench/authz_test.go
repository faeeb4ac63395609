package main

import (
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/policyd/policyd/internal/authz"
	"github.com/policyd/policyd/internal/authz/benchset"
	"github.com/policyd/policyd/internal/policy"
)

func TestCheckGRPCAnswer(t *testing.T) {
	denial := func(code codes.Code, httpStatus int, headers ...string) *authv3.CheckResponse {
		var hs []*corev3.HeaderValueOption
		for i := 0; i+1 < len(headers); i += 2 {
			hs = append(hs, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: headers[i], Value: headers[i+1]}})
		}
		return &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(code)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode(httpStatus)}, Headers: hs}},
		}
	}
	ok := &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)}}
	tests := []struct {
		name    string
		resp    *authv3.CheckResponse
		denied  bool
		wantErr string
	}{
		{"allowed", ok, false, ""},
		{"allowed, want denied", ok, true, "want PERMISSION_DENIED"},
		{"denied, want allowed", denial(codes.PermissionDenied, 403, authz.HeaderPolicy, benchset.DenyingPolicy), false, "want OK"},
		{"denied by the policy", denial(codes.PermissionDenied, 403, "content-type", "text/plain", authz.HeaderPolicy, benchset.DenyingPolicy), true, ""},
		{"denied by another policy", denial(codes.PermissionDenied, 403, authz.HeaderPolicy, "x"), true, "denied by x"},
		{"denied by the state", denial(codes.PermissionDenied, 403, authz.HeaderState, "connecting"), true, "without x-policyd-policy"},
		{"overloaded", denial(codes.Unavailable, 503, authz.HeaderPolicy, benchset.DenyingPolicy), true, "want PERMISSION_DENIED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, checkGRPCAnswer(tt.resp, tt.denied), tt.wantErr)
		})
	}
}

func TestCheckHTTPAnswer(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		denied  bool
		wantErr string
	}{
		{"allowed", 200, `{"allowed":true,"state":"ready"}`, false, ""},
		{"denied by the policy", 200, `{"allowed":false,"policy":"` + benchset.DenyingPolicy + `","message":"internal path","state":"ready"}`, true, ""},
		{"allowed, want denied", 200, `{"allowed":true,"state":"ready"}`, true, "allowed true, want false"},
		{"denied, want allowed", 200, `{"allowed":false,"policy":"p","error":"no such key","state":"ready"}`, false, `"no such key"`},
		{"denied by another policy", 200, `{"allowed":false,"policy":"p","state":"ready"}`, true, `denied by "p"`},
		{"denied by the state", 200, `{"allowed":false,"state":"connecting"}`, true, `denied by ""`},
		{"bad request", 400, `{"error":{"code":"invalid_request"}}`, false, "status 400"},
		{"not JSON", 200, `<html>`, false, "decode answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, checkHTTPAnswer(tt.status, []byte(tt.body), tt.denied), tt.wantErr)
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("error %v, want none", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("error %v, want one containing %q", err, want)
	}
}

// The HTTP body must pass the server's strict decoder, with both kinds of
// policy to evaluate.
func TestAuthzHTTPBody(t *testing.T) {
	for _, denied := range []bool{false, true} {
		var req authz.CheckRequest
		if err := policy.DecodeStrict(authzHTTPBody(denied), &req); err != nil {
			t.Fatalf("denied=%v: %v", denied, err)
		}
		if req.Tool == "" || req.Request["path"] != benchset.Path(denied) {
			t.Errorf("denied=%v: tool %q, path %v", denied, req.Tool, req.Request["path"])
		}
	}
	if got := benchset.Request(true).GetAttributes().GetRequest().GetHttp().GetPath(); got != benchset.Path(true) {
		t.Errorf("gRPC deny path = %q", got)
	}
	if n := len(benchset.Request(false).GetAttributes().GetRequest().GetHttp().GetHeaders()); n < 10 {
		t.Errorf("%d headers, want a realistic 10 or more", n)
	}
}

func TestAuthzValidate(t *testing.T) {
	good := func() authzConfig {
		return authzConfig{requests: 10, warmup: 0, concurrency: 2, conns: 1, duration: time.Second,
			httpRequests: 1, httpDuration: time.Second, authzCPUs: "1"}
	}
	tests := []struct {
		name    string
		mutate  func(*authzConfig)
		wantErr string
	}{
		{"good", func(*authzConfig) {}, ""},
		{"not pinned", func(c *authzConfig) { c.authzCPUs = "" }, ""},
		{"no requests", func(c *authzConfig) { c.requests = 0 }, "-requests"},
		{"no conns", func(c *authzConfig) { c.conns = 0 }, "-conns"},
		{"negative warm-up", func(c *authzConfig) { c.warmup = -1 }, "-warmup"},
		{"no duration", func(c *authzConfig) { c.duration = 0 }, "-duration"},
		{"no HTTP duration", func(c *authzConfig) { c.httpDuration = 0 }, "-http-duration"},
		{"bad CPU list", func(c *authzConfig) { c.authzCPUs = "one" }, "-authz-cpus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.mutate(&c)
			checkErr(t, c.validate(), tt.wantErr)
		})
	}
}

// fill summarizes by nearest rank, and only a figure with a target reports one.
func TestAuthzFigureTarget(t *testing.T) {
	f := &authzFigure{Scenario: "authz", API: "grpc", Case: "allow", Policies: 40}
	lat := []time.Duration{}
	for i := range 1000 {
		lat = append(lat, time.Duration(100+i)*time.Microsecond)
	}
	f.fill(lat, time.Second)
	if f.Checks != 1000 || f.DecisionsPerS != 1000 || f.P50Ms != 0.599 || f.P99Ms != 1.089 || f.P999Ms != 1.098 || f.MaxMs != 1.099 {
		t.Fatalf("fill: %+v", f)
	}
	if got := f.targets(); got != nil {
		t.Errorf("targets without a target = %v", got)
	}
	f.Target, f.TargetMet = "p99 ≤ 1 ms", false
	if got := f.targets(); len(got) != 1 || got[0].Met || !strings.Contains(got[0].Measured, "p99 1.089 ms") {
		t.Errorf("targets = %+v", got)
	}
	if row, cols := f.row(), f.columns(); len(row) != len(cols) {
		t.Errorf("%d cells for %d columns", len(row), len(cols))
	}
	if row, cols := (&authzIdleFigure{}).row(), (&authzIdleFigure{}).columns(); len(row) != len(cols) {
		t.Errorf("idle: %d cells for %d columns", len(row), len(cols))
	}
}
