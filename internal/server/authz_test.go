package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
)

// authzSample is how TestRouteRoleMatrix calls one route: a concrete path,
// a body, and the status an authorized caller gets (0: any status that is not
// 401 or 403, for routes whose answer depends on other features' state).
type authzSample struct {
	path string
	body string
	want int
	// planned marks routes docs/api.md lists that may not be registered
	// yet; an entry for any other unregistered route is stale and fails.
	planned bool
	// adminOnly marks reads that expose more than state (a full database
	// copy, process profiles): they need the admin role.
	adminOnly bool
	// noBody marks writes that read no request body (an action named by
	// the path alone); every other write must decode its body strictly.
	noBody bool
	// signed marks a write that takes no token: its body's signature is
	// its credential (a Git host's webhook), checked by the route itself.
	signed bool
}

// authzSamples has one entry per registered route. A route added to the API
// without an entry here fails TestRouteRoleMatrix: every route must be shown
// to enforce its role.
var authzSamples = map[string]authzSample{
	"GET /livez":   {path: "/livez", want: 200},
	"GET /healthz": {path: "/healthz", want: 200},
	"GET /readyz":  {path: "/readyz", want: 200},
	"GET /metrics": {path: "/metrics", want: 200},

	"GET /v1/policies":           {path: "/v1/policies?org=acme", want: 200},
	"GET /v1/policies/{name}":    {path: "/v1/policies/authz-get", want: 200},
	"PUT /v1/policies/{name}":    {path: "/v1/policies/authz-put", body: string(toolPolicy("authz-put", "acme", "authz")), want: 200},
	"DELETE /v1/policies/{name}": {path: "/v1/policies/authz-del", want: 200},
	// Revision 1 is the bootstrap's configuration entry, never a policy's
	// or an employee's: a 404 proves the role check passed.
	"GET /v1/policies/{name}/history":         {path: "/v1/policies/authz-get/history", want: 200},
	"GET /v1/policies/{name}/revisions/{rev}": {path: "/v1/policies/authz-get/revisions/1", want: 404},
	"POST /v1/policies/{name}/revert":         {path: "/v1/policies/authz-get/revert", body: `{"to":1}`, want: 404},
	"GET /v1/policies/{name}/shadow":          {path: "/v1/policies/authz-get/shadow", want: 200},

	"GET /v1/employees":                      {path: "/v1/employees", want: 200},
	"GET /v1/employees/{id}":                 {path: "/v1/employees/authz-get", want: 200},
	"PUT /v1/employees/{id}":                 {path: "/v1/employees/authz-put", body: `{"org":"acme","team":"red"}`, want: 200},
	"DELETE /v1/employees/{id}":              {path: "/v1/employees/authz-del", want: 200},
	"GET /v1/employees/{id}/history":         {path: "/v1/employees/authz-get/history", want: 200},
	"GET /v1/employees/{id}/revisions/{rev}": {path: "/v1/employees/authz-get/revisions/1", want: 404},
	"POST /v1/employees/{id}/revert":         {path: "/v1/employees/authz-get/revert", body: `{"to":1}`, want: 404},

	"GET /v1/events":       {path: "/v1/events?limit=5", want: 200},
	"GET /v1/events/watch": {path: "/v1/events/watch", want: 200},

	"GET /v1/cluster": {path: "/v1/cluster", want: 200},
	// An incomplete join proves the role check passed without adding a
	// voter that would cost this one-node cluster its quorum.
	"POST /v1/cluster/join":           {path: "/v1/cluster/join", body: `{"id":"authz-node"}`, want: 400},
	"DELETE /v1/cluster/members/{id}": {path: "/v1/cluster/members/no-such-node", want: 404},

	// A one-node cluster has no voter to hand leadership to.
	"POST /v1/cluster/transfer-leader": {path: "/v1/cluster/transfer-leader", body: `{"id":"solo"}`, want: 409},
	"GET /v1/version":                  {path: "/v1/version", want: 200},

	"GET /v1/clients":      {path: "/v1/clients", want: 200},
	"GET /v1/proxy-status": {path: "/v1/proxy-status", want: 200},
	"GET /v1/rollout":      {path: "/v1/rollout", want: 200},

	"POST /v1/rollouts": {path: "/v1/rollouts", want: 201,
		body: `{"changes":[{"op":"put","policy":` + string(toolPolicy("authz-rollout", "acme", "x")) + `}],"stages":[{"percent":100,"bake":"1h"}]}`},
	"GET /v1/rollouts":  {path: "/v1/rollouts?state=all", want: 200},
	"GET /v1/decisions": {path: "/v1/decisions?limit=10", want: 200},
	"POST /v1/impact": {path: "/v1/impact", want: 200,
		body: `{"changes":[{"op":"put","policy":` + string(toolPolicy("authz-impact", "acme", "x")) + `}]}`},
	"GET /v1/rollouts/{id}": {path: "/v1/rollouts/r0", want: 404},
	// No such rollout: a 404 proves the role check passed.
	"POST /v1/rollouts/{id}/pause":   {path: "/v1/rollouts/r0/pause", want: 404, noBody: true},
	"POST /v1/rollouts/{id}/resume":  {path: "/v1/rollouts/r0/resume", want: 404, noBody: true},
	"POST /v1/rollouts/{id}/promote": {path: "/v1/rollouts/r0/promote", want: 404, noBody: true},
	"POST /v1/rollouts/{id}/abort":   {path: "/v1/rollouts/r0/abort", want: 404, noBody: true},

	// No source is configured on this node: 404 proves the role check
	// passed (the hook's 404 comes before any signature check).
	"GET /v1/sources":              {path: "/v1/sources", want: 200},
	"GET /v1/sources/{name}":       {path: "/v1/sources/kubernetes", want: 404},
	"POST /v1/sources/{name}/sync": {path: "/v1/sources/kubernetes/sync", want: 404, noBody: true},
	"POST /v1/sources/{name}/hook": {path: "/v1/sources/policies/hook", body: `{"ref":"refs/heads/main"}`, want: 404, noBody: true, signed: true},
	"GET /v1/reload":               {path: "/v1/reload", planned: true},
	"GET /v1/drift":                {path: "/v1/drift", planned: true},
	"GET /v1/snapshot":             {path: "/v1/snapshot", want: 200, adminOnly: true},

	"GET /debug/pprof/":        {path: "/debug/pprof/", want: 200, adminOnly: true},
	"GET /debug/pprof/cmdline": {path: "/debug/pprof/cmdline", want: 200, adminOnly: true},
	"GET /debug/pprof/profile": {path: "/debug/pprof/profile?seconds=1", want: 200, adminOnly: true},
	"GET /debug/pprof/symbol":  {path: "/debug/pprof/symbol", want: 200, adminOnly: true},
	"GET /debug/pprof/trace":   {path: "/debug/pprof/trace?seconds=1", want: 200, adminOnly: true},
}

