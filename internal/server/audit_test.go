package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/adminapi"
	"github.com/policyd/policyd/internal/store"
)

const (
	opsToken = "ops-token-0123456789abcdef"
	ciToken  = "ci-token-0123456789abcdef"
)

// auditCluster is a 3-node cluster whose admin API takes two admin tokens,
// named ops and ci.
func auditCluster(t *testing.T) *cluster {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("admin "+opsToken+" ops\nadmin "+ciToken+" ci\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3, func(c *config.Config) { c.Auth.AdminTokensFile = path })
	// Writes carry their actor once every member has registered command
	// version 3: each node's first registration asks the others to
	// register again (command.ForVersion).
	for _, n := range c.nodes {
		waitCommandVersion(t, n)
	}
	return c
}

// waitCommandVersion waits until n writes this release's command version.
func waitCommandVersion(t *testing.T, n *Node) {
	t.Helper()
	poll.Eventually(t, n.ID()+" to write command version "+strconv.Itoa(command.CommandVersion), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := n.Status(ctx)
		if err != nil {
			return err
		}
		if st.CommandVersion != command.CommandVersion {
			return fmt.Errorf("command version %d", st.CommandVersion)
		}

		for _, m := range st.Members {
			if m.CommandVersion != command.CommandVersion {
				return fmt.Errorf("member %s registered command version %d", m.ID, m.CommandVersion)
			}
		}
		return nil
	}, poll.Within(10*time.Second))

}

// as is the headers of a request made with token and, unless empty, a
// request id.
func as(token, requestID string) map[string]string {
	h := map[string]string{"Authorization": "Bearer " + token}
	if requestID != "" {
		h[adminapi.RequestIDHeader] = requestID
	}
	return h
}

// audited is what the audit trail says about one event.
type audited struct {
	Type      store.EntityType
	ID        string
	Action    store.Action
	Actor     string
	RequestID string
}

func auditedEvents(t *testing.T, a *api, query string) []audited {
	t.Helper()
	r := a.do(http.MethodGet, "/v1/events?"+query, nil, as(opsToken, ""))
	if r.status != http.StatusOK {
		t.Fatalf("GET /v1/events?%s: %d %s", query, r.status, r.body)
	}
	var page store.EventPage
	r.decode(t, &page)
	var out []audited
	for _, ev := range page.Events {
		out = append(out, audited{ev.EntityType, ev.EntityID, ev.Action, ev.Actor, ev.RequestID})
	}
	return out
}

