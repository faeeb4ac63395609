// Package benchset holds the policy set and the requests that authz's
// benchmarks decide: the Go benchmarks in package authz and
// `go run ./bench authz` measure the same work.
package benchset

import (
	"encoding/json"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// Org is the org whose policies the sidecar follows.
const Org = "bench-authz"

// DenyingPolicy denies Request(true): the last ValidatingPolicy in name
// order, so every policy is evaluated before it.
const DenyingPolicy = Org + ".http-19"

// Policies is the set the sidecar decides with, by name: 20
// ValidatingPolicies of 5 validations over the request's method, path,
// headers, host, size and principals, and 20 ToolPolicies that deny with
// patterns.
func Policies() map[string][]byte {
	type validation struct {
		Expression string `json:"expression"`
		Message    string `json:"message"`
		Reason     string `json:"reason,omitempty"`
	}
	doc := func(name, kind string, spec any) []byte {
		b, err := json.Marshal(map[string]any{"name": name, "kind": kind, "scope": map[string]string{"org": Org}, "spec": spec})
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
		name := fmt.Sprintf("%s.http-%02d", Org, i)
		out[name] = doc(name, "ValidatingPolicy", map[string]any{"validations": []validation{
			{`request.method in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]`, "method not allowed", "MethodNotAllowed"},
			{fmt.Sprintf(`!request.path.startsWith("/internal/%d/")`, i), "internal path", "Forbidden"},
			{`"authorization" in request.headers && request.headers["authorization"].startsWith("Bearer ")`, "bearer token required", "Unauthorized"},
			{fmt.Sprintf(`request.source.principal.startsWith("spiffe://cluster.local/ns/") && !request.source.principal.endsWith("/sa/blocked-%d")`, i), "caller not allowed", ""},
			extra[i%len(extra)],
		}})
		name = fmt.Sprintf("%s.tool-%02d", Org, i)
		out[name] = doc(name, "ToolPolicy", map[string]any{
			"tool_name": tools[i%len(tools)], "action": "deny", "reason": fmt.Sprintf("bench rule %d", i),
			"conditions": map[string]any{"patterns": []string{fmt.Sprintf(`^rm -rf /%d`, i), fmt.Sprintf(`/etc/shadow%d\b`, i)}},
		})
	}
	return out
}

// Path is the path of the request of a case.
func Path(denied bool) string {
	if denied {
		return "/internal/19/metrics"
	}
	return "/api/v1/orders/12345?expand=items"
}

// Headers are the 11 headers Envoy forwards for an API call.
func Headers(path string) map[string]string {
	return map[string]string{
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
	}
}

// Request is what Envoy sends for an API call between two meshed
// services; denied asks for a path that DenyingPolicy forbids.
func Request(denied bool) *authv3.CheckRequest {
	path := Path(denied)
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
			Host: "api.example.com", Scheme: "https", Protocol: "HTTP/1.1",
			Headers: Headers(path),
		}},
		ContextExtensions: map[string]string{"virtual_host": "orders"},
	}}
}
