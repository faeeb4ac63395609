package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDecider decides with a function; the real SDK is exercised end to
// end in package server (authz_e2e_test.go).
type fakeDecider struct {
	mu     sync.Mutex
	state  client.State
	decide func(client.Request) client.Decision
	seen   []client.Request
}

func (f *fakeDecider) Evaluate(_ context.Context, r client.Request) client.Decision {
	f.mu.Lock()
	f.seen = append(f.seen, r)
	decide := f.decide
	f.mu.Unlock()
	if decide == nil {
		return client.Decision{Allowed: true}
	}
	return decide(r)
}

func (f *fakeDecider) State() client.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}
func (f *fakeDecider) Policies() []client.Policy { return nil }
func (f *fakeDecider) EvalErrors() uint64        { return 0 }

func newServer(t testing.TB, cfg Config, d Decider) *Server {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler), d, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func httpReq(method, path string, headers map[string]string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: method, Path: path, Host: "app.example", Scheme: "https", Protocol: "HTTP/1.1",
			Headers: headers, Id: "req-1", Size: -1,
		}},
	}}
}

func TestAttributes(t *testing.T) {
	lim := Limits{MaxHeaderBytes: 64, MaxBodyBytes: 8}
	full := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{
			Address:   &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "10.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 4711}}}},
			Principal: "spiffe://cluster.local/ns/a/sa/caller",
		},
		Destination:       &authv3.AttributeContext_Peer{Principal: "spiffe://cluster.local/ns/b/sa/app", Service: "app"},
		ContextExtensions: map[string]string{"route": "r1"},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/v1/x?y=1", Host: "h", Scheme: "http", Protocol: "HTTP/2",
			Headers: map[string]string{"x-role": "admin"}, Body: "{}", Size: 2, Id: "id",
		}},
	}}
	raw := func(hv ...*corev3.HeaderValue) *authv3.CheckRequest {
		return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{HeaderMap: &corev3.HeaderMap{Headers: hv}},
		}}}
	}
	rawBody := func(b []byte) *authv3.CheckRequest {
		return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{RawBody: b},
		}}}
	}
	tests := []struct {
		name    string
		req     *authv3.CheckRequest
		want    map[string]any // the keys compared; nil when rejected
		wantRej *rejection
	}{
		{
			name: "every attribute",
			req:  full,
			want: map[string]any{
				"method": "POST", "path": "/v1/x?y=1", "host": "h", "scheme": "http", "protocol": "HTTP/2",
				"headers": map[string]string{"x-role": "admin"}, "body": "{}", "size": int64(2), "id": "id",
				"source":            map[string]any{"address": "10.0.0.1:4711", "principal": "spiffe://cluster.local/ns/a/sa/caller", "service": "", "labels": map[string]string{}},
				"destination":       map[string]any{"address": "", "principal": "spiffe://cluster.local/ns/b/sa/app", "service": "app", "labels": map[string]string{}},
				"contextExtensions": map[string]string{"route": "r1"},
			},
		},
		{
			name: "empty request gives empty maps, not null",
			req:  &authv3.CheckRequest{},
			want: map[string]any{"headers": map[string]string{}, "contextExtensions": map[string]string{}},
		},
		{
			name: "raw headers are lower-cased and repeated ones joined",
			req:  raw(&corev3.HeaderValue{Key: "X-A", RawValue: []byte("1")}, &corev3.HeaderValue{Key: "x-a", Value: "2"}),
			want: map[string]any{"headers": map[string]string{"x-a": "1,2"}},
		},
		{
			name:    "raw header not UTF-8",
			req:     raw(&corev3.HeaderValue{Key: "x-bad", RawValue: []byte{0xff, 0xfe}}),
			wantRej: &rejection{400, reasonUTF8, `header "x-bad" is not valid UTF-8`},
		},
		{
			name:    "raw headers over the limit",
			req:     raw(&corev3.HeaderValue{Key: "x", RawValue: bytes.Repeat([]byte("a"), 64)}),
			wantRej: &rejection{431, reasonHeaders, "request headers exceed 64 bytes"},
		},
		{
			name:    "headers over the limit",
			req:     httpReq("GET", "/", map[string]string{"x": strings.Repeat("a", 64)}),
			wantRej: &rejection{431, reasonHeaders, "request headers exceed 64 bytes"},
		},
		{
			name:    "the path counts toward the headers",
			req:     httpReq("GET", "/"+strings.Repeat("p", 60), map[string]string{"x": "abc"}),
			wantRej: &rejection{431, reasonHeaders, "request headers exceed 64 bytes"},
		},
		{
			name:    "body over the limit",
			req:     rawBody([]byte("123456789")),
			wantRej: &rejection{413, reasonBody, "request body exceeds 8 bytes"},
		},
		{
			name: "raw body that is UTF-8 is also the body",
			req:  rawBody([]byte("abc")),
			want: map[string]any{"body": "abc", "rawBody": []byte("abc")},
		},
		{
			name: "raw body that is not UTF-8 is bytes only",
			req:  rawBody([]byte{0xff}),
			want: map[string]any{"body": nil, "rawBody": []byte{0xff}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, rej := attributes(tt.req, lim)
			if diff := cmp.Diff(tt.wantRej, rej, cmp.AllowUnexported(rejection{})); diff != "" {
				t.Fatalf("rejection (-want +got):\n%s", diff)
			}
			for k, want := range tt.want {
				if diff := cmp.Diff(want, got[k]); diff != "" {
					t.Errorf("request.%s (-want +got):\n%s", k, diff)
				}
			}
		})
	}
}