var generatedID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestAuditTrail: writes through two tokens, on different nodes, name
// their token and request id in their events on every node; the request id
// comes back on every response, errors included, and one that is not sane
// is replaced; GET /v1/events?actor= selects one actor's events.
func TestAuditTrail(t *testing.T) {
	c := auditCluster(t)
	leader, follower := c.leader(), c.follower()
	la, fa := apiFor(t, leader), apiFor(t, follower)

	r := fa.do(http.MethodPut, "/v1/policies/acme.audit", toolPolicy("acme.audit", "acme", "one"), as(opsToken, "deploy-42"))
	if r.status != http.StatusOK || r.header.Get(adminapi.RequestIDHeader) != "deploy-42" {
		t.Fatalf("PUT through %s: %d %s, request id %q, want 200 and deploy-42", follower.ID(), r.status, r.body, r.header.Get(adminapi.RequestIDHeader))
	}
	r = la.do(http.MethodPut, "/v1/policies/acme.audit", toolPolicy("acme.audit", "acme", "two"), as(ciToken, ""))
	generated := r.header.Get(adminapi.RequestIDHeader)
	if r.status != http.StatusOK || !generatedID.MatchString(generated) {
		t.Fatalf("PUT without a request id: %d %s, request id %q, want 200 and a generated one", r.status, r.body, generated)
	}
	tests := []struct{ name, id string }{
		{"not ASCII", "déploy"},
		{"too long", strings.Repeat("r", 129)},
	}
	ids := map[string]string{}
	for _, tc := range tests {
		r := fa.do(http.MethodPut, "/v1/employees/alice", []byte(`{"org":"acme","team":"`+tc.name[:3]+`"}`), as(ciToken, tc.id))
		got := r.header.Get(adminapi.RequestIDHeader)
		if r.status != http.StatusOK || !generatedID.MatchString(got) {
			t.Fatalf("%s request id: %d %s, answered id %q, want 200 and a generated one", tc.name, r.status, r.body, got)
		}
		ids[tc.name] = got
	}
	r = la.do(http.MethodDelete, "/v1/policies/acme.audit", nil, as(opsToken, "cleanup-1"))
	if r.status != http.StatusOK {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/v1/policies/acme.none"}, // 404 from a handler
		{http.MethodGet, "/v2/nothing"},            // no route
		{http.MethodPut, "/v1/policies/acme.x"},    // 400, no body
	} {
		if r := fa.do(tc.method, tc.path, nil, as(opsToken, "err-1")); r.status < 400 || r.header.Get(adminapi.RequestIDHeader) != "err-1" {
			t.Errorf("%s %s: %d with request id %q, want an error with err-1", tc.method, tc.path, r.status, r.header.Get(adminapi.RequestIDHeader))
		}
	}
	c.waitConverged()

	want := []audited{
		{store.EntityPolicy, "acme.audit", store.ActionCreate, "token:ops", "deploy-42"},
		{store.EntityPolicy, "acme.audit", store.ActionUpdate, "token:ci", generated},
		{store.EntityEmployee, "alice", store.ActionCreate, "token:ci", ids["not ASCII"]},
		{store.EntityEmployee, "alice", store.ActionUpdate, "token:ci", ids["too long"]},
		{store.EntityPolicy, "acme.audit", store.ActionDelete, "token:ops", "cleanup-1"},
	}
	for _, n := range c.nodes {
		a := apiFor(t, n)
		if diff := cmp.Diff(want, auditedEvents(t, a, "")); diff != "" {
			t.Errorf("%s: events (-want +got):\n%s", n.ID(), diff)
		}
		if diff := cmp.Diff([]audited{want[1], want[2], want[3]}, auditedEvents(t, a, "actor=token:ci")); diff != "" {
			t.Errorf("%s: events of token:ci (-want +got):\n%s", n.ID(), diff)
		}
		if got := auditedEvents(t, a, "actor=token:nobody"); len(got) != 0 {
			t.Errorf("%s: events of an unknown actor: %v", n.ID(), got)
		}
	}
}

