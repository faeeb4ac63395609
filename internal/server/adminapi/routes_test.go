package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/apierror"
	"github.com/policyd/policyd/internal/server/proxystatus"
	"github.com/policyd/policyd/internal/store"
)

// Bodies the table writes.
const (
	policyBody   = `{"kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"deny"}}`
	employeeBody = `{"org":"acme","team":"platform","status":"active"}`
	impactBody   = `{"changes":[{"op":"delete","name":"p1"}],"since":"24h"}`
	rolloutBody  = `{"changes":[{"op":"put","policy":{"name":"p3","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"audit"}}}],"stages":[{"percent":100,"bake":"1h"}]}`
)

// secretPath stands for internals (file paths, addresses) in an
// unclassified backend error: a 500 must not show it.
const secretPath = "/var/lib/policyd/state.db"

// seedState writes what the table's requests read: policy p1 (revision
// 1), employee alice (revision 2) and rollout r3, which puts policy p2.
func seedState(t *testing.T, f *fakeBackend) {
	t.Helper()
	p, err := policy.DecodePolicy([]byte(policyBody))
	if err != nil {
		t.Fatal(err)
	}
	p.Name = "p1"
	f.seed(t)(command.PutPolicy(p, nil))
	e, err := policy.DecodeEmployee([]byte(employeeBody))
	if err != nil {
		t.Fatal(err)
	}
	e.ID = "alice"
	f.seed(t)(command.PutEmployee(e, nil))
	ro, err := DecodeRolloutRequest([]byte(strings.ReplaceAll(rolloutBody, `"p3"`, `"p2"`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	f.seed(t)(command.RolloutStart(ro))
}

// transition moves rollout id by an operator action, for a check's setup.
func transition(action string) func(*testing.T, *fakeBackend) {
	return func(t *testing.T, f *fakeBackend) {
		t.Helper()
		ro, err := f.st.Rollout("r3")
		if err != nil {
			t.Fatal(err)
		}
		tr, err := ActionTransition(ro, action, "token:seed", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		f.seed(t)(command.RolloutTransition(tr))
	}
}

// check is one request and what it must get; where it leaves a field
// out, the route's ok request gives it (but for setup). A check with a code expects
// the error envelope with that code; without, a success.
type check struct {
	name   string
	setup  func(*testing.T, *fakeBackend)
	method string // default: the route's
	target string // default: the route's ok target
	body   string
	header map[string]string
	// noBody sends no body where the route's ok request has one.
	noBody bool
	// cancel sends the request with its context already cancelled: a
	// stream (an event watch, a profile) answers what it has and ends.
	cancel  bool
	status  int // default 200
	code    string
	mention string
	verify  func(*testing.T, *fakeBackend, *httptest.ResponseRecorder)
}

// routeTest is how the table exercises one route.
type routeTest struct {
	// setup runs before each of the route's checks, after the seed and
	// before the check's own.
	setup func(*testing.T, *fakeBackend)
	ok    check
	// via names the backend method whose errors the route returns as they
	// are, reached by the ok request (or viaTarget): each sentinel gets its
	// status, a panic there gets 500.
	via       string
	viaTarget string
	// local: the route reads the local replica through ?consistent:
	// a replica that cannot catch up is 503, a bad ?consistent is 400, a
	// closed store is 500, and (without via) ConsistentRead's errors pass
	// through with ?consistent=true.
	local bool
	// body: the route decodes a JSON body: malformed, empty, unknown
	// fields, invalid UTF-8 and over-size bodies are refused.
	body bool
	// noBackend: the route never calls the backend.
	noBackend bool
	checks    []check
}

func withQuery(target, q string) string {
	if strings.Contains(target, "?") {
		return target + "&" + q
	}
	return target + "?" + q
}

// routeTests holds an entry for every route New registers; a route
// without one fails TestRoutes.
var routeTests = map[string]routeTest{
	"GET /livez":   {ok: check{}, noBackend: true},
	"GET /healthz": {ok: check{}, noBackend: true},
	"GET /readyz":  {ok: check{}, via: "Ready"},
	"GET /metrics": {ok: check{verify: header("Content-Type", "text/plain; version=0.0.4; charset=utf-8; escaping=underscores")}, noBackend: true},

	"GET /v1/policies": {ok: check{verify: bodyHas(`"name":"p1"`)}, local: true, checks: []check{
		{name: "identity", target: "/v1/policies?org=acme", verify: bodyHas(`"version":"`)},
		{name: "team without org", target: "/v1/policies?team=t", status: 400, code: "invalid", mention: "org"},
		{name: "query not UTF-8", target: "/v1/policies?kind=%ff", status: 400, code: "invalid", mention: "UTF-8"},
	}},
	"GET /v1/policies/{name}": {ok: check{target: "/v1/policies/p1", verify: etag(1)}, local: true, checks: []check{
		{name: "bad name", target: "/v1/policies/Bad_Name", status: 400, code: "invalid", mention: "name"},
		{name: "missing", target: "/v1/policies/nope", status: 404, code: "not_found", mention: "nope"},
	}},
	"PUT /v1/policies/{name}": {ok: check{target: "/v1/policies/p4", body: policyBody, verify: proposedBy("anonymous")}, via: "Propose", body: true, checks: []check{
		{name: "name mismatch", body: `{"name":"q",` + policyBody[1:], status: 400, code: "invalid", mention: `"q"`},
		{name: "bad name", target: "/v1/policies/Bad_Name", body: policyBody, status: 400, code: "invalid", mention: "name"},
		{name: "invalid spec", body: strings.Replace(policyBody, "deny", "maybe", 1), status: 400, code: "invalid", mention: "spec.action"},
		{name: "bad If-Match", header: map[string]string{"If-Match": "abc"}, body: policyBody, status: 400, code: "invalid", mention: "If-Match"},
		{name: "stale If-Match", target: "/v1/policies/p1", header: map[string]string{"If-Match": `"7"`}, body: policyBody, status: 409, code: "conflict"},
		{name: "must not exist", target: "/v1/policies/p1", header: map[string]string{"If-Match": "0"}, body: policyBody, status: 409, code: "conflict"},
		{name: "under a rollout", target: "/v1/policies/p2", body: policyBody, status: 409, code: "conflict", mention: "r3"},
		{name: "managed by a source", setup: seedManaged, target: "/v1/policies/p5", body: policyBody, status: 409, code: "conflict",
			mention: "managed by git:policies (ToolPolicy p5); change it there"},
		// A leader of an older release answers without the stored value:
		// the answer is read back from this node's replica.
		{name: "older leader", setup: func(_ *testing.T, f *fakeBackend) { f.noValue = true }, target: "/v1/policies/p1", body: policyBody, verify: etag(4)},
	}},
	"DELETE /v1/policies/{name}": {ok: check{target: "/v1/policies/p1", verify: bodyHas(`"deleted":"p1"`)}, via: "Propose", checks: []check{
		{name: "missing", target: "/v1/policies/nope", status: 404, code: "not_found", mention: "nope"},
		{name: "stale If-Match", header: map[string]string{"If-Match": "9"}, status: 409, code: "conflict"},
		{name: "bad If-Match", header: map[string]string{"If-Match": "-1"}, status: 400, code: "invalid", mention: "If-Match"},
		{name: "bad name", target: "/v1/policies/Bad_Name", status: 400, code: "invalid", mention: "name"},
		{name: "managed by a source", setup: seedManaged, target: "/v1/policies/p5", status: 409, code: "conflict", mention: "managed by git:policies"},
	}},
	"GET /v1/policies/{name}/history": {ok: check{target: "/v1/policies/p1/history", verify: bodyHas(`"revision":1`)}, local: true, checks: []check{
		{name: "missing", target: "/v1/policies/nope/history", status: 404, code: "not_found", mention: "nope"},
		{name: "bad name", target: "/v1/policies/Bad_Name/history", status: 400, code: "invalid", mention: "name"},
	}},
	"GET /v1/policies/{name}/revisions/{rev}": {ok: check{target: "/v1/policies/p1/revisions/1", verify: etag(1)}, local: true, checks: []check{
		{name: "rev not a number", target: "/v1/policies/p1/revisions/abc", status: 400, code: "invalid", mention: "rev"},
		{name: "rev zero", target: "/v1/policies/p1/revisions/0", status: 400, code: "invalid", mention: "rev"},
		{name: "another entity's", target: "/v1/policies/p1/revisions/2", status: 404, code: "not_found"},
		{name: "bad name", target: "/v1/policies/Bad_Name/revisions/1", status: 400, code: "invalid", mention: "name"},
	}},
	"POST /v1/policies/{name}/revert": {ok: check{target: "/v1/policies/p1/revert", body: `{"to":1}`, verify: etag(4)}, via: "Propose", local: true, body: true, checks: []check{
		{name: "no to", body: `{}`, status: 400, code: "invalid", mention: "to"},
		{name: "no such revision", body: `{"to":99}`, status: 404, code: "not_found"},
		{name: "header and body differ", header: map[string]string{"If-Match": "1"}, body: `{"to":1,"if_match":2}`, status: 400, code: "invalid", mention: "differ"},
		{name: "stale if_match", body: `{"to":1,"if_match":2}`, status: 409, code: "conflict"},
		{name: "stale If-Match", header: map[string]string{"If-Match": "2"}, body: `{"to":1}`, status: 409, code: "conflict"},
	}},
	"GET /v1/policies/{name}/shadow": {ok: check{target: "/v1/policies/p1/shadow", setup: shadowCounts, verify: bodyHas(`"would_block":3`)}, via: "ShadowCounts", checks: []check{
		{name: "no counts, no policy", target: "/v1/policies/nope/shadow", status: 404, code: "not_found", mention: "nope"},
		{name: "no counts", target: "/v1/policies/p1/shadow", verify: bodyHas(`"evaluated":0`)},
	}},

	"GET /v1/decisions": {ok: check{target: "/v1/decisions?org=acme&result=deny&since=1h&limit=10", verify: bodyHas(`"records":[]`)}, via: "Decisions", checks: []check{
		{name: "unknown result", target: "/v1/decisions?result=maybe", status: 400, code: "invalid", mention: "result"},
		{name: "since neither time nor duration", target: "/v1/decisions?since=yesterday", status: 400, code: "invalid", mention: "since"},
		{name: "negative duration", target: "/v1/decisions?since=-1h", status: 400, code: "invalid", mention: "since"},
		{name: "until before since", target: "/v1/decisions?since=2026-12-04T10:00:00Z&until=2026-12-04T09:00:00Z", status: 400, code: "invalid", mention: "until"},
		{name: "limit over the cap", target: "/v1/decisions?limit=1001", status: 400, code: "invalid", mention: "limit"},
		{name: "limit zero", target: "/v1/decisions?limit=0", status: 400, code: "invalid", mention: "limit"},
		{name: "cursor not ours", target: "/v1/decisions?cursor=%3Cscript%3E", status: 400, code: "invalid", mention: "cursor"},
		{name: "employee twice", target: "/v1/decisions?employee=a&employee=b", status: 400, code: "invalid", mention: "employee"},
		{name: "unreachable named", setup: func(_ *testing.T, f *fakeBackend) { f.unreachable = []string{"n3"} }, target: "/v1/decisions", verify: bodyHas(`"unavailable":["n3"]`)},
	}},

	"GET /v1/employees": {ok: check{target: "/v1/employees?org=acme", verify: bodyHas(`"id":"alice"`)}, local: true},
	"GET /v1/employees/{id}": {ok: check{target: "/v1/employees/alice", verify: etag(2)}, local: true, checks: []check{
		{name: "bad id", target: "/v1/employees/-alice", status: 400, code: "invalid", mention: "id"},
		{name: "missing", target: "/v1/employees/bob", status: 404, code: "not_found", mention: "bob"},
	}},
	"PUT /v1/employees/{id}": {ok: check{target: "/v1/employees/bob", body: employeeBody, verify: etag(4)}, via: "Propose", body: true, checks: []check{
		{name: "id mismatch", body: `{"id":"carol",` + employeeBody[1:], status: 400, code: "invalid", mention: "carol"},
		{name: "bad status", body: strings.Replace(employeeBody, "active", "sleeping", 1), status: 400, code: "invalid", mention: "status"},
		{name: "stale If-Match", target: "/v1/employees/alice", header: map[string]string{"If-Match": "1"}, body: employeeBody, status: 409, code: "conflict"},
	}},
	"DELETE /v1/employees/{id}": {ok: check{target: "/v1/employees/alice", verify: bodyHas(`"deleted":"alice"`)}, via: "Propose", checks: []check{
		{name: "missing", target: "/v1/employees/bob", status: 404, code: "not_found", mention: "bob"},
		{name: "stale If-Match", header: map[string]string{"If-Match": "1"}, status: 409, code: "conflict"},
	}},
	"GET /v1/employees/{id}/history": {ok: check{target: "/v1/employees/alice/history", verify: bodyHas(`"revision":2`)}, local: true, checks: []check{
		{name: "missing", target: "/v1/employees/bob/history", status: 404, code: "not_found", mention: "bob"},
	}},
	"GET /v1/employees/{id}/revisions/{rev}": {ok: check{target: "/v1/employees/alice/revisions/2", verify: etag(2)}, local: true, checks: []check{
		{name: "rev not a number", target: "/v1/employees/alice/revisions/x", status: 400, code: "invalid", mention: "rev"},
		{name: "another entity's", target: "/v1/employees/alice/revisions/1", status: 404, code: "not_found"},
	}},
	"POST /v1/employees/{id}/revert": {ok: check{target: "/v1/employees/alice/revert", body: `{"to":2}`, verify: etag(4)}, via: "Propose", local: true, body: true, checks: []check{
		{name: "no to", body: `{"to":0}`, status: 400, code: "invalid", mention: "to"},
		{name: "stale if_match", body: `{"to":2,"if_match":1}`, status: 409, code: "conflict"},
	}},

	"GET /v1/events": {ok: check{target: "/v1/events?type=policy", verify: bodyHas(`"entity_id":"p1"`)}, local: true, checks: []check{
		{name: "unknown type", target: "/v1/events?type=nope", status: 400, code: "invalid", mention: "nope"},
		{name: "limit too high", target: "/v1/events?limit=1001", status: 400, code: "invalid", mention: "limit"},
		{name: "after negative", target: "/v1/events?after=-1", status: 400, code: "invalid", mention: "after"},
	}},
	"GET /v1/events/watch": {ok: check{cancel: true, verify: bodyHas("id: 1\nevent: policy\n")}, checks: []check{
		{name: "after", target: "/v1/events/watch?after=2", cancel: true, verify: bodyHas("id: 3\nevent: rollout\n")},
		{name: "unknown type", target: "/v1/events/watch?type=nope", status: 400, code: "invalid", mention: "nope"},
		{name: "bad Last-Event-ID", header: map[string]string{"Last-Event-ID": "x"}, status: 400, code: "invalid", mention: "Last-Event-ID"},
	}},

	"GET /v1/cluster": {ok: check{verify: bodyHas(`"leader_id":"n1"`)}, via: "Status"},
	"POST /v1/cluster/join": {ok: check{body: `{"id":"n2","raft_addr":"127.0.0.1:7001"}`, verify: bodyHas(`"id":"n2"`)}, via: "Join", body: true, checks: []check{
		{name: "no raft_addr", body: `{"id":"n2"}`, status: 400, code: "invalid", mention: "raft_addr"},
	}},
	"DELETE /v1/cluster/members/{id}": {ok: check{target: "/v1/cluster/members/n2", verify: bodyHas(`"id":"n2"`)}, via: "Remove"},
	"POST /v1/cluster/transfer-leader": {ok: check{body: `{"id":"n3"}`, verify: bodyHas(`{"from":"n1","to":"n3"}`)}, via: "TransferLeadership", body: true, checks: []check{
		{name: "any voter", body: `{}`, verify: bodyHas(`"to":"n2"`)},
	}},
	"GET /v1/version":  {ok: check{verify: bodyHas(`"version"`)}, noBackend: true},
	"GET /v1/snapshot": {ok: check{verify: header(HeaderAppliedIndex, "3")}, local: true},

	"GET /v1/clients": {ok: check{setup: someClients, verify: bodyHas(`"client_address":"c1"`)}, via: "Clients", checks: []check{
		{name: "a page", setup: someClients, target: "/v1/clients?state=pending&limit=1", verify: bodyHas(`"total":1,"counts":{"pending":1,"acked":1,"nacked":0,"stale":2},"limit":1`)},
		{name: "bad state", target: "/v1/clients?state=bogus", status: 400, code: "invalid", mention: "bogus"},
		{name: "limit too high", target: "/v1/clients?limit=10001", status: 400, code: "invalid", mention: "limit"},
	}},
	"GET /v1/proxy-status": {ok: check{setup: someClients, verify: bodyHas(`"done":false`)}, via: "Clients", checks: []check{
		{name: "bad wait", target: "/v1/proxy-status?wait=forever", status: 400, code: "invalid", mention: "wait"},
	}},
	"GET /v1/rollout": {ok: check{setup: someClients, verify: bodyHas(`"done":false`)}, via: "Clients", checks: []check{
		{name: "bad wait", target: "/v1/rollout?wait=-1s", status: 400, code: "invalid", mention: "wait"},
	}},

	"POST /v1/rollouts": {ok: check{body: rolloutBody, status: 201, verify: bodyHas(`"id":"r4"`)}, via: "Propose", body: true, checks: []check{
		{name: "bad stage", body: strings.Replace(rolloutBody, `"percent":100`, `"percent":0`, 1), status: 400, code: "invalid", mention: "stages[0].percent"},
		{name: "delete of a missing policy", body: `{"changes":[{"op":"delete","name":"nope"}],"stages":[{"percent":100,"bake":"1h"}]}`, status: 400, code: "invalid", mention: "changes[0].name"},
		{name: "overlaps r3", body: strings.ReplaceAll(rolloutBody, `"p3"`, `"p2"`), status: 409, code: "conflict", mention: "r3"},
		{name: "consistent read fails", setup: failWith("ConsistentRead", unavailable{}), body: `{"changes":[{"op":"delete","name":"p1"}],"stages":[{"percent":100,"bake":"1h"}]}`, status: 503, code: "unavailable"},
		{name: "impact ratio out of range", body: strings.Replace(rolloutBody, `"stages"`, `"max_impact_ratio":1.5,"stages"`, 1), status: 400, code: "invalid", mention: "max_impact_ratio"},
		{name: "impact since unreadable", body: strings.Replace(rolloutBody, `"stages"`, `"max_impact_ratio":0.1,"impact_since":"soon","stages"`, 1), status: 400, code: "invalid", mention: "impact_since"},
		{name: "impact over the limit", setup: impactOf(3, 100), body: strings.Replace(rolloutBody, `"stages"`, `"max_impact_ratio":0.01,"stages"`, 1), status: 409, verify: bodyHas(`"code":"conflict","message":"the changes turn 3 of 100 logged allowed decisions into denials (0.0300), over max_impact_ratio 0.01","reason":"impact"},"impact":{`)},
		{name: "impact within the limit", setup: impactOf(1, 100), body: strings.Replace(rolloutBody, `"stages"`, `"max_impact_ratio":0.01,"stages"`, 1), status: 201, verify: bodyHas(`"id":"r4"`)},
		{name: "impact replay fails", setup: failWith("Impact", unavailable{}), body: strings.Replace(rolloutBody, `"stages"`, `"max_impact_ratio":0.01,"stages"`, 1), status: 503, code: "unavailable"},
	}},
	"POST /v1/impact": {ok: check{body: impactBody, verify: bodyHas(`"teams":[]`)}, via: "Impact", body: true, checks: []check{
		{name: "no changes", body: `{"changes":[]}`, status: 400, code: "invalid", mention: "changes"},
		{name: "invalid policy", body: `{"changes":[{"op":"put","policy":{"name":"acme.x","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Bash","action":"maybe"}}}]}`, status: 400, code: "invalid", mention: "changes[0].policy"},
		{name: "unknown op", body: `{"changes":[{"op":"patch","name":"p1"}]}`, status: 400, code: "invalid", mention: "changes[0].op"},
		{name: "bad since", body: `{"changes":[{"op":"delete","name":"p1"}],"since":"last week"}`, status: 400, code: "invalid", mention: "since"},
		{name: "team without org", body: `{"changes":[{"op":"delete","name":"p1"}],"team":"red"}`, status: 400, code: "invalid", mention: "team"},
		{name: "timeout too long", body: `{"changes":[{"op":"delete","name":"p1"}],"timeout":"1h"}`, status: 400, code: "invalid", mention: "timeout"},
		{name: "too many examples", body: `{"changes":[{"op":"delete","name":"p1"}],"max_examples":1000}`, status: 400, code: "invalid", mention: "max_examples"},
		{name: "unknown field", body: `{"changes":[{"op":"delete","name":"p1"}],"dry":true}`, status: 400, code: "invalid", mention: "dry"},
		{name: "replay fails", setup: failWith("Impact", unavailable{}), status: 503, code: "unavailable"},
	}},
	"GET /v1/rollouts": {ok: check{target: "/v1/rollouts?state=all", verify: bodyHas(`"id":"r3"`)}, local: true, checks: []check{
		{name: "active", target: "/v1/rollouts?state=active", verify: bodyHas(`"id":"r3"`)},
		{name: "bad state", target: "/v1/rollouts?state=bogus", status: 400, code: "invalid", mention: "bogus"},
	}},
	"GET /v1/rollouts/{id}": {ok: check{target: "/v1/rollouts/r3", setup: shadowCounts, verify: bodyHas(`"state":"current"`)}, via: "Clients", local: true, checks: []check{
		{name: "missing", target: "/v1/rollouts/r0", status: 404, code: "not_found", mention: "r0"},
		{name: "shadow counts fail", setup: failWith("ShadowCounts", unavailable{}), status: 503, code: "unavailable"},
		// The counts are gathered on another goroutine: its panic must
		// still be the request's 500, not the process's end.
		{name: "shadow counts panic", setup: panicIn("ShadowCounts"), status: 500, code: "internal"},
	}},
	"POST /v1/rollouts/{id}/pause": {ok: check{target: "/v1/rollouts/r3/pause", verify: bodyHas(`"state":"paused"`)}, via: "Propose", checks: []check{
		{name: "missing", target: "/v1/rollouts/r0/pause", status: 404, code: "not_found", mention: "r0"},
		{name: "paused already", setup: transition("pause"), status: 409, code: "conflict", mention: "paused"},
		{name: "consistent read fails", setup: failWith("ConsistentRead", unavailable{}), status: 503, code: "unavailable"},
	}},
	"POST /v1/rollouts/{id}/resume": {setup: transition("pause"), ok: check{target: "/v1/rollouts/r3/resume", verify: bodyHas(`"state":"running"`)}, via: "Propose", checks: []check{
		{name: "running", setup: transition("resume"), status: 409, code: "conflict", mention: "running"},
	}},
	"POST /v1/rollouts/{id}/promote": {ok: check{target: "/v1/rollouts/r3/promote", verify: bodyHas(`"state":"completed"`)}, via: "Propose", checks: []check{
		{name: "aborted", setup: transition("abort"), status: 409, code: "conflict", mention: "aborted"},
	}},
	"POST /v1/rollouts/{id}/abort": {ok: check{target: "/v1/rollouts/r3/abort", verify: bodyHas(`"halt_reason":"aborted by anonymous"`)}, via: "Propose", checks: []check{
		{name: "completed", setup: transition("promote"), status: 409, code: "conflict", mention: "completed"},
	}},

	"GET /v1/reload": {ok: check{verify: bodyHas(`"applied_index":3`)}, local: true},
	"GET /v1/drift": {ok: check{verify: bodyHas(`"reports":[]`)}, local: true, checks: []check{
		{name: "bad phase", target: "/v1/drift?phase=Gone", status: 400, code: "invalid", mention: "phase"},
		{name: "bad delivery", target: "/v1/drift?delivery=lost", status: 400, code: "invalid", mention: "delivery"},
		{name: "limit too high", target: "/v1/drift?limit=5000", status: 400, code: "invalid", mention: "limit"},
	}},

	"GET /v1/sources": {ok: check{setup: seedManaged, verify: bodyHas(`"name":"git:policies","synced_revision":"c1"`)}, local: true},
	"GET /v1/sources/{name}": {ok: check{target: "/v1/sources/git:policies", verify: bodyHas(`"policies":0`)}, local: true, checks: []check{
		{name: "not configured", target: "/v1/sources/git:other", status: 404, code: "not_found", mention: "git:other"},
	}},
	"POST /v1/sources/{name}/sync": {ok: check{target: "/v1/sources/git:policies/sync?allow_prune=true", status: 202, verify: bodyHas(`"request_index":4,"allow_prune":true`)}, via: "Propose", checks: []check{
		{name: "not configured", target: "/v1/sources/kubernetes/sync", status: 404, code: "not_found", mention: "kubernetes"},
		{name: "bad allow_prune", target: "/v1/sources/git:policies/sync?allow_prune=maybe", status: 400, code: "invalid", mention: "allow_prune"},
	}},
	"POST /v1/sources/{name}/hook": {ok: check{target: "/v1/sources/git:policies/hook", body: `{"ref":"refs/heads/main"}`, header: map[string]string{"X-Gitlab-Token": "s3cret"}, status: 202, verify: proposedBy("hook:git:policies")}, via: "VerifySourceHook", checks: []check{
		{name: "bad token", header: map[string]string{"X-Gitlab-Token": "guess"}, status: 401, code: "unauthorized", mention: "signature"},
		{name: "not configured", target: "/v1/sources/git:other/hook", status: 404, code: "not_found"},
		{name: "bare name", target: "/v1/sources/policies/hook", status: 202, verify: proposedBy("hook:git:policies")},
		{name: "too large", body: strings.Repeat("x", MaxBodyBytes+1), status: 413, code: "invalid", mention: "exceeds"},
	}},

	"GET /debug/pprof/":        {ok: check{verify: bodyHas("goroutine")}, noBackend: true},
	"GET /debug/pprof/cmdline": {ok: check{}, noBackend: true},
	"GET /debug/pprof/profile": {ok: check{cancel: true}, noBackend: true},
	"GET /debug/pprof/symbol":  {ok: check{}, noBackend: true},
	"GET /debug/pprof/trace":   {ok: check{cancel: true}, noBackend: true},
}

// seedManaged commits a sync of git:policies that puts policy p5.
func seedManaged(t *testing.T, f *fakeBackend) {
	t.Helper()
	p, err := policy.DecodePolicy([]byte(policyBody))
	if err != nil {
		t.Fatal(err)
	}
	p.Name = "p5"
	pb, err := command.PolicyMessage(p)
	if err != nil {
		t.Fatal(err)
	}
	f.seed(t)(command.SyncSource(&commandv1.SyncSource{Source: fakeSource, Revision: "c1", Parts: 1, Puts: []*commandv1.Policy{pb}}))
}

func failWith(method string, err error) func(*testing.T, *fakeBackend) {
	return func(_ *testing.T, f *fakeBackend) { f.fail(method, err) }
}

func panicIn(method string) func(*testing.T, *fakeBackend) {
	return func(_ *testing.T, f *fakeBackend) { f.panicIn(method) }
}

func shadowCounts(_ *testing.T, f *fakeBackend) {
	f.shadow = []*clusterv1.ShadowScopeCount{
		{Policy: "p1", Scope: "acme", WouldBlock: 3, Evaluated: 10},
		{Policy: "p2", Scope: "acme", WouldAllow: 1, Evaluated: 4},
	}
}

func someClients(_ *testing.T, f *fakeBackend) {
	f.clients = []*clusterv1.ClientInfo{
		{NodeId: "n1", ClientAddress: "c1", Transport: "grpc", VersionSent: "v2", State: proxystatus.Acked},
		{NodeId: "n1", ClientAddress: "c2", Transport: "grpc", VersionSent: "v2", State: proxystatus.Pending},
	}
}

func bodyHas(s string) func(*testing.T, *fakeBackend, *httptest.ResponseRecorder) {
	return func(t *testing.T, _ *fakeBackend, w *httptest.ResponseRecorder) {
		t.Helper()
		if !strings.Contains(w.Body.String(), s) {
			t.Errorf("body does not hold %q:\n%s", s, w.Body)
		}
	}
}

func header(name, want string) func(*testing.T, *fakeBackend, *httptest.ResponseRecorder) {
	return func(t *testing.T, _ *fakeBackend, w *httptest.ResponseRecorder) {
		t.Helper()
		if got := w.Header().Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

func etag(rev uint64) func(*testing.T, *fakeBackend, *httptest.ResponseRecorder) {
	return header("ETag", fmt.Sprintf("%q", fmt.Sprint(rev)))
}

// proposedBy checks that the request proposed one command, audited with
// actor and the request id it answered with.
func proposedBy(actor string) func(*testing.T, *fakeBackend, *httptest.ResponseRecorder) {
	return func(t *testing.T, f *fakeBackend, w *httptest.ResponseRecorder) {
		t.Helper()
		cmds := f.commands()
		if len(cmds) != 1 {
			t.Fatalf("proposed %d commands, want 1", len(cmds))
		}
		if got, want := cmds[0].Actor, actor; got != want {
			t.Errorf("actor = %q, want %q", got, want)
		}
		if got, want := cmds[0].RequestID, w.Header().Get(RequestIDHeader); got == "" || got != want {
			t.Errorf("request id = %q, want the response's %q", got, want)
		}
	}
}

// errorKinds are the backend errors every route's via method is made to
// return, and what each must become.
var errorKinds = []struct {
	name   string
	err    error
	status int
	code   string
}{
	{"not found", fmt.Errorf("lookup: %w", store.ErrNotFound), 404, "not_found"},
	{"conflict", fmt.Errorf("compare-and-set: %w", store.ErrConflict), 409, "conflict"},
	{"invalid", fmt.Errorf("check: %w", policy.ErrInvalid), 400, "invalid"},
	{"unavailable", fmt.Errorf("propose: %w", unavailable{}), 503, "unavailable"},
	{"deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), 503, "unavailable"},
	{"internal", fmt.Errorf("read %s: input/output error", secretPath), 500, "internal"},
}

// checksFor expands a route's table entry into its checks.
func checksFor(pattern string, rt routeTest) []check {
	method, path, _ := strings.Cut(pattern, " ")
	ok := rt.ok
	ok.name = "ok"
	if ok.target == "" {
		ok.target = path
	}
	if ok.status == 0 {
		ok.status = http.StatusOK
	}
	out := []check{ok}
	// Every other check starts from the ok request.
	like := func(c check) check {
		if c.method == "" {
			c.method = method
		}
		if c.target == "" {
			c.target = ok.target
		}
		if c.body == "" && !c.noBody {
			c.body = ok.body
		}
		if setup, own := rt.setup, c.setup; setup != nil {
			c.setup = func(t *testing.T, f *fakeBackend) {
				setup(t, f)
				if own != nil {
					own(t, f)
				}
			}
		}
		if c.header == nil {
			c.header = ok.header
		}
		if !c.cancel {
			c.cancel = ok.cancel
		}
		if c.status == 0 {
			c.status = http.StatusOK
		}
		return c
	}
	if rt.local {
		out = append(out,
			check{name: "replica behind", setup: failWith("ReadOwnWrites", context.DeadlineExceeded), status: 503, code: "unavailable", mention: "consistent=true"},
			check{name: "bad consistent", target: withQuery(ok.target, "consistent=maybe"), status: 400, code: "invalid", mention: "consistent"},
			check{name: "store closed", setup: func(t *testing.T, f *fakeBackend) {
				if err := f.st.Close(); err != nil {
					t.Fatal(err)
				}
			}, status: 500, code: "internal"},
		)
		if rt.via == "" {
			rt.via, rt.viaTarget = "ConsistentRead", withQuery(ok.target, "consistent=true")
		}
	}
	if rt.via != "" {
		for _, k := range errorKinds {
			out = append(out, check{name: rt.via + " " + k.name, target: rt.viaTarget, setup: failWith(rt.via, k.err), status: k.status, code: k.code})
		}
		out = append(out, check{name: rt.via + " panics", target: rt.viaTarget, setup: panicIn(rt.via), status: 500, code: "internal", mention: "internal error"})
	}
	if rt.noBackend {
		out = append(out, check{name: "backend panics", setup: panicIn("*"), verify: ok.verify})
	} else {
		out = append(out, check{name: "backend panics", setup: panicIn("*"), status: 500, code: "internal", mention: "internal error"})
	}
	if params := pathParams(path); len(params) > 0 {
		// Each wildcard's segment of the ok target, not valid UTF-8.
		pat, tgt := strings.Split(path, "/"), strings.Split(ok.target, "/")
		for i, seg := range pat {
			if strings.HasPrefix(seg, "{") && i < len(tgt) {
				bad := append([]string(nil), tgt...)
				bad[i] = "%ff"
				name := strings.Trim(seg, "{}.")
				out = append(out, check{name: name + " not UTF-8", target: strings.Join(bad, "/"), status: 400, code: "invalid", mention: "path parameter " + name})
			}
		}
	}
	if rt.body {
		out = append(out,
			check{name: "no body", noBody: true, status: 400, code: "invalid", mention: "body"},
			check{name: "malformed body", body: `{"id":`, status: 400, code: "invalid"},
			check{name: "not an object", body: `[1]`, status: 400, code: "invalid"},
			check{name: "unknown field", body: `{"zzz":1}`, status: 400, code: "invalid", mention: "zzz"},
			check{name: "body not UTF-8", body: "{\"id\":\"\xff\"}", status: 400, code: "invalid", mention: "UTF-8"},
			check{name: "body over 1 MiB", body: `{"id":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, status: 413, code: "invalid", mention: "exceeds"},
		)
	}
	out = append(out, rt.checks...)
	for i := range out {
		out[i] = like(out[i])
	}
	return out
}

// TestRoutes walks every route the API registers, against a fake backend
// over a real store: its success, its bad input, each backend error it
// passes on, and a panic in the backend, each with its status and, for an
// error, the JSON envelope. A route added without a table entry fails.
func TestRoutes(t *testing.T) {
	seen := map[string]bool{}
	for _, route := range New(Config{}, discard(), newFake(t)).Routes() {
		seen[route.Pattern] = true
		rt, ok := routeTests[route.Pattern]
		if !ok {
			t.Errorf("route %s has no entry in routeTests", route.Pattern)
			continue
		}
		t.Run(route.Pattern, func(t *testing.T) {
			for _, c := range checksFor(route.Pattern, rt) {
				t.Run(c.name, func(t *testing.T) { runCheck(t, c) })
			}
		})
	}
	for pattern := range routeTests {
		if !seen[pattern] {
			t.Errorf("routeTests has %s, which the API does not register", pattern)
		}
	}
}

// runCheck sends c to a fresh API over a freshly seeded fake.
func runCheck(t *testing.T, c check) {
	f := newFake(t)
	seedState(t, f)
	if c.setup != nil {
		c.setup(t, f)
	}
	a := New(Config{}, discard(), f)
	t.Cleanup(a.CloseStreams)
	r := newRequest(c.method, c.target, c.body, c.header)
	if c.cancel {
		ctx, cancel := context.WithCancel(r.Context())
		cancel()
		r = r.WithContext(ctx)
	}
	w := serve(a, r)
	if w.Code != c.status {
		t.Fatalf("%s %s: status %d, want %d: %.300s", c.method, c.target, w.Code, c.status, w.Body)
	}
	if c.code != "" {
		checkEnvelope(t, w, c.code, c.mention)
	}
	if c.verify != nil {
		c.verify(t, f, w)
	}
}

// checkEnvelope checks that w is the JSON error envelope with code, its
// message naming mention; a 503 says when to retry, and a 500 shows no
// internals.
func checkEnvelope(t *testing.T, w *httptest.ResponseRecorder, code, mention string) {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var env apierror.Envelope
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		t.Fatalf("body is not the error envelope: %v: %s", err, w.Body)
	}
	if env.Error.Code != code {
		t.Errorf("code = %q, want %q: %s", env.Error.Code, code, w.Body)
	}
	if env.Error.Message == "" || !strings.Contains(env.Error.Message, mention) {
		t.Errorf("message %q does not mention %q", env.Error.Message, mention)
	}
	switch w.Code {
	case http.StatusServiceUnavailable:
		if w.Header().Get("Retry-After") == "" {
			t.Error("a 503 without Retry-After")
		}
	case http.StatusInternalServerError:
		if strings.Contains(env.Error.Message, secretPath) || strings.Contains(env.Error.Message, "panics") {
			t.Errorf("a 500 shows internals: %q", env.Error.Message)
		}
	}
}

// TestNoRoute: paths and methods the API does not serve get the envelope
// too.
func TestNoRoute(t *testing.T) {
	a := New(Config{}, discard(), newFake(t))
	tests := []struct {
		name, method, target string
		status               int
		code, allow          string
	}{
		{"unknown path", "GET", "/v2/nothing", 404, "not_found", ""},
		{"wrong method", "POST", "/v1/policies/p1", 405, "invalid", "GET, PUT, DELETE"},
		{"path not UTF-8", "GET", "/v1/%ff/x", 400, "invalid", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(a, newRequest(tc.method, tc.target, "", nil))
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			checkEnvelope(t, w, tc.code, "")
			if got := w.Header().Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
		})
	}
}

// TestTransferLeaderUnsupported: a backend that cannot hand over the lead
// answers 501 in the envelope.
func TestTransferLeaderUnsupported(t *testing.T) {
	f := newFake(t)
	a := New(Config{}, discard(), struct{ Backend }{f})
	w := serve(a, newRequest("POST", "/v1/cluster/transfer-leader", `{}`, nil))
	if w.Code != http.StatusNotImplemented {
		t.Fatalf("status %d, want 501: %s", w.Code, w.Body)
	}
	checkEnvelope(t, w, "internal", "cannot transfer")
}

// impactOf makes the backend's impact replay find flips allow-to-deny
// flips among evaluated decisions.
func impactOf(flips, evaluated uint64) func(*testing.T, *fakeBackend) {
	return func(_ *testing.T, f *fakeBackend) {
		f.impact = &decisionsv1.ImpactReport{
			Totals:           decisionsv1.ImpactCounts{Evaluated: evaluated, AllowToDeny: flips, Unchanged: evaluated - flips},
			AllowToDenyRatio: float64(flips) / float64(evaluated),
			Teams:            []decisionsv1.ImpactTeam{},
		}
	}
}