// serve runs s on loopback listeners and returns an ext_authz client and the
// HTTP base URL.
func serve(t *testing.T, s *Server) (authv3.AuthorizationClient, *grpc.ClientConn, string) {
	t.Helper()
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, Listeners{GRPC: gln, HTTP: hln}, prometheus.NewRegistry()) }()
	conn, err := grpc.NewClient(gln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	return authv3.NewAuthorizationClient(conn), conn, "http://" + hln.Addr().String()
}

// answer is what Envoy would do with a CheckResponse.
type answer struct {
	Code    codes.Code
	Status  int // HTTP status of a denial; 0 when allowed
	Body    string
	Headers map[string]string
}

func answerOf(r *authv3.CheckResponse) answer {
	a := answer{Code: codes.Code(r.GetStatus().GetCode())}
	if d := r.GetDeniedResponse(); d != nil {
		a.Status = int(d.GetStatus().GetCode())
		a.Body = d.GetBody()
		a.Headers = map[string]string{}
		for _, h := range d.GetHeaders() {
			a.Headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
	}
	return a
}

func TestCheck(t *testing.T) {
	onlyGet := func(r client.Request) client.Decision {
		if r.Request["method"] == "GET" {
			return client.Decision{Allowed: true}
		}
		return client.Decision{Policy: "only-get", Message: "only GET", Reason: "MethodNotAllowed"}
	}
	text := "text/plain; charset=utf-8"
	tests := []struct {
		name   string
		state  client.State
		decide func(client.Request) client.Decision
		req    *authv3.CheckRequest
		want   answer
	}{
		{"allowed", client.StateReady, onlyGet, httpReq("GET", "/", nil), answer{Code: codes.OK}},
		{
			"denied by a policy", client.StateReady, onlyGet, httpReq("DELETE", "/", nil),
			answer{codes.PermissionDenied, 403, "only GET", map[string]string{"content-type": text, HeaderPolicy: "only-get", HeaderReason: "MethodNotAllowed"}},
		},
		{
			"denied by the state", client.StateRevoked,
			func(client.Request) client.Decision { return client.Decision{Message: "access revoked"} },
			httpReq("GET", "/", nil),
			answer{codes.PermissionDenied, 403, "access revoked", map[string]string{"content-type": text, HeaderState: "revoked"}},
		},
		{
			"headers over the limit", client.StateReady, onlyGet, httpReq("GET", "/", map[string]string{"x": strings.Repeat("a", 70_000)}),
			answer{codes.InvalidArgument, 431, "request headers exceed 65536 bytes", map[string]string{"content-type": text}},
		},
		{
			"body over the limit", client.StateReady, onlyGet,
			&authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
				Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Body: strings.Repeat("b", DefaultMaxBodyBytes+1)},
			}}},
			answer{codes.InvalidArgument, 413, "request body exceeds 1048576 bytes", map[string]string{"content-type": text}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &fakeDecider{state: tt.state, decide: tt.decide}
			ac, _, _ := serve(t, newServer(t, Config{}, d))
			resp, err := ac.Check(context.Background(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, answerOf(resp)); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckOverMaxMessageIsAnError(t *testing.T) {
	d := &fakeDecider{state: client.StateReady}
	s := newServer(t, Config{Limits: Limits{MaxHeaderBytes: 1024, MaxBodyBytes: 1024}}, d)
	ac, _, _ := serve(t, s)
	big := httpReq("GET", "/", nil)
	big.Attributes.Request.Http.Body = strings.Repeat("b", 200<<10) // over 1 KiB + 1 KiB + 64 KiB
	if _, err := ac.Check(context.Background(), big); err == nil {
		t.Fatal("Check of an oversize message succeeded; want gRPC's refusal, which Envoy turns into a deny")
	}
	resp, err := ac.Check(context.Background(), httpReq("GET", "/", nil))
	if err != nil || answerOf(resp).Code != codes.OK {
		t.Fatalf("the next check = %v, %v; want OK", resp, err)
	}
}

func TestOverloadedIsAServiceUnavailableDeny(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	d := &fakeDecider{state: client.StateReady, decide: func(client.Request) client.Decision {
		entered <- struct{}{}
		<-release
		return client.Decision{Allowed: true}
	}}
	s := newServer(t, Config{MaxInFlight: 1}, d)
	ac, _, _ := serve(t, s)
	first := make(chan error, 1)
	go func() {
		_, err := ac.Check(context.Background(), httpReq("GET", "/", nil))
		first <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	// The server gives up waiting for a slot before the caller's deadline,
	// so the deny arrives rather than a timeout.
	resp, err := ac.Check(ctx, httpReq("GET", "/", nil))
	if err != nil {
		t.Fatalf("second check = %v; want a 503 deny before the deadline", err)
	}
	if a := answerOf(resp); a.Status != 503 {
		t.Fatalf("second check = %+v, want a 503 deny", a)
	}
	if poll.Until(context.Background(), 5*time.Second, poll.Holds(func() bool {
		return testutil.ToFloat64(s.metrics.rejected.WithLabelValues(reasonOverloaded)) == 1
	})) !=
		nil {
		t.Fatal("policyd_authz_rejected_total{reason=overloaded} did not reach 1")
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.seen) != 1 {
		t.Fatalf("the SDK evaluated %d requests; want only the first", len(d.seen))
	}
}

func TestHealthFollowsState(t *testing.T) {
	d := &fakeDecider{state: client.StateConnecting}
	s := newServer(t, Config{}, d)
	_, conn, base := serve(t, s)
	hc := healthpb.NewHealthClient(conn)
	check := func() (healthpb.HealthCheckResponse_ServingStatus, int) {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: authv3.Authorization_ServiceDesc.ServiceName})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return r.GetStatus(), resp.StatusCode
	}
	if st, code := check(); st != healthpb.HealthCheckResponse_NOT_SERVING || code != 503 {
		t.Fatalf("connecting: health %s, /readyz %d; want NOT_SERVING, 503", st, code)
	}
	d.mu.Lock()
	d.state = client.StateReady
	d.mu.Unlock()
	s.StateChanged(client.StateConnecting, client.StateReady)
	if st, code := check(); st != healthpb.HealthCheckResponse_SERVING || code != 200 {
		t.Fatalf("ready: health %s, /readyz %d; want SERVING, 200", st, code)
	}
}

func TestHTTPCheck(t *testing.T) {
	d := &fakeDecider{state: client.StateReady, decide: func(r client.Request) client.Decision {
		if r.Tool == "shell" {
			return client.Decision{Policy: "no-shell", Message: "no shell"}
		}
		return client.Decision{Allowed: true}
	}}
	s := newServer(t, Config{Limits: Limits{MaxHeaderBytes: 4096, MaxBodyBytes: 256}}, d)
	h := s.Handler(prometheus.NewRegistry())
	tests := []struct {
		name     string
		method   string
		body     string
		wantCode int
		wantBody string // a substring
	}{
		{"tool allowed", "POST", `{"tool":"read","input":{"path":"/"}}`, 200, `{"allowed":true,"state":"ready"}`},
		{"tool denied", "POST", `{"tool":"shell","input":{}}`, 200, `{"allowed":false,"policy":"no-shell","message":"no shell","state":"ready"}`},
		{"request", "POST", `{"request":{"method":"GET"}}`, 200, `"allowed":true`},
		{"malformed JSON", "POST", `{"tool":`, 400, `"code":"invalid"`},
		{"unknown field", "POST", `{"tool":"a","bogus":1}`, 400, `bogus: unknown field`},
		{"duplicate key", "POST", `{"tool":"a","tool":"b"}`, 400, `duplicate`},
		{"invalid UTF-8", "POST", "{\"tool\":\"\xff\"}", 400, `invalid UTF-8`},
		{"nothing to decide", "POST", `{}`, 400, `nothing to decide`},
		{"empty body", "POST", ``, 400, `empty body`},
		{"too large", "POST", `{"tool":"` + strings.Repeat("a", 300) + `"}`, 413, `exceeds 256 bytes`},
		{"wrong method", "GET", ``, 405, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, "/v1/check", strings.NewReader(tt.body)))
			if rec.Code != tt.wantCode || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Fatalf("got %d %s; want %d containing %s", rec.Code, rec.Body, tt.wantCode, tt.wantBody)
			}
		})
	}
	d.mu.Lock()
	got := d.seen[0]
	d.mu.Unlock()
	if diff := cmp.Diff(client.Request{Tool: "read", Input: map[string]any{"path": "/"}}, got); diff != "" {
		t.Errorf("request handed to the SDK (-want +got):\n%s", diff)
	}
}