// TestHistoryAndRevert, against a 3-node cluster: history lists the
// revisions with their actors, a revert writes an old revision back as a
// new one recorded as a revert, a revert that races another write fails
// with 409 and writes nothing, and every bad request is a clear error.
func TestHistoryAndRevert(t *testing.T) {
	c := auditCluster(t)
	fa := apiFor(t, c.follower())
	la := apiFor(t, c.leader())
	const p = "/v1/policies/acme.h"

	put := func(a *api, token, reason string) uint64 {
		t.Helper()
		r := a.do(http.MethodPut, p, toolPolicy("acme.h", "acme", reason), as(token, ""))
		if r.status != http.StatusOK {
			t.Fatalf("PUT %s: %d %s", reason, r.status, r.body)
		}
		var got policy.Policy
		r.decode(t, &got)
		return got.Revision
	}
	history := func(a *api, path string) []adminapi.Revision {
		t.Helper()
		r := a.do(http.MethodGet, path+"/history?consistent=true", nil, as(ciToken, ""))
		if r.status != http.StatusOK {
			t.Fatalf("GET %s/history: %d %s", path, r.status, r.body)
		}
		var h adminapi.History
		r.decode(t, &h)
		for i := range h.Revisions {
			h.Revisions[i].Time = time.Time{}
		}
		return h.Revisions
	}
	reason := func(a *api) string {
		t.Helper()
		r := a.do(http.MethodGet, p+"?consistent=true", nil, as(ciToken, ""))
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", p, r.status, r.body)
		}
		var got struct {
			Spec struct{ Reason string } `json:"spec"`
		}
		r.decode(t, &got)
		return got.Spec.Reason
	}
	revert := func(a *api, body, ifMatch string) response {
		t.Helper()
		h := as(opsToken, "revert-req")
		if ifMatch != "" {
			h["If-Match"] = ifMatch
		}
		return a.do(http.MethodPost, p+"/revert", []byte(body), h)
	}

	r1 := put(fa, opsToken, "one")
	r2 := put(la, ciToken, "two")
	if diff := cmp.Diff([]adminapi.Revision{
		{Revision: r1, Action: store.ActionCreate, Actor: "token:ops"},
		{Revision: r2, Action: store.ActionUpdate, Actor: "token:ci"},
	}, history(fa, p), cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".RequestID" }, cmp.Ignore())); diff != "" {
		t.Fatalf("history (-want +got):\n%s", diff)
	}
	if r := fa.do(http.MethodGet, fmt.Sprintf("%s/revisions/%d", p, r1), nil, as(ciToken, "")); r.status != http.StatusOK || !strings.Contains(string(r.body), `"reason":"one"`) {
		t.Fatalf("GET revision %d: %d %s, want the content of reason one", r1, r.status, r.body)
	}

	var r3 uint64
	t.Run("revert writes the old content back as a new revision", func(t *testing.T) {
		r := revert(fa, fmt.Sprintf(`{"to":%d,"if_match":%d}`, r1, r2), "")
		if r.status != http.StatusOK {
			t.Fatalf("revert: %d %s", r.status, r.body)
		}
		var got policy.Policy
		r.decode(t, &got)
		r3 = got.Revision
		if r3 <= r2 || reason(la) != "one" {
			t.Fatalf("after the revert: revision %d (was %d), reason %q, want a new revision with reason one", r3, r2, reason(la))
		}
		h := history(la, p)
		if diff := cmp.Diff(adminapi.Revision{Revision: r3, Action: store.ActionUpdate, Actor: "token:ops", RequestID: "revert-req", RevertedTo: r1}, h[len(h)-1]); diff != "" {
			t.Errorf("the revert's history entry (-want +got):\n%s", diff)
		}
	})

	t.Run("revert racing another write fails with 409", func(t *testing.T) {
		seen := r3 // what the operator saw as current
		r4 := put(la, ciToken, "four")
		for _, tc := range []struct{ name, body, ifMatch string }{
			{"if_match in the body", fmt.Sprintf(`{"to":%d,"if_match":%d}`, r2, seen), ""},
			{"If-Match header", fmt.Sprintf(`{"to":%d}`, r2), strconv.Quote(strconv.FormatUint(seen, 10))},
		} {
			if r := revert(fa, tc.body, tc.ifMatch); r.status != http.StatusConflict || r.errCode(t) != "conflict" {
				t.Errorf("%s: %d %s, want 409 conflict", tc.name, r.status, r.body)
			}
		}
		if got := reason(fa); got != "four" {
			t.Fatalf("a refused revert changed the policy: reason %q, want four", got)
		}
		// Concurrent reverts from the same current revision: exactly one
		// wins, on whichever node it lands.
		var wg sync.WaitGroup
		codes := make([]int, 6)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i] = postStatus(c.nodes[i%len(c.nodes)].HTTPAddr(), p+"/revert", fmt.Sprintf(`{"to":%d,"if_match":%d}`, r1+uint64(i%2)*(r2-r1), r4), opsToken)
			}()
		}
		wg.Wait()
		won, lost := 0, 0
		for _, code := range codes {
			switch code {
			case http.StatusOK:
				won++
			case http.StatusConflict:
				lost++
			}
		}
		if won != 1 || lost != len(codes)-1 {
			t.Fatalf("concurrent reverts answered %v, want one 200 and the rest 409", codes)
		}
	})

	t.Run("bad reverts", func(t *testing.T) {
		emp := apiFor(t, c.leader()).do(http.MethodPut, "/v1/employees/carol", []byte(`{"org":"acme"}`), as(opsToken, ""))
		var e policy.Employee
		emp.decode(t, &e)
		tests := []struct {
			name, body, ifMatch string
			status              int
			msg                 string
		}{
			{"a revision that never existed", `{"to":999999}`, "", 404, `policy \"acme.h\" has no revision 999999`},
			{"another entity's revision", fmt.Sprintf(`{"to":%d}`, e.Revision), "", 404, fmt.Sprintf("has no revision %d", e.Revision)},
			{"no revision", `{}`, "", 400, "to: required"},
			{"unknown field", `{"to":1,"force":true}`, "", 400, "force"},
			{"body and header differ", fmt.Sprintf(`{"to":%d,"if_match":1}`, r1), "2", 400, "differ"},
			{"if_match 0 while it exists", fmt.Sprintf(`{"to":%d,"if_match":0}`, r1), "", 409, "already exists"},
		}
		before, _, err := c.leader().store.Digest()
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				r := revert(fa, tc.body, tc.ifMatch)
				if r.status != tc.status || !strings.Contains(string(r.body), tc.msg) {
					t.Fatalf("%d %s, want %d naming %q", r.status, r.body, tc.status, tc.msg)
				}
				r.errCode(t)
			})
		}
		if after, _, err := c.leader().store.Digest(); err != nil || after != before {
			t.Errorf("refused reverts changed the state (%.8s → %.8s, %v)", before, after, err)
		}
		for _, path := range []string{"/v1/policies/acme.h/revisions/abc", "/v1/policies/acme.h/revisions/0"} {
			if r := fa.do(http.MethodGet, path, nil, as(ciToken, "")); r.status != http.StatusBadRequest {
				t.Errorf("GET %s: %d %s, want 400", path, r.status, r.body)
			}
		}
	})

	t.Run("history of a name that never existed is 404", func(t *testing.T) {
		r := fa.do(http.MethodGet, "/v1/policies/acme.never/history", nil, as(ciToken, ""))
		if r.status != http.StatusNotFound || r.errCode(t) != "not_found" || !strings.Contains(string(r.body), `policy \"acme.never\" has no events`) {
			t.Fatalf("%d %s, want 404 naming the policy", r.status, r.body)
		}
	})

	t.Run("a deleted policy keeps its history and can be reverted", func(t *testing.T) {
		if r := la.do(http.MethodDelete, p, nil, as(ciToken, "")); r.status != http.StatusOK {
			t.Fatalf("DELETE: %d %s", r.status, r.body)
		}
		h := history(fa, p)
		if last := h[len(h)-1]; last.Action != store.ActionDelete || last.Actor != "token:ci" || h[0].Revision != r1 {
			t.Fatalf("history of the deleted policy: %+v, want it from %d, ending in a DELETE by token:ci", h, r1)
		}
		del := h[len(h)-1].Revision
		if r := fa.do(http.MethodGet, fmt.Sprintf("%s/revisions/%d", p, del), nil, as(ciToken, "")); r.status != http.StatusNotFound {
			t.Errorf("GET the delete's revision: %d %s, want 404", r.status, r.body)
		}
		if r := revert(fa, fmt.Sprintf(`{"to":%d,"if_match":0}`, r2), ""); r.status != http.StatusOK {
			t.Fatalf("revert the deleted policy: %d %s", r.status, r.body)
		}
		if got := reason(fa); got != "two" {
			t.Fatalf("restored reason %q, want two", got)
		}
	})

	t.Run("employees", func(t *testing.T) {
		const e = "/v1/employees/dave"
		var revs []uint64
		for _, team := range []string{"red", "blue"} {
			r := fa.do(http.MethodPut, e, []byte(`{"org":"acme","team":"`+team+`"}`), as(ciToken, ""))
			if r.status != http.StatusOK {
				t.Fatalf("PUT: %d %s", r.status, r.body)
			}
			var got policy.Employee
			r.decode(t, &got)
			revs = append(revs, got.Revision)
		}
		r := la.do(http.MethodPost, e+"/revert", []byte(fmt.Sprintf(`{"to":%d}`, revs[0])), as(opsToken, ""))
		var got policy.Employee
		if r.status != http.StatusOK {
			t.Fatalf("revert: %d %s", r.status, r.body)
		}
		r.decode(t, &got)
		if got.Team != "red" || got.Revision <= revs[1] {
			t.Fatalf("reverted employee %+v, want team red at a new revision", got)
		}
		want := []adminapi.Revision{
			{Revision: revs[0], Action: store.ActionCreate, Actor: "token:ci"},
			{Revision: revs[1], Action: store.ActionUpdate, Actor: "token:ci"},
			{Revision: got.Revision, Action: store.ActionUpdate, Actor: "token:ops", RevertedTo: revs[0]},
		}
		if diff := cmp.Diff(want, history(fa, e), cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".RequestID" }, cmp.Ignore())); diff != "" {
			t.Errorf("employee history (-want +got):\n%s", diff)
		}
	})
	c.waitConverged()
}