// TestRouteRoleMatrix walks every route the admin API registers (from its
// own route table) with no token, a bad token, a read token and an admin
// token: reads need read (admin for the sensitive ones marked adminOnly),
// writes need admin, only the probes are open, and a refused request changes
// nothing.
func TestRouteRoleMatrix(t *testing.T) {
	const (
		readToken  = "reader-token-0123456789abcdef"
		adminToken = "admin-token-0123456789abcdef"
	)
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("read "+readToken+" ci\nadmin "+adminToken+" ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, a := singleNode(t, func(c *config.Config) { c.Auth.AdminTokensFile = path })
	admin := map[string]string{"Authorization": "Bearer " + adminToken}
	for _, setup := range []struct{ path, body string }{
		{"/v1/policies/authz-get", string(toolPolicy("authz-get", "acme", "x"))},
		{"/v1/policies/authz-del", string(toolPolicy("authz-del", "acme", "x"))},
		{"/v1/employees/authz-get", `{"org":"acme"}`},
		{"/v1/employees/authz-del", `{"org":"acme"}`},
	} {
		if r := a.do(http.MethodPut, setup.path, []byte(setup.body), admin); r.status != http.StatusOK {
			t.Fatalf("setup PUT %s: %d %s", setup.path, r.status, r.body)
		}
	}

	routes := n.api.Routes()
	registered := map[string]bool{}
	for _, r := range routes {
		registered[r.Pattern] = true
	}
	for pattern, s := range authzSamples {
		if !registered[pattern] && !s.planned {
			t.Errorf("authzSamples has %q, which the API does not register: remove the stale entry", pattern)
		}
	}
	if len(routes) < 15 {
		t.Fatalf("the API lists only %d routes; the route table is not being recorded", len(routes))
	}

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	base := "http://" + n.HTTPAddr()
	for _, route := range routes {
		t.Run(route.Pattern, func(t *testing.T) {
			s, ok := authzSamples[route.Pattern]
			if !ok {
				t.Fatalf("no authzSamples entry for %q: add one, so that its role is tested", route.Pattern)
			}
			method, _, _ := strings.Cut(route.Pattern, " ")
			write := method != http.MethodGet && method != http.MethodHead
			// needAdmin: what a read token must be refused.
			needAdmin := write || s.adminOnly
			switch {
			case s.signed && route.Role >= 0:
				t.Fatalf("signed route needs role %v, want open (its signature is its credential)", route.Role)
			case s.signed:
			case needAdmin && route.Role != auth.RoleAdmin:
				t.Fatalf("route needs role %v, want admin", route.Role)
			case !needAdmin && route.Role != auth.RoleRead && !isProbe(route.Pattern):
				t.Fatalf("read route needs role %v, want read (only /livez, /healthz and /readyz are open)", route.Role)
			case isProbe(route.Pattern) && route.Role >= 0:
				t.Fatalf("probe needs role %v, want open", route.Role)
			}

			call := func(token string) (int, http.Header, []byte) {
				t.Helper()
				return authzCall(t, hc, method, base+s.path, s.body, token)
			}
			// Refused calls first: they must leave the resource as it is
			// for the admin call at the end.
			before, _, err := n.store.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if route.Role < 0 {
				if status, _, body := call(""); status != s.want {
					t.Fatalf("open route without a token: %d %s, want %d", status, body, s.want)
				}
				return
			}
			for _, tc := range []struct{ name, token string }{{"no token", ""}, {"unknown token", "wrong-token-0123456789abcdef"}} {
				status, hdr, body := call(tc.token)
				if status != http.StatusUnauthorized {
					t.Fatalf("%s: %d %s, want 401", tc.name, status, body)
				}
				if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("%s: 401 without a Bearer challenge: %q", tc.name, hdr.Get("WWW-Authenticate"))
				}
				authzEnvelope(t, body, "unauthorized")
			}
			status, _, body := call(readToken)
			switch {
			case needAdmin && status != http.StatusForbidden:
				t.Fatalf("read token on an admin route: %d %s, want 403", status, body)
			case needAdmin:
				authzEnvelope(t, body, "forbidden")
			case s.want != 0 && status != s.want, s.want == 0 && (status == 401 || status == 403):
				t.Fatalf("read token on a read: %d %s, want %d", status, body, s.want)
			}
			if after, _, err := n.store.Digest(); err != nil || after != before {
				t.Fatalf("refused requests changed the state (digest %.8s → %.8s, err %v)", before, after, err)
			}
			status, _, body = call(adminToken)
			if s.want != 0 && status != s.want || s.want == 0 && (status == 401 || status == 403) {
				t.Fatalf("admin token: %d %s, want %d", status, body, s.want)
			}
		})
	}
}

var probePattern = regexp.MustCompile(`^GET /(livez|healthz|readyz)$`)

func isProbe(pattern string) bool { return probePattern.MatchString(pattern) }

// authzCall makes one request and returns its status, headers and (up to
// 64 KiB of) body. Streaming answers (event watches) end when the body
// stops arriving for a moment: only the status matters.
func authzCall(t *testing.T, hc *http.Client, method, url, body, token string) (int, http.Header, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		return resp.StatusCode, resp.Header, nil
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, io.LimitReader(resp.Body, 64<<10)); err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, buf.Bytes()
}

// authzEnvelope fails unless body is the error envelope with code.
func authzEnvelope(t *testing.T, body []byte, code string) {
	t.Helper()
	var env struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Error.Code != code || env.Error.Message == "" {
		t.Errorf("body %s is not an error envelope with code %q (%v)", body, code, fmt.Sprint(err))
	}
}
