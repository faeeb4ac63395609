package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/authz"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// decisionSecret is a bearer token the sidecars' requests carry, which
// masking must keep out of every stored byte.
const decisionSecret = "s3cr3t-bearer-7f9a2c"

// denyBashPolicy is an enforced ToolPolicy of org acme denying Bash calls
// that match pattern.
func denyBashPolicy(name, pattern string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{
		"name": name, "kind": "ToolPolicy", "scope": map[string]string{"org": "acme"},
		"spec": map[string]any{"tool_name": "Bash", "action": "deny", "conditions": map[string]any{"patterns": []string{pattern}}},
	})
	return b
}

// TestDecisionLogE2E: SDK sidecars on two nodes of a 3-node cluster, one
// over gRPC (team blue) and one over the feed (team red), log every
// decision. The records reach GET /v1/decisions asked of the third node,
// with filters; no stored byte holds the secret header; an impact replay
// of a draft denying rm reports exactly the logged rm calls as allow→deny
// per team; a rollout gated on that impact is refused; and a node killed
// before a query is named while the others' records are still served.
func TestDecisionLogE2E(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.leader())
	if r := a.do(http.MethodPut, "/v1/policies/acme.deny-curl", denyBashPolicy("acme.deny-curl", "curl"), nil); r.status != http.StatusOK {
		t.Fatalf("PUT policy: %d %s", r.status, r.body)
	}
	if r := a.do(http.MethodPut, "/v1/employees/e1", []byte(`{"org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	c.waitConverged()

	all := 1.0
	dl := func() *client.DecisionLog {
		return &client.DecisionLog{AllowSampleRate: &all, FlushInterval: 100 * time.Millisecond}
	}
	g := startSDK(t, client.Config{Servers: []string{c.nodes[1].GRPCAddr()}, ClientAddress: "sc-grpc",
		Scope: client.Scope{Org: "acme", Team: "blue"}, DecisionLog: dl()})
	w := startSDK(t, client.Config{Servers: []string{c.nodes[2].HTTPAddr()}, Transport: client.TransportWS,
		Employee: "e1", DecisionLog: dl()})
	for _, s := range []*sdkRun{g, w} {
		s.hasPolicy(t, "acme.deny-curl")
	}

	// 100 requests each: a tenth rm (allowed now), a tenth curl (denied).
	for _, s := range []*sdkRun{g, w} {
		for i := range 100 {
			cmd := "ls"
			switch i % 10 {
			case 0:
				cmd = "rm -rf /tmp/x"
			case 1:
				cmd = "curl example.com"
			}
			s.Evaluate(context.Background(), client.Request{Tool: "Bash", Input: map[string]any{"command": cmd},
				Request: map[string]any{"method": "POST", "path": "/run", "headers": map[string]any{"Authorization": "Bearer " + decisionSecret}}})
		}
	}

	// Asked of node 0, which holds no sidecar: every record comes over
	// the peer plane.
	a0 := apiFor(t, c.nodes[0])
	var page decisionsv1.Page
	get := func(query string) (decisionsv1.Page, error) {
		r := a0.do(http.MethodGet, "/v1/decisions?"+query, nil, nil)
		if r.status != http.StatusOK {
			return decisionsv1.Page{}, fmt.Errorf("GET /v1/decisions?%s: %d %s", query, r.status, r.body)
		}
		var p decisionsv1.Page
		r.decode(t, &p)
		return p, nil
	}
	poll.Eventually(t, "200 decisions in the cluster's log", func() error {
		var err error
		if page, err = get("limit=1000"); err != nil {
			return err
		}
		if len(page.Records) != 200 || page.Cursor != "" || len(page.Unavailable) > 0 {
			return fmt.Errorf("%d records, cursor %q, unavailable %v", len(page.Records), page.Cursor, page.Unavailable)
		}
		return nil
	}, poll.Within(20*time.Second))

	type from struct{ Node, Transport, Org, Team, Employee string }
	count := map[from]int{}
	for i, r := range page.Records {
		count[from{r.Node, r.Transport, r.Org, r.Team, r.Employee}]++
		if i > 0 && r.Time.After(page.Records[i-1].Time) {
			t.Fatalf("record %d at %v after record %d at %v: want newest first", i, r.Time, i-1, page.Records[i-1].Time)
		}
		if !r.Masked || strings.Contains(fmt.Sprint(r.Request.HTTP), decisionSecret) {
			t.Fatalf("record %d not masked: %+v", i, r.Request.HTTP)
		}
	}
	want := map[from]int{
		{c.nodes[1].ID(), "grpc", "acme", "blue", ""}: 100,
		{c.nodes[2].ID(), "ws", "acme", "red", "e1"}:  100,
	}
	if diff := cmp.Diff(want, count); diff != "" {
		t.Errorf("records by node, transport and identity (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		query string
		want  int
	}{
		{"result=deny", 20},
		{"result=allow&team=red", 90},
		{"policy=acme.deny-curl", 20},
		{"employee=e1&result=deny", 10},
		{"org=other", 0},
		{"limit=30", 30},
	} {
		p, err := get(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) != tc.want {
			t.Errorf("GET /v1/decisions?%s: %d records, want %d", tc.query, len(p.Records), tc.want)
		}
	}
	// Paging with the cursor sees each record once.
	var paged []decisionsv1.Record
	query := "limit=64"
	for range 20 {
		p, err := get(query)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, p.Records...)
		if p.Cursor == "" {
			break
		}
		query = "limit=64&cursor=" + p.Cursor
	}
	if diff := cmp.Diff(page.Records, paged, cmpopts.EquateApproxTime(0)); diff != "" {
		t.Errorf("paged by 64 (-one page +paged):\n%s", diff)
	}
	if got := servertest.Metric(t, c.nodes[1].reg, "policyd_decisions_received_total", "transport", "grpc"); got != 100 {
		t.Errorf("node 1 policyd_decisions_received_total{grpc} = %v, want 100", got)
	}
	if got := servertest.Metric(t, c.nodes[2].reg, "policyd_decisions_received_total", "transport", "ws"); got != 100 {
		t.Errorf("node 2 policyd_decisions_received_total{ws} = %v, want 100", got)
	}

	// Masking leaves the secret in no stored byte, on any node.
	for i, n := range c.nodes {
		if err := n.decisions.Sync(); err != nil {
			t.Fatal(err)
		}
		stored := 0
		err := filepath.WalkDir(c.cfgs[i].DataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte(decisionSecret)) {
				t.Errorf("%s holds the secret header", path)
			}
			if strings.Contains(path, string(filepath.Separator)+"decisions"+string(filepath.Separator)) {
				stored += len(b)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && stored == 0 {
			t.Errorf("%s stored no decision bytes", n.ID())
		}
	}

	// Impact of a draft denying rm: exactly the logged rm calls flip.
	draft := fmt.Sprintf(`{"changes":[{"op":"put","policy":%s}],"since":"1h"}`, denyBashPolicy("acme.deny-rm", "rm"))
	r := a0.do(http.MethodPost, "/v1/impact", []byte(draft), nil)
	if r.status != http.StatusOK {
		t.Fatalf("POST /v1/impact: %d %s", r.status, r.body)
	}
	var rep decisionsv1.ImpactReport
	r.decode(t, &rep)
	for i := range rep.Teams {
		for _, ex := range rep.Teams[i].AllowToDenyExamples {
			if ex.Request.Input["command"] != "rm -rf /tmp/x" || !ex.Allowed {
				t.Errorf("allow→deny example %+v is not a logged, allowed rm", ex)
			}
		}
		if n := len(rep.Teams[i].AllowToDenyExamples); n != 10 {
			t.Errorf("team %s: %d allow→deny examples, want 10", rep.Teams[i].Team, n)
		}
		rep.Teams[i].AllowToDenyExamples, rep.Teams[i].DenyToAllowExamples = nil, nil
	}
	counts := decisionsv1.ImpactCounts{Evaluated: 100, AllowToDeny: 10, Unchanged: 90}
	wantTeams := []decisionsv1.ImpactTeam{{Org: "acme", Team: "blue", ImpactCounts: counts}, {Org: "acme", Team: "red", ImpactCounts: counts}}
	if diff := cmp.Diff(wantTeams, rep.Teams); diff != "" {
		t.Errorf("impact per team (-want +got):\n%s", diff)
	}
	if rep.AllowToDenyRatio != 0.1 || rep.Masked != 200 || len(rep.CutOff) > 0 || len(rep.Unavailable) > 0 {
		t.Errorf("impact ratio %v, masked %d, cut off %v, unavailable %v; want 0.1, 200, none, none", rep.AllowToDenyRatio, rep.Masked, rep.CutOff, rep.Unavailable)
	}
	bad := `{"changes":[{"op":"put","policy":{"name":"acme.x","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"perhaps"}}}]}`
	if r := a0.do(http.MethodPost, "/v1/impact", []byte(bad), nil); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "changes[0].policy") {
		t.Errorf("POST /v1/impact of an invalid draft: %d %s, want 400 naming changes[0].policy", r.status, r.body)
	}

	// A rollout gated on impact: refused above the limit, nothing started.
	gated := fmt.Sprintf(`{"changes":[{"op":"put","policy":%s}],"stages":[{"percent":100,"bake":"1s"}],"max_impact_ratio":0.05,"impact_since":"1h"}`, denyBashPolicy("acme.deny-rm", "rm"))
	r = a0.do(http.MethodPost, "/v1/rollouts", []byte(gated), nil)
	if r.status != http.StatusConflict || !strings.Contains(string(r.body), `"allow_to_deny":20`) {
		t.Fatalf("gated rollout: %d %s, want 409 with the report", r.status, r.body)
	}
	if r := a0.do(http.MethodGet, "/v1/rollouts?state=all", nil, nil); !strings.Contains(string(r.body), `"rollouts":[]`) {
		t.Errorf("a refused rollout was started: %s", r.body)
	}

	// Node 2 killed: a query names it at once and serves node 1's records.
	c.crash(2)
	start := time.Now()
	p, err := get("limit=1000")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the query took %v with a member down", took)
	}
	nodes := map[string]int{}
	for _, r := range p.Records {
		nodes[r.Node]++
	}
	if !slices.Equal(p.Unavailable, []string{c.cfgs[2].NodeID}) || nodes[c.nodes[1].ID()] != 100 {
		t.Errorf("with %s down: unavailable %v, records by node %v; want it named and node 1's 100", c.cfgs[2].NodeID, p.Unavailable, nodes)
	}
}

// TestAuthzDecisionLogJWT: a `policyd authz` sidecar (wired as the CLI
// wires it) with the decision log on, in auth.mode jwt on a 3-node
// cluster, answering real ext_authz CheckRequests: every decision reaches
// GET /v1/decisions on another node under the identity the node took from
// the sidecar's JWT, its verdict as Envoy got it, and no Authorization
// header in what was kept.
func TestAuthzDecisionLogJWT(t *testing.T) {
	c := newCluster(t, 3, jwtMode(t))
	a := apiFor(t, c.nodes[2])
	a.put("/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red","status":"active"}`))
	a.put("/v1/policies/acme.red.reads", validatingPolicy("acme.red.reads", policy.Scope{Org: "acme", Team: "red"},
		validation{Expression: `request.method in ["GET", "HEAD"]`, Message: "reads only", Reason: "ReadOnly"}))
	c.waitConverged()

	all := 1.0
	alice := startAuthz(t, client.Config{
		Servers: []string{c.nodes[0].GRPCAddr()}, Token: signJWT(t, "alice", "acme", "red", time.Hour), ClientAddress: "authz-alice",
		DecisionLog: &client.DecisionLog{AllowSampleRate: &all, FlushInterval: 100 * time.Millisecond},
	}, authz.Config{}, nil)
	auth := map[string]string{"authorization": "Bearer " + decisionSecret}
	for i := range 20 {
		req := envoyCheck("GET", fmt.Sprintf("/orders/%d", i), frontendID, auth)
		want := allowed
		if i%4 == 0 {
			req = envoyCheck("POST", "/orders", frontendID, auth)
			want = policyDenial("acme.red.reads", "reads only", "ReadOnly")
		}
		if got := alice.check(t, req); !cmp.Equal(want, got) {
			t.Fatalf("check %d: %+v, want %+v", i, got, want)
		}
	}

	a1 := apiFor(t, c.nodes[1])
	var page decisionsv1.Page
	poll.Eventually(t, "alice's 20 decisions, asked of another node", func() error {
		r := a1.do(http.MethodGet, "/v1/decisions?employee=alice", nil, nil)
		if r.status != http.StatusOK {
			return fmt.Errorf("%d %s", r.status, r.body)
		}
		page = decisionsv1.Page{}
		r.decode(t, &page)
		if len(page.Records) != 20 {
			return fmt.Errorf("%d records", len(page.Records))
		}
		return nil
	}, poll.Within(20*time.Second))
	denied := 0
	for _, r := range page.Records {
		if r.Org != "acme" || r.Team != "red" || r.Node != c.nodes[0].ID() || r.Transport != "grpc" || r.ClientAddress != "authz-alice" {
			t.Errorf("record %+v: want alice's (acme/red) from node %s over grpc", r, c.nodes[0].ID())
		}
		if !r.Allowed {
			denied++
			if r.Policy != "acme.red.reads" || r.Request.HTTP["method"] != "POST" {
				t.Errorf("denial %+v: want acme.red.reads on a POST", r)
			}
		}
		if b, _ := json.Marshal(r); bytes.Contains(b, []byte(decisionSecret)) {
			t.Errorf("record keeps the Authorization header: %s", b)
		}
	}
	if denied != 5 {
		t.Errorf("%d denials logged, want 5", denied)
	}
}