// postStatus POSTs body to the node at addr alone with token and returns
// the status (0 if the request failed): for goroutines, which must not
// call t.Fatal.
func postStatus(addr, path, body, token string) int {
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	client, err := adminclient.New(adminclient.Config{Servers: []string{"http://" + addr}, Token: token, HTTPClient: hc})
	if err != nil {
		return 0
	}
	var ae *adminclient.Error
	switch err := client.Do(context.Background(), http.MethodPost, path, nil, []byte(body), nil); {
	case err == nil:
		return http.StatusOK
	case errors.As(err, &ae):
		return ae.Status
	}
	return 0
}

// TestRetentionPruneIsAudited: the leader's retention prune records an
// event naming task:retention, and a revision it removed is a clear 404
// for history, revision and revert, while the policy itself is served.
func TestRetentionPruneIsAudited(t *testing.T) {
	_, a := singleNode(t, func(c *config.Config) {
		c.Events.Retention = 300 * time.Millisecond
		c.Events.CleanupInterval = 50 * time.Millisecond
	})
	old := a.putPolicy("acme.old", "acme", "old")
	var prune store.Event
	poll.Eventually(t, "a retention prune of the policy's event", func() error {
		r := a.do(http.MethodGet, "/v1/events?actor="+command.ActorRetention, nil, nil)
		var page store.EventPage
		if r.status != http.StatusOK {
			return fmt.Errorf("GET /v1/events: %d %s", r.status, r.body)
		}
		r.decode(t, &page)
		if len(page.Events) == 0 || page.PrunedThrough < old.Revision {
			return fmt.Errorf("events of %s: %d, pruned through %d", command.ActorRetention, len(page.Events), page.PrunedThrough)
		}
		prune = page.Events[0]
		return nil
	}, poll.Within(10*time.Second))

	var data struct {
		Count int `json:"count"`
	}
	if err := json.Unmarshal(prune.Data, &data); err != nil || prune.EntityType != store.EntityRetention || prune.Action != store.ActionDelete || data.Count < 1 {
		t.Errorf("prune event %+v (data %s, %v), want a retention DELETE counting the events it removed", prune, prune.Data, err)
	}
	tests := []struct {
		name, method, path, body, msg string
	}{
		{"history", http.MethodGet, "/v1/policies/acme.old/history", "", `policy \"acme.old\" has no events in the log`},
		{"revision", http.MethodGet, fmt.Sprintf("/v1/policies/acme.old/revisions/%d", old.Revision), "", "past retention"},
		{"revert", http.MethodPost, "/v1/policies/acme.old/revert", fmt.Sprintf(`{"to":%d}`, old.Revision), fmt.Sprintf("revision %d of policy \\\"acme.old\\\"", old.Revision)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			r := a.do(tc.method, tc.path, body, nil)
			if r.status != http.StatusNotFound || r.errCode(t) != "not_found" || !strings.Contains(string(r.body), tc.msg) {
				t.Fatalf("%d %s, want 404 naming %q", r.status, r.body, tc.msg)
			}
		})
	}
	if r := a.do(http.MethodGet, "/v1/policies/acme.old", nil, nil); r.status != http.StatusOK {
		t.Errorf("the policy itself: %d %s, want 200", r.status, r.body)
	}
}