func FuzzCheckRequest(f *testing.F) {
	seed, _ := proto.Marshal(httpReq("GET", "/x", map[string]string{"a": "b"}))
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x02, 0x2a, 0x00})
	s := newServer(f, Config{Limits: Limits{MaxHeaderBytes: 512, MaxBodyBytes: 512}}, &fakeDecider{state: client.StateReady})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req authv3.CheckRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			return
		}
		resp, err := s.Check(context.Background(), &req)
		if err != nil || resp.GetStatus() == nil {
			t.Fatalf("Check = %v, %v; every input gets an answer", resp, err)
		}
	})
}

func FuzzHTTPCheck(f *testing.F) {
	for _, s := range []string{`{"tool":"a","input":{"x":[1,{"y":null}]}}`, `{"request":{"method":"GET"}}`, `{`, "\xff", `{"object":1}`} {
		f.Add([]byte(s))
	}
	s := newServer(f, Config{Limits: Limits{MaxHeaderBytes: 512, MaxBodyBytes: 1024}}, &fakeDecider{state: client.StateReady})
	h := s.Handler(prometheus.NewRegistry())
	f.Fuzz(func(t *testing.T, b []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", bytes.NewReader(b)))
		switch rec.Code {
		case 200:
			var r CheckResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
				t.Fatalf("200 with %q: %v", rec.Body, err)
			}
		case 400, 413:
		default:
			t.Fatalf("status %d for %q", rec.Code, b)
		}
		_, _ = io.Copy(io.Discard, rec.Body)
	})
}
