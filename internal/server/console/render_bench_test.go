package console

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
)

// cannedAPI answers the admin API routes the overview, policies and
// sidecars pages read with canned JSON: the console's own cost, without
// the store's.
func cannedAPI(b *testing.B, policies, sidecars int) http.Handler {
	b.Helper()
	now := time.Now().UTC()
	pl := adminclient.PolicyList{AppliedIndex: 1}
	spec := json.RawMessage(`{"tool_name":"Bash","action":"deny","reason":"` + strings.Repeat("x", 4000) + `"}`)
	for i := range policies {
		pl.Policies = append(pl.Policies, adminclient.Policy{Name: fmt.Sprintf("o%d.p%d", i%20, i), Kind: "ToolPolicy",
			Scope: adminclient.Scope{Org: fmt.Sprintf("o%d", i%20)}, Spec: spec, Revision: uint64(i + 1), CreatedAt: now, UpdatedAt: now}) //nolint:gosec // i ≥ 0
	}
	cl := adminclient.ClientList{Total: sidecars, Counts: adminclient.ClientCounts{Acked: sidecars}}
	for i := range min(sidecars, 50) {
		cl.Clients = append(cl.Clients, adminclient.ClientInfo{Node: "n1", ClientAddress: fmt.Sprintf("c%d", i), Transport: "grpc",
			Org: "o1", Team: "t", Employee: fmt.Sprintf("e%d", i), Version: "v1", State: "acked", AckedVersion: "v1",
			ConnectedAt: now, LastActive: now})
	}
	routes := map[string]any{
		"/v1/cluster": adminclient.ClusterStatus{NodeID: "n1", State: "Leader", LeaderID: "n1",
			Members: []adminclient.Member{{ID: "n1", HTTPAddr: "127.0.0.1:1", Leader: true, Suffrage: "Voter"}}},
		"/v1/clients":  cl,
		"/v1/policies": pl,
		"/v1/rollouts": adminclient.StagedRolloutList{Rollouts: []adminclient.StagedRollout{}},
		"/v1/drift":    adminclient.DriftList{},
		"/v1/sources":  adminclient.SourceList{},
		"/v1/reload":   adminclient.ReloadView{},
	}
	summary := pl
	summary.Policies = nil
	for _, p := range pl.Policies {
		p.Spec = json.RawMessage("null")
		summary.Policies = append(summary.Policies, p)
	}
	routes["/v1/policies?summary=true"] = summary
	bodies := map[string][]byte{}
	for path, v := range routes {
		body, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		bodies[path] = body
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := bodies[r.URL.Path+"?"+r.URL.RawQuery]
		if !ok {
			body, ok = bodies[r.URL.Path]
		}
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":"not_found","message":"no such route in the fake API"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

// BenchmarkRender renders pages against cannedAPI with 1,000 policies and
// 20,000 sidecars (one page of them), auth off.
func BenchmarkRender(b *testing.B) {
	c, err := New(Config{}, slog.New(slog.DiscardHandler), cannedAPI(b, 1000, 20000))
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []struct{ name, path string }{{"overview", "/ui/"}, {"policies", "/ui/policies"}, {"sidecars", "/ui/sidecars"}} {
		path := p.path
		b.Run(p.name, func(b *testing.B) {
			bytes := 0
			for b.Loop() {
				w := httptest.NewRecorder()
				c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("GET %s: %d: %.300s", path, w.Code, w.Body.String())
				}
				bytes = w.Body.Len()
			}
			b.ReportMetric(float64(bytes), "html-bytes")
		})
	}
}
