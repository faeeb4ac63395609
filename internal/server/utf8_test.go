package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// These tests send text that is not valid UTF-8 in every kind of field to
// every listener of a real node (auth.mode jwt): the admin REST API, the
// WebSocket feed and the sidecar gRPC port. Each request is refused with
// 400 (InvalidArgument) naming the field, and nothing is stored.

// rawCodec sends []byte as it is, so that a test can send what protobuf-go
// refuses to marshal.
type rawCodec struct{ encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

var sendRaw = grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(protoenc.Name)})

// wireString appends string field num, whatever its bytes.
func wireString(b []byte, num protowire.Number, v string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// wireMessage appends message field num holding inner.
func wireMessage(b []byte, num protowire.Number, inner []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), inner)
}

func TestInvalidUTF8IsRefusedOnEveryListener(t *testing.T) {
	n, a := singleNode(t, jwtMode(t))
	a.put("/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red","status":"active"}`))
	digest, _, err := n.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	token := signJWT(t, "alice", "acme", "red", time.Hour)

	t.Run("admin REST", func(t *testing.T) {
		policy := func(inner string) string {
			return `{"name":"acme.u","kind":"ToolPolicy","labels":{"team":"red"},"spec":{"tool_name":"Bash","action":"deny",` + inner + `}}`
		}
		tests := []struct {
			name, method, path, body, field string
		}{
			{"body: value", "PUT", "/v1/policies/acme.u", policy("\"reason\":\"a\xffb\""), "body: spec.reason"},
			{"body: array element", "PUT", "/v1/policies/acme.u", policy(`"conditions":{"patterns":["ok","x` + "\xc3" + `"]}`), "body: spec.conditions.patterns[1]"},
			{"body: lone surrogate escape", "PUT", "/v1/policies/acme.u", policy(`"reason":"\ud800"`), "body: spec.reason"},
			{"body: member name", "PUT", "/v1/policies/acme.u", `{"name":"acme.u","kind":"ToolPolicy","labels":{"` + "\xfe" + `":"x"},"spec":{}}`, "body: a member name in labels"},
			{"body: top-level field", "PUT", "/v1/policies/acme.u", `{"name":"acme.u` + "\xff" + `","kind":"ToolPolicy","spec":{}}`, "body: name"},
			{"employee body", "PUT", "/v1/employees/bob", `{"id":"bob","org":"acme","team":"r` + "\xe2\x82" + `","status":"active"}`, "body: team"},
			{"join body", "POST", "/v1/cluster/join", `{"id":"n` + "\xff" + `","raft_addr":"127.0.0.1:1"}`, "body: id"},
			{"path parameter", "GET", "/v1/policies/acme.%FF", "", "path parameter name"},
			{"path parameter of a write", "PUT", "/v1/employees/b%C3", `{"org":"acme","status":"active"}`, "path parameter id"},
			{"path parameter of a delete", "DELETE", "/v1/cluster/members/n%FF", "", "path parameter id"},
			{"query parameter", "GET", "/v1/policies?org=%FF", "", "query parameter org"},
			{"query parameter name", "GET", "/v1/events?%FE=1", "", "a query parameter name"},
			{"second query value", "GET", "/v1/employees?org=acme&team=red&team=%C3", "", "query parameter team"},
			{"unrouted path", "GET", "/v1/%FF", "", "the path"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				var body []byte
				if tc.body != "" {
					body = []byte(tc.body)
				}
				r := a.do(tc.method, tc.path, body, nil)
				if r.status != http.StatusBadRequest || r.errCode(t) != "invalid" {
					t.Fatalf("%s %s: %d %s, want 400 invalid", tc.method, tc.path, r.status, r.body)
				}
				var env struct{ Error struct{ Message string } }
				r.decode(t, &env)
				if want := tc.field + " is not valid UTF-8"; !strings.Contains(env.Error.Message, want) {
					t.Fatalf("message %q does not say %q", env.Error.Message, want)
				}
			})
		}
	})

	t.Run("feed handshake", func(t *testing.T) {
		tests := []struct{ name, query, field string }{
			{"since", "since=%FF", "query parameter since"},
			{"another parameter", "since=1&x=a%C3", "query parameter x"},
			{"parameter name", "%FE=1", "a query parameter name"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				hc := &http.Client{Transport: &http.Transport{}}
				defer hc.CloseIdleConnections()
				ws, resp, err := websocket.Dial(ctx, "ws://"+n.HTTPAddr()+feedv1.Path+"?"+tc.query, &websocket.DialOptions{ //nolint:bodyclose // Dial owns the response body
					HTTPClient: hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
				})
				if err == nil {
					_ = ws.CloseNow()
					t.Fatalf("?%s accepted", tc.query)
				}
				if resp == nil || resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("?%s: %v, want 400", tc.query, err)
				}
				var env struct {
					Error struct{ Code, Message string }
				}
				body, _ := io.ReadAll(resp.Body)
				if err := json.Unmarshal(body, &env); err != nil || env.Error.Code != "invalid" ||
					!strings.Contains(env.Error.Message, tc.field+" is not valid UTF-8") {
					t.Fatalf("?%s: body %s, want the invalid envelope naming %s", tc.query, body, tc.field)
				}
			})
		}
	})

	t.Run("feed frames", func(t *testing.T) {
		tests := []struct {
			name  string
			frame string
			field string
		}{
			{"invalid bytes in a pong", "{\"type\":\"pong\",\"x\":\"\xff\"}", "x"},
			{"lone surrogate in a pong", `{"type":"pong","x":{"y":"\udc00"}}`, "x.y"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				c, status := feedE2EDial(t, n, token)
				if c == nil {
					t.Fatalf("handshake refused: %d", status)
				}
				c.nextOf(feedv1.TypeInit)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := c.ws.Write(ctx, websocket.MessageText, []byte(tc.frame)); err != nil {
					t.Fatal(err)
				}
				select {
				case <-c.done:
				case <-time.After(5 * time.Second):
					t.Fatal("connection still open")
				}
				var ce websocket.CloseError
				if !errors.As(c.err, &ce) || ce.Code != feedv1.CloseInvalidMessage || ce.Reason != tc.field+" is not valid UTF-8" {
					t.Fatalf("closed with %v, want %d naming %s", c.err, feedv1.CloseInvalidMessage, tc.field)
				}
			})
		}
	})

	t.Run("sidecar gRPC", func(t *testing.T) {
		cc := dialGRPC(t, n.GRPCAddr())
		scope := func(field protowire.Number, v string) []byte {
			return wireMessage(wireString(nil, 1, "c-utf8"), 5, wireString(wireString(nil, 1, "acme"), field, v))
		}
		tests := []struct {
			name  string
			req   []byte
			field string
		}{
			{"client_address", wireString(nil, 1, "c\xff"), "client_address"},
			{"version_info", wireString(wireString(nil, 1, "c-utf8"), 2, "v\xc3"), "version_info"},
			{"response_nonce", wireString(wireString(nil, 1, "c-utf8"), 3, "\xfe"), "response_nonce"},
			{"error_detail.message", wireMessage(wireString(nil, 1, "c-utf8"), 4, wireString(nil, 1, "bad \xff")), "error_detail.message"},
			{"scope.org", wireMessage(wireString(nil, 1, "c-utf8"), 5, wireString(nil, 1, "\xff")), "scope.org"},
			{"scope.team", scope(2, "r\xffd"), "scope.team"},
			{"scope.employee", scope(3, "\xe2\x82"), "scope.employee"},
		}
		for _, tc := range tests {
			t.Run("stream "+tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(bearer(context.Background(), token), 10*time.Second)
				defer cancel()
				st, err := cc.NewStream(ctx, &discoveryv1.PolicyDiscoveryService_ServiceDesc.Streams[0],
					discoveryv1.PolicyDiscoveryService_StreamPolicies_FullMethodName, sendRaw)
				if err != nil {
					t.Fatal(err)
				}
				if err := st.SendMsg(tc.req); err != nil {
					t.Fatal(err)
				}
				var resp discoveryv1.PolicyDiscoveryResponse
				checkInvalidArgument(t, st.RecvMsg(&resp), tc.field)
			})
		}
		t.Run("HealthCheck client_address", func(t *testing.T) {
			var resp discoveryv1.HealthCheckResponse
			err := cc.Invoke(bearer(context.Background(), token), discoveryv1.PolicyDiscoveryService_HealthCheck_FullMethodName,
				wireString(nil, 1, "c\xff"), &resp, sendRaw)
			checkInvalidArgument(t, err, "client_address")
		})
		t.Run("grpc.health.v1 service", func(t *testing.T) {
			var resp healthpb.HealthCheckResponse
			err := cc.Invoke(context.Background(), healthpb.Health_Check_FullMethodName, wireString(nil, 1, "\xff"), &resp, sendRaw)
			checkInvalidArgument(t, err, "service")
		})
		for _, cl := range a.clients().Clients {
			if strings.HasPrefix(cl.ClientAddress, "c") && cl.Transport == "grpc" {
				t.Errorf("a refused stream is listed: %+v", cl)
			}
		}
	})

	after, _, err := n.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if after != digest {
		t.Fatal("the state changed after the refused requests")
	}
}

func checkInvalidArgument(t *testing.T, err error, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || st.Message() != "invalid request: "+field+" is not valid UTF-8" {
		t.Fatalf("got %v, want InvalidArgument naming %s", err, field)
	}
}