// TestCertificateActor: on an API that admits client certificates, a
// write names the certificate's subject as its actor; a subject with
// control characters is refused with a clear 400 and nothing is written;
// and the leader refuses such an actor in a command from anywhere.
func TestCertificateActor(t *testing.T) {
	p := newPKI(t)
	n, _ := singleNode(t, func(c *config.Config) { c.HTTP.TLS = p.issue(t, "solo-http") })
	alice := httpsAPI(t, n, p.clientTLS(t, "alice"))
	alice.putPolicy("acme.cert", "acme", "by alice")
	got := auditedEvents(t, alice, "type=policy")
	if diff := cmp.Diff([]audited{{store.EntityPolicy, "acme.cert", store.ActionCreate, "cert:CN=alice", got[0].RequestID}}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	before, _, err := n.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	eve := httpsAPI(t, n, p.clientTLS(t, "eve\x1b[2J"))
	r := eve.do(http.MethodPut, "/v1/policies/acme.eve", toolPolicy("acme.eve", "acme", "x"), nil)
	if r.status != http.StatusBadRequest || r.errCode(t) != "invalid" || !strings.Contains(string(r.body), "control character U+001B") {
		t.Fatalf("PUT with a certificate subject holding ESC: %d %s, want 400 naming the control character", r.status, r.body)
	}

	cmd, err := command.PutPolicy(&policy.Policy{Name: "acme.forged", Kind: "ToolPolicy", Scope: policy.Scope{Org: "acme"},
		Spec: json.RawMessage(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["x"]}}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Actor = "token:ops\nforged line"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Propose(ctx, cmd); !errors.Is(err, policy.ErrInvalid) || !strings.Contains(err.Error(), "control character U+000A") {
		t.Fatalf("Propose with a newline in the actor: %v, want an invalid-command error naming it", err)
	}
	if after, _, err := n.store.Digest(); err != nil || after != before {
		t.Errorf("refused writes changed the state (%.8s → %.8s, %v)", before, after, err)
	}
}
