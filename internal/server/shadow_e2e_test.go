package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/adminapi"
	"github.com/policyd/policyd/internal/server/servertest"
)

// shadowToolPolicy is a ToolPolicy of org acme denying Bash calls that
// match pattern, in shadow mode.
func shadowToolPolicy(name, pattern string) []byte {
	b, _ := json.Marshal(map[string]any{
		"name": name, "kind": "ToolPolicy", "enforcement": "shadow",
		"scope": map[string]string{"org": "acme"},
		"spec":  map[string]any{"tool_name": "Bash", "action": "deny", "conditions": map[string]any{"patterns": []string{pattern}}},
	})
	return b
}

// TestShadowE2E: a shadow ToolPolicy beside an enforced one on a 3-node
// cluster, evaluated by SDK sidecars over both transports on two nodes:
// nothing it would deny is blocked, the exact disagreement counts of 1,000
// evaluated requests reach GET /v1/policies/{name}/shadow (summed across
// the nodes) and the metrics, and a client that declared no capabilities
// is never sent the shadow policy.
func TestShadowE2E(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.leader())
	a.putPolicy("acme.deny-rm", "acme", "no rm") // enforced: denies "rm -rf"
	r := a.do(http.MethodPut, "/v1/policies/acme.shadow-curl", shadowToolPolicy("acme.shadow-curl", "curl"), nil)
	wantStatus(t, "PUT shadow policy", r, http.StatusOK)
	var stored policy.Policy
	r.decode(t, &stored)
	if stored.Enforcement != policy.EnforcementShadow {
		t.Fatalf("stored enforcement %q, want shadow", stored.Enforcement)
	}
	if r := a.do(http.MethodPut, "/v1/employees/e1", []byte(`{"org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	c.waitConverged()

	g := startSDK(t, client.Config{Servers: []string{c.nodes[1].GRPCAddr()}, ClientAddress: "sc-grpc",
		Scope: client.Scope{Org: "acme"}, ShadowReportInterval: time.Second})
	// Over the feed a report is never sent again: the SDK sends one at
	// most every 6s whatever the setting, so none is dropped as too soon.
	w := startSDK(t, client.Config{Servers: []string{c.nodes[2].HTTPAddr()}, Transport: client.TransportWS,
		Employee: "e1", ShadowReportInterval: time.Second})
	for _, s := range []*sdkRun{g, w} {
		s.hasPolicy(t, "acme.shadow-curl")
		s.hasPolicy(t, "acme.deny-rm")
	}

	// 500 requests each: a tenth the shadow policy alone denies, a tenth
	// the enforced one alone denies.
	blocked := 0
	for _, s := range []*sdkRun{g, w} {
		for i := range 500 {
			cmd := "ls"
			switch i % 10 {
			case 0:
				cmd = "curl example.com"
			case 1:
				cmd = "rm -rf /tmp/x"
			}
			d := s.Evaluate(context.Background(), client.Request{Tool: "Bash", Input: map[string]any{"command": cmd}})
			if !d.Allowed {
				blocked++
				if d.Policy != "acme.deny-rm" {
					t.Fatalf("%q denied by %q: only the enforced policy may deny", cmd, d.Policy)
				}
			}
		}
	}
	if blocked != 100 {
		t.Fatalf("%d of 1000 requests blocked, want the enforced policy's 100", blocked)
	}

	want := adminapi.ShadowView{
		Policy: "acme.shadow-curl",
		Totals: adminapi.ShadowTotals{WouldBlock: 100, WouldAllow: 100, Evaluated: 1000},
		ByScope: []adminapi.ShadowScope{
			{Scope: "acme//", ShadowTotals: adminapi.ShadowTotals{WouldBlock: 50, WouldAllow: 50, Evaluated: 500}},
			{Scope: "acme/red/e1", ShadowTotals: adminapi.ShadowTotals{WouldBlock: 50, WouldAllow: 50, Evaluated: 500}},
		},
	}
	// Asked of node 0, which no sidecar is connected to: the counts come
	// from the others over the peer RPC.
	a0 := apiFor(t, c.nodes[0])
	var got adminapi.ShadowView
	poll.Eventually(t, "the exact shadow counts in the cluster view", func() error {
		r := a0.do(http.MethodGet, "/v1/policies/acme.shadow-curl/shadow", nil, nil)
		if r.status != http.StatusOK {
			return fmt.Errorf("GET shadow: %d %s", r.status, r.body)
		}
		got = adminapi.ShadowView{}
		r.decode(t, &got)
		if diff := cmp.Diff(want, got); diff != "" {
			return fmt.Errorf("shadow view (-want +got):\n%s", diff)
		}
		return nil
	}, poll.Within(20*time.Second))

	for i, s := range []*sdkRun{g, w} {
		st := s.Stats()
		if st.ShadowWouldBlock != 50 || st.ShadowWouldAllow != 50 || st.ShadowEvaluated != 500 {
			t.Errorf("sidecar %d Stats shadow totals %d/%d/%d, want 50/50/500", i, st.ShadowWouldBlock, st.ShadowWouldAllow, st.ShadowEvaluated)
		}
	}
	var metric float64
	for _, n := range c.nodes {
		metric += servertest.Metric(t, n.reg, "policyd_shadow_disagreements_total", "policy", "acme.shadow-curl", "kind", "would_block")
	}
	if metric != 100 {
		t.Errorf("policyd_shadow_disagreements_total{kind=would_block} summed over nodes = %v, want 100", metric)
	}
	if r := a0.do(http.MethodGet, "/v1/policies/acme.nope/shadow", nil, nil); r.status != http.StatusNotFound {
		t.Errorf("GET shadow of an unknown policy: %d %s, want 404", r.status, r.body)
	}
	if r := a0.do(http.MethodGet, "/v1/policies/acme.deny-rm/shadow", nil, nil); r.status != http.StatusOK || !strings.Contains(string(r.body), `"evaluated":0`) {
		t.Errorf("GET shadow of an enforced policy: %d %s, want 200 and zeros", r.status, r.body)
	}

	t.Run("v1 clients never receive it", func(t *testing.T) {
		d := openStream(t, dialGRPC(t, c.nodes[1].GRPCAddr()), "v1-grpc", policy.Scope{Org: "acme"})
		resp := d.next()
		var names []string
		for _, p := range resp.GetPolicies() {
			names = append(names, p.GetName())
		}
		if !slices.Equal(names, []string{"acme.deny-rm"}) {
			t.Errorf("v1 discovery client got %v, want only acme.deny-rm", names)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "ws://"+c.nodes[2].HTTPAddr()+feedv1.Path+"?employee=e1", nil) //nolint:bodyclose // Dial owns the body
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow() //nolint:errcheck // best effort
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var m feedv1.Message
		if err := json.Unmarshal(data, &m); err != nil || m.Type != feedv1.TypeInit {
			t.Fatalf("first feed message %s (%v), want init", data, err)
		}
		names = nil
		for _, p := range m.Policies {
			names = append(names, p.Name)
		}
		if !slices.Equal(names, []string{"acme.deny-rm"}) {
			t.Errorf("v1 feed client got %v, want only acme.deny-rm", names)
		}
	})

	t.Run("bad reports are bounded and counted", func(t *testing.T) {
		n := c.nodes[1]
		cc := dialGRPC(t, n.GRPCAddr())
		api := discoveryv1.NewPolicyDiscoveryServiceClient(cc)
		rejected := func(reason string) float64 {
			return servertest.Metric(t, n.reg, "policyd_shadow_reports_rejected_total", "reason", reason)
		}
		report := func(addr string, counts ...*discoveryv1.ShadowCount) codes.Code {
			_, err := api.ReportShadow(context.Background(), &discoveryv1.ShadowReport{ClientAddress: addr, Counts: counts})
			return status.Code(err)
		}
		count := func(p string, wb, wa, ev uint64) *discoveryv1.ShadowCount {
			return &discoveryv1.ShadowCount{Policy: p, WouldBlock: wb, WouldAllow: wa, Evaluated: ev}
		}
		before := map[string]float64{}
		for _, r := range []string{"unknown_policy", "not_applicable", "absurd_count", "too_many_entries", "rate_limited", "duplicate_policy"} {
			before[r] = rejected(r)
		}
		// A sidecar without a stream on this node is refused.
		if got := report("nobody", count("acme.shadow-curl", 1, 0, 1)); got != codes.FailedPrecondition {
			t.Errorf("report without a stream: %v, want FailedPrecondition", got)
		}
		// A v1 stream is served no shadow policy: its counts for one are
		// not applicable; an unknown name is unknown.
		openStream(t, cc, "bad-1", policy.Scope{Org: "acme"}).next()
		if got := report("bad-1", count("acme.shadow-curl", 7, 0, 7), count("acme.nope", 1, 0, 1)); got != codes.OK {
			t.Errorf("report with ignored entries: %v, want OK", got)
		}
		// A flood from the same sidecar is dropped.
		for range 20 {
			if got := report("bad-1", count("acme.shadow-curl", 1, 0, 1)); got != codes.ResourceExhausted {
				t.Fatalf("report within 5s of the last: %v, want ResourceExhausted", got)
			}
		}
		openStream(t, cc, "bad-2", policy.Scope{Org: "acme"}).next()
		if got := report("bad-2", count("acme.shadow-curl", 2_000_000, 0, 2_000_000)); got != codes.InvalidArgument {
			t.Errorf("absurd counts: %v, want InvalidArgument", got)
		}
		openStream(t, cc, "bad-3", policy.Scope{Org: "acme"}).next()
		many := make([]*discoveryv1.ShadowCount, 257)
		for i := range many {
			many[i] = count(fmt.Sprintf("acme.p%d", i), 0, 0, 1)
		}
		if got := report("bad-3", many...); got != codes.InvalidArgument {
			t.Errorf("257 entries: %v, want InvalidArgument", got)
		}
		// One name 256 times at the largest count would add 256 times the
		// per-entry bound in one report.
		openStream(t, cc, "bad-4", policy.Scope{Org: "acme"}).next()
		same := make([]*discoveryv1.ShadowCount, 256)
		for i := range same {
			same[i] = count("acme.shadow-curl", 1_000_000, 0, 1_000_000)
		}
		if got := report("bad-4", same...); got != codes.InvalidArgument {
			t.Errorf("one policy named 256 times: %v, want InvalidArgument", got)
		}
		for reason, want := range map[string]float64{"unknown_policy": 1, "not_applicable": 1, "absurd_count": 1, "too_many_entries": 1, "rate_limited": 20, "duplicate_policy": 1} {
			if got := rejected(reason) - before[reason]; got != want {
				t.Errorf("rejected{reason=%s} grew by %v, want %v", reason, got, want)
			}
		}
		// Over the feed: a report with an absurd count is ignored and
		// counted, the connection stays; one right after it is dropped.
		n2 := c.nodes[2]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "ws://"+n2.HTTPAddr()+feedv1.Path+"?employee=e1&capabilities=shadow", nil) //nolint:bodyclose // Dial owns the body
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow() //nolint:errcheck // best effort
		if _, _, err := ws.Read(ctx); err != nil {
			t.Fatal(err)
		}
		wsRejected := func(reason string) float64 {
			return servertest.Metric(t, n2.reg, "policyd_shadow_reports_rejected_total", "reason", reason)
		}
		absurd0, limited0 := wsRejected("absurd_count"), wsRejected("rate_limited")
		for _, msg := range []string{
			`{"type":"shadow_report","counts":[{"policy":"acme.shadow-curl","would_block":5000000,"would_allow":0,"evaluated":5000000}]}`,
			`{"type":"shadow_report","counts":[{"policy":"acme.shadow-curl","would_block":1,"would_allow":0,"evaluated":1}]}`,
		} {
			if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatal(err)
			}
		}
		poll.Eventually(t, "the feed's bad reports to be counted", func() error {
			if a, l := wsRejected("absurd_count")-absurd0, wsRejected("rate_limited")-limited0; a != 1 || l != 1 {
				return fmt.Errorf("absurd_count grew by %v, rate_limited by %v; want 1 and 1", a, l)
			}
			return nil
		}, poll.Within(5*time.Second))

		// The second report was read, so the first did not end the
		// connection; nor did the second.
		open := 0
		for _, ci := range n2.feed.Clients() {
			if ci.GetEmployee() == "e1" {
				open++
			}
		}
		if open != 2 { // the SDK's and this one
			t.Errorf("%d feed connections of e1 on %s after bad reports, want 2", open, n2.ID())
		}

		r := a0.do(http.MethodGet, "/v1/policies/acme.shadow-curl/shadow", nil, nil)
		var after adminapi.ShadowView
		r.decode(t, &after)
		if after.Totals != want.Totals {
			t.Errorf("totals after bad reports %+v, want %+v unchanged", after.Totals, want.Totals)
		}
	})

	t.Run("rollout status", func(t *testing.T) {
		r := a.do(http.MethodPost, "/v1/rollouts", rolloutBody([][]byte{shadowToolPolicy("acme.shadow-curl", "curl -k")}, nil, "1h", 10, 100), nil)
		wantStatus(t, "start a rollout of the shadow policy", r, http.StatusCreated)
		var ro adminapi.RolloutView
		r.decode(t, &ro)
		r = a0.do(http.MethodGet, "/v1/rollouts/"+ro.ID, nil, nil)
		wantStatus(t, "GET rollout", r, http.StatusOK)
		ro = adminapi.RolloutView{}
		r.decode(t, &ro)
		if len(ro.Status.Shadow) != 1 || ro.Status.Shadow[0].Policy != "acme.shadow-curl" || ro.Status.Shadow[0].Totals != want.Totals {
			t.Errorf("rollout status shadow %+v, want the counts of acme.shadow-curl %+v", ro.Status.Shadow, want.Totals)
		}
	})
}
