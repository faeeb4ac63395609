package feed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// Identities of the standard data set: two teams of acme, and a team of
// another org with the same team name (team keys are per org).
var (
	alice = identity("acme", "red", "alice")
	bob   = identity("acme", "blue", "bob")
	carol = identity("other", "red", "carol")
)

// seedData writes the standard employees and one policy per scope level.
func seedData(f *fixture) uint64 {
	f.t.Helper()
	return f.apply(
		f.putEmployee("alice", "acme", "red", policy.StatusActive),
		f.putEmployee("bob", "acme", "blue", policy.StatusActive),
		f.putEmployee("carol", "other", "red", policy.StatusActive),
		f.putEmployee("dave", "acme", "red", policy.StatusInactive),
		f.putPolicy("g-all", policy.Scope{}, "global"),
		f.putPolicy("o-acme", scopeOrg("acme"), "acme"),
		f.putPolicy("o-other", scopeOrg("other"), "other"),
		f.putPolicy("t-acme-red", scopeTeam("acme", "red"), "acme red"),
		f.putPolicy("t-acme-blue", scopeTeam("acme", "blue"), "acme blue"),
		f.putPolicy("t-other-red", scopeTeam("other", "red"), "other red"),
		f.putPolicy("e-alice", scopeEmp("acme", "alice"), "alice"),
		f.putPolicy("e-bob", scopeEmp("acme", "bob"), "bob"),
	)
}

// connect dials as the employee of id with a valid token and returns the
// client and its init.
func (f *fixture) connect(t *testing.T, id policy.Identity, query string) (*client, feedv1.Message) {
	t.Helper()
	c := f.dial(t, dialOpts{token: f.token(id.Employee, id.Org, id.Team), query: query})
	return c, c.nextOf(feedv1.TypeInit)
}

func TestHandshakeRefusals(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	other := signToken(t, []byte(strings.Repeat("k", 48)), "alice", "acme", "red")
	tests := []struct {
		name   string
		method string
		query  string
		hdr    map[string]string
		status int
		code   string
	}{
		{name: "no token", status: 401, code: "unauthorized"},
		{name: "another scheme", hdr: map[string]string{"Authorization": "Basic YWxpY2U6eA=="}, status: 401, code: "unauthorized"},
		{name: "garbage token", hdr: bearer("not.a.jwt"), status: 401, code: "unauthorized"},
		{name: "invalid signature", hdr: bearer(other), status: 401, code: "unauthorized"},
		{name: "expired", hdr: bearer(f.token("alice", "acme", "red", func(c claims) { c["exp"] = time.Now().Add(-time.Minute).Unix() })), status: 401, code: "unauthorized"},
		{name: "wrong issuer", hdr: bearer(f.token("alice", "acme", "red", func(c claims) { c["iss"] = "someone-else" })), status: 401, code: "unauthorized"},
		{name: "wrong audience", hdr: bearer(f.token("alice", "acme", "red", func(c claims) { c["aud"] = "another-service" })), status: 401, code: "unauthorized"},
		{name: "unknown employee", hdr: bearer(f.token("mallory", "acme", "red")), status: 401, code: "unauthorized"},
		{name: "inactive employee", hdr: bearer(f.token("dave", "acme", "red")), status: 403, code: "forbidden"},
		{name: "token of another org", hdr: bearer(f.token("alice", "other", "")), status: 403, code: "forbidden"},
		{name: "bad token in subprotocol", hdr: map[string]string{"Sec-WebSocket-Protocol": "bearer." + other + ", " + feedv1.Subprotocol}, status: 401, code: "unauthorized"},
		{name: "subprotocol token without policyd.feed.v1", hdr: map[string]string{"Sec-WebSocket-Protocol": "bearer." + f.token("alice", "acme", "red")}, status: 400, code: "invalid"},
		{name: "since not a number", query: "since=yesterday", hdr: bearer(f.token("alice", "acme", "red")), status: 400, code: "invalid"},
		{name: "since negative", query: "since=-1", hdr: bearer(f.token("alice", "acme", "red")), status: 400, code: "invalid"},
		{name: "query parameter not UTF-8", query: "since=1&x=%C3", hdr: bearer(f.token("alice", "acme", "red")), status: 400, code: "invalid"},
		{name: "not an upgrade", hdr: map[string]string{"Connection": "", "Upgrade": "", "Authorization": "Bearer " + f.token("alice", "acme", "red")}, status: 400, code: "invalid"},
		{name: "wrong websocket version", hdr: map[string]string{"Sec-WebSocket-Version": "8"}, status: 400, code: "invalid"},
		{name: "POST", method: http.MethodPost, status: 405, code: "invalid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			status, hdr, body := f.handshake(t, method, tc.query, tc.hdr)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if got := envelopeCode(t, body); got != tc.code {
				t.Errorf("code %q, want %q", got, tc.code)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if status == 401 && hdr.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	if n := len(f.hub.Clients()); n != 0 {
		t.Fatalf("%d connections after refusals", n)
	}
}

func bearer(token string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + token}
}

func TestHandshakeAccepts(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	tok := f.token("alice", "acme", "red")
	tests := []struct {
		name        string
		opts        dialOpts
		wantSubprot string
	}{
		{name: "authorization header", opts: dialOpts{token: tok}},
		{name: "authorization header and offered subprotocol", opts: dialOpts{token: tok, subprotocols: []string{feedv1.Subprotocol}}, wantSubprot: feedv1.Subprotocol},
		{name: "token as subprotocol", opts: dialOpts{subprotocols: []string{feedv1.SubprotocolPrefix + tok, feedv1.Subprotocol}}, wantSubprot: feedv1.Subprotocol},
		{name: "token without team claim", opts: dialOpts{token: f.token("alice", "acme", "")}},
		// The record decides the team: a token minted before a move is
		// served the record's team.
		{name: "token of another team", opts: dialOpts{token: f.token("alice", "acme", "blue")}},
		// Parameters of later versions are ignored, never refused, so a
		// newer client keeps working with this server.
		{name: "capabilities and an unknown parameter", opts: dialOpts{token: tok, query: "capabilities=rollouts,shadow,teleport&later-param=1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, resp, err := f.tryDial(t, tc.opts) //nolint:bodyclose // websocket.Dial owns the response body
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != tc.wantSubprot {
				t.Errorf("selected subprotocol %q, want %q", got, tc.wantSubprot)
			}
			for k, vs := range resp.Header {
				for _, v := range vs {
					if strings.Contains(v, tok) {
						t.Errorf("response header %s echoes the token", k)
					}
				}
			}
			init := c.nextOf(feedv1.TypeInit)
			if diff := cmp.Diff(f.wantNames(alice), policyNames(init.Policies)); diff != "" {
				t.Errorf("init policies (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAuthModeNone: without a verifier the employee is named in the query,
// and its record still decides.
func TestAuthModeNone(t *testing.T) {
	f := newFixture(t, fixtureOpts{noAuth: true})
	seedData(f)
	tests := []struct {
		query  string
		status int
		code   string
	}{
		{query: "", status: 401, code: "unauthorized"},
		{query: "employee=mallory", status: 401, code: "unauthorized"},
		{query: "employee=dave", status: 403, code: "forbidden"},
		{query: "employee=%FF", status: 400, code: "invalid"},
	}
	for _, tc := range tests {
		t.Run("refused "+tc.query, func(t *testing.T) {
			status, _, body := f.handshake(t, http.MethodGet, tc.query, nil)
			if status != tc.status || envelopeCode(t, body) != tc.code {
				t.Fatalf("status %d body %s, want %d %s", status, body, tc.status, tc.code)
			}
		})
	}
	t.Run("accepted", func(t *testing.T) {
		c := f.dial(t, dialOpts{query: "employee=bob"})
		init := c.nextOf(feedv1.TypeInit)
		if diff := cmp.Diff(f.wantNames(bob), policyNames(init.Policies)); diff != "" {
			t.Errorf("init policies (-want +got):\n%s", diff)
		}
	})
}

func TestInitPerScope(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	last := seedData(f)
	tests := []struct {
		id   policy.Identity
		want []string
	}{
		{alice, []string{"e-alice", "g-all", "o-acme", "t-acme-red"}},
		{bob, []string{"e-bob", "g-all", "o-acme", "t-acme-blue"}},
		{carol, []string{"g-all", "o-other", "t-other-red"}},
	}
	for _, tc := range tests {
		t.Run(tc.id.Employee, func(t *testing.T) {
			_, init := f.connect(t, tc.id, "")
			if diff := cmp.Diff(tc.want, policyNames(init.Policies)); diff != "" {
				t.Errorf("policies (-want +got):\n%s", diff)
			}
			if got, want := init.Version, last; got != want {
				t.Errorf("version %d, want the applied index %d", got, want)
			}
			if got, want := init.Digest, f.wantDigest(tc.id); got != want {
				t.Errorf("digest %s, want the store's set version %s", got, want)
			}
			for _, p := range init.Policies {
				if len(p.Spec) == 0 || p.Kind != policy.KindToolPolicy || p.Revision == 0 {
					t.Errorf("policy %+v is incomplete", p)
				}
			}
		})
	}
}

// TestScopedDelivery walks changes at every scope level, including moves
// between scopes, and checks what each connection receives: exactly the
// expected upserts and deletes, nothing for the others. A global marker
// after each step delimits it (each connection's messages are in order).
func TestScopedDelivery(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	ids := []policy.Identity{alice, bob, carol}
	clients := map[string]*client{}
	for _, id := range ids {
		clients[id.Employee], _ = f.connect(t, id, "")
	}
	steps := []struct {
		name  string
		write func() uint64
		want  map[string][]string // by employee; missing: nothing
	}{
		{"team policy created", func() uint64 { return f.apply(f.putPolicy("p", scopeTeam("acme", "red"), "1")) },
			map[string][]string{"alice": {"upsert:p"}}},
		{"team policy updated", func() uint64 { return f.apply(f.putPolicy("p", scopeTeam("acme", "red"), "2")) },
			map[string][]string{"alice": {"upsert:p"}}},
		{"moved to another team", func() uint64 { return f.apply(f.putPolicy("p", scopeTeam("acme", "blue"), "3")) },
			map[string][]string{"alice": {"delete:p"}, "bob": {"upsert:p"}}},
		{"moved to another org's team of the same name", func() uint64 { return f.apply(f.putPolicy("p", scopeTeam("other", "red"), "4")) },
			map[string][]string{"bob": {"delete:p"}, "carol": {"upsert:p"}}},
		{"moved to an org", func() uint64 { return f.apply(f.putPolicy("p", scopeOrg("acme"), "5")) },
			map[string][]string{"alice": {"upsert:p"}, "bob": {"upsert:p"}, "carol": {"delete:p"}}},
		{"narrowed to an employee", func() uint64 { return f.apply(f.putPolicy("p", scopeEmp("acme", "bob"), "6")) },
			map[string][]string{"alice": {"delete:p"}, "bob": {"upsert:p"}}},
		{"widened to global", func() uint64 { return f.apply(f.putPolicy("p", policy.Scope{}, "7")) },
			map[string][]string{"alice": {"upsert:p"}, "bob": {"upsert:p"}, "carol": {"upsert:p"}}},
		{"deleted", func() uint64 { return f.apply(f.deletePolicy("p")) },
			map[string][]string{"alice": {"delete:p"}, "bob": {"delete:p"}, "carol": {"delete:p"}}},
		{"org policy deleted", func() uint64 { return f.apply(f.deletePolicy("o-other")) },
			map[string][]string{"carol": {"delete:o-other"}}},
		{"employee policy of another employee", func() uint64 { return f.apply(f.putPolicy("e-bob", scopeEmp("acme", "bob"), "x")) },
			map[string][]string{"bob": {"upsert:e-bob"}}},
		{"unrelated employee change", func() uint64 {
			return f.apply(f.putEmployee("erin", "acme", "red", policy.StatusActive))
		}, map[string][]string{}},
		{"two changes of one policy in one batch", func() uint64 {
			return f.apply(f.putPolicy("q", scopeOrg("acme"), "1"), f.putPolicy("q", scopeOrg("other"), "2"))
		}, map[string][]string{"alice": {"delete:q"}, "bob": {"delete:q"}, "carol": {"upsert:q"}}},
	}
	for i, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			before := f.st.AppliedIndex()
			index := step.write()
			digests := map[string]string{}
			for _, id := range ids {
				digests[id.Employee] = f.wantDigest(id)
			}
			marker := fmt.Sprintf("marker-%d", i)
			f.apply(f.putPolicy(marker, policy.Scope{}, "marker"))
			for _, id := range ids {
				got := clients[id.Employee].until(marker)
				want := step.want[id.Employee]
				if want == nil {
					want = []string{}
				}
				if diff := cmp.Diff(want, summary(got)); diff != "" {
					t.Errorf("%s received (-want +got):\n%s", id.Employee, diff)
				}
				for _, m := range got {
					if m.Version <= before || m.Version > index {
						t.Errorf("%s: %s version %d, want the index of a change of this step (%d, %d]", id.Employee, m.Type, m.Version, before, index)
					}
					if m.Digest != digests[id.Employee] {
						t.Errorf("%s: %s digest %.8s, want the store's %.8s", id.Employee, m.Type, m.Digest, digests[id.Employee])
					}
					if m.Type == feedv1.TypeUpsert && !wireScope(m.Policy.Scope).AppliesTo(id) {
						t.Errorf("%s: upsert of %s with scope %+v that does not apply", id.Employee, m.Policy.Name, m.Policy.Scope)
					}
				}
			}
		})
	}
}

// TestLargeBatchBecomesInit: a batch with more messages for a connection
// than its queue has room for arrives as one init.
func TestLargeBatchBecomesInit(t *testing.T) {
	f := newFixture(t, fixtureOpts{feed: func(c *config.Feed) { c.SendBuffer = 4 }})
	seedData(f)
	c, _ := f.connect(t, alice, "")
	batch := f.apply(
		f.putPolicy("b1", scopeOrg("acme"), "1"),
		f.putPolicy("b2", scopeOrg("acme"), "2"),
		f.putPolicy("b3", scopeOrg("acme"), "3"),
		f.putPolicy("b4", scopeOrg("acme"), "4"),
		f.putPolicy("b5", scopeOrg("acme"), "5"),
		f.putPolicy("b6", scopeOrg("acme"), "6"),
	)
	init := c.nextOf(feedv1.TypeInit)
	if diff := cmp.Diff(f.wantNames(alice), policyNames(init.Policies)); diff != "" {
		t.Errorf("init (-want +got):\n%s", diff)
	}
	if init.Version < batch {
		t.Errorf("init version %d, want at least %d", init.Version, batch)
	}
	f.apply(f.putPolicy("marker", policy.Scope{}, "m"))
	if got := c.until("marker"); len(got) != 0 {
		t.Errorf("after the init: %v", summary(got))
	}
}

// TestTenantIsolationProperty applies random policy writes, moves and
// deletes over random orgs, teams and employees, and checks that no
// connection ever hears of a policy that never applied to it, and that
// every connection ends with exactly the set the store says applies.
func TestTenantIsolationProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	f := newFixture(t, fixtureOpts{})

	orgs := []string{"o1", "o2", "o3"}
	teams := []string{"t1", "t2"}
	var ids []policy.Identity
	var emps []*command.Command
	for _, o := range orgs {
		for _, tm := range teams {
			for e := range 2 {
				id := identity(o, tm, fmt.Sprintf("%s-%s-e%d", o, tm, e))
				ids = append(ids, id)
				emps = append(emps, f.putEmployee(id.Employee, id.Org, id.Team, policy.StatusActive))
			}
		}
	}
	f.apply(emps...)

	// history: every scope each policy name ever had.
	history := map[string][]policy.Scope{}
	exists := map[string]bool{}
	randomScope := func() policy.Scope {
		switch rng.IntN(10) {
		case 0:
			return policy.Scope{}
		case 1, 2, 3:
			return scopeOrg(orgs[rng.IntN(len(orgs))])
		case 4, 5, 6:
			return scopeTeam(orgs[rng.IntN(len(orgs))], teams[rng.IntN(len(teams))])
		default:
			id := ids[rng.IntN(len(ids))]
			if rng.IntN(2) == 0 {
				return id // narrowed to the employee, team included
			}
			return scopeEmp(id.Org, id.Employee)
		}
	}
	// Some written before anyone connects, so inits are not trivial.
	write := func(n int) {
		batch := make([]*command.Command, 0, n)
		pendingDelete := map[string]bool{}
		for range n {
			name := fmt.Sprintf("p%02d", rng.IntN(24))
			if exists[name] && !pendingDelete[name] && rng.IntN(4) == 0 {
				batch = append(batch, f.deletePolicy(name))
				exists[name] = false
				pendingDelete[name] = true
				continue
			}
			if pendingDelete[name] {
				continue // keep a batch free of delete-then-recreate surprises in bookkeeping
			}
			s := randomScope()
			history[name] = append(history[name], s)
			exists[name] = true
			batch = append(batch, f.putPolicy(name, s, fmt.Sprintf("r%d", rng.IntN(1000))))
		}
		if len(batch) > 0 {
			f.apply(batch...)
		}
	}
	write(20)

	type state struct {
		id       policy.Identity
		c        *client
		policies map[string]feedv1.Policy
		digest   string
	}
	var states []*state
	for i, id := range ids {
		if i%3 == 2 {
			continue // some employees have no connection
		}
		c, init := f.connect(t, id, "")
		st := &state{id: id, c: c, policies: map[string]feedv1.Policy{}, digest: init.Digest}
		for _, p := range init.Policies {
			st.policies[p.Name] = p
		}
		states = append(states, st)
	}
	checkNamed := func(st *state, name string) {
		t.Helper()
		for _, s := range history[name] {
			if s.AppliesTo(st.id) {
				return
			}
		}
		t.Fatalf("seed %d: %v received a message about %s, whose scopes %v never applied to it", seed, st.id, name, history[name])
	}
	for _, st := range states {
		for name := range st.policies {
			checkNamed(st, name)
		}
	}

	for range 60 {
		write(1 + rng.IntN(4))
	}
	f.apply(f.putPolicy("zz-marker", policy.Scope{}, "end"))
	history["zz-marker"] = []policy.Scope{{}}

	for _, st := range states {
		for {
			m := st.c.next()
			switch m.Type {
			case feedv1.TypeUpsert:
				checkNamed(st, m.Policy.Name)
				if !wireScope(m.Policy.Scope).AppliesTo(st.id) {
					t.Fatalf("seed %d: %v got upsert of %s with scope %+v", seed, st.id, m.Policy.Name, m.Policy.Scope)
				}
				st.policies[m.Policy.Name] = *m.Policy
			case feedv1.TypeDelete:
				checkNamed(st, m.PolicyName)
				delete(st.policies, m.PolicyName)
			case feedv1.TypeInit:
				st.policies = map[string]feedv1.Policy{}
				for _, p := range m.Policies {
					checkNamed(st, p.Name)
					st.policies[p.Name] = p
				}
			default:
				t.Fatalf("unexpected %s", m.Type)
			}
			st.digest = m.Digest
			if m.Type == feedv1.TypeUpsert && m.Policy.Name == "zz-marker" {
				break
			}
		}
		want, err := f.st.ListPolicies(store.PolicyFilter{Identity: &st.id})
		if err != nil {
			t.Fatal(err)
		}
		wantRev := map[string]uint64{}
		for _, p := range want {
			wantRev[p.Name] = p.Revision
		}
		gotRev := map[string]uint64{}
		for n, p := range st.policies {
			gotRev[n] = p.Revision
		}
		if diff := cmp.Diff(wantRev, gotRev); diff != "" {
			t.Fatalf("seed %d: %v final set (-store +feed):\n%s", seed, st.id, diff)
		}
		if got, want := st.digest, f.wantDigest(st.id); got != want {
			t.Fatalf("seed %d: %v final digest %.8s, want %.8s", seed, st.id, got, want)
		}
	}
}

func TestRevocation(t *testing.T) {
	tests := []struct {
		name       string
		change     func(f *fixture) *command.Command
		reason     string
		reconnect  int
		reconnCode string
	}{
		{"deactivated", func(f *fixture) *command.Command {
			return f.putEmployee("alice", "acme", "red", policy.StatusInactive)
		},
			reasonDeactivated, 403, "forbidden"},
		{"deleted", func(f *fixture) *command.Command { return f.deleteEmployee("alice") },
			reasonDeleted, 401, "unauthorized"},
		// A tenant change: revoked, not re-scoped, and the token naming
		// the old org is refused.
		{"moved to another org", func(f *fixture) *command.Command {
			return f.putEmployee("alice", "other", "red", policy.StatusActive)
		},
			reasonOrgChanged, 403, "forbidden"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			seedData(f)
			a1, _ := f.connect(t, alice, "")
			a2, _ := f.connect(t, alice, "")
			b, _ := f.connect(t, bob, "")

			start := time.Now()
			f.apply(tc.change(f))
			for _, c := range []*client{a1, a2} {
				m := c.nextOf(feedv1.TypeRevoke)
				if m.Reason != tc.reason {
					t.Errorf("revoke reason %q, want %q", m.Reason, tc.reason)
				}
				if code := c.closeCode(time.Second); code != feedv1.CloseRevoked {
					t.Errorf("close code %d, want %d", code, feedv1.CloseRevoked)
				}
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("revocation took %v, want under 1s", d)
			}
			// Bob is untouched.
			f.apply(f.putPolicy("after", policy.Scope{}, "x"))
			if got := b.until("after"); len(got) != 0 {
				t.Errorf("bob got %v", summary(got))
			}
			poll.Eventually(t, "revoked connections to leave the hub", func() error {
				if n := len(f.hub.Clients()); n != 1 {
					return fmt.Errorf("%d connections", n)
				}
				return nil
			}, poll.Within(msgTimeout))

			status, _, body := f.handshake(t, http.MethodGet, "", bearer(f.token("alice", "acme", "red")))
			if status != tc.reconnect || envelopeCode(t, body) != tc.reconnCode {
				t.Errorf("reconnect: %d %s, want %d %s", status, body, tc.reconnect, tc.reconnCode)
			}
		})
	}
}

// TestIdentityChange: an employee moved to another team gets an init for
// the new team, and from then on the new team's changes only.
func TestIdentityChange(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	a, _ := f.connect(t, alice, "")
	f.apply(f.putEmployee("alice", "acme", "blue", policy.StatusActive))
	moved := identity("acme", "blue", "alice")
	init := a.nextOf(feedv1.TypeInit)
	if diff := cmp.Diff(f.wantNames(moved), policyNames(init.Policies)); diff != "" {
		t.Errorf("init after the move (-want +got):\n%s", diff)
	}
	f.apply(f.putPolicy("t-acme-red", scopeTeam("acme", "red"), "changed"), f.putPolicy("t-acme-blue", scopeTeam("acme", "blue"), "changed"))
	f.apply(f.putPolicy("marker", policy.Scope{}, "m"))
	if diff := cmp.Diff([]string{"upsert:t-acme-blue"}, summary(a.until("marker"))); diff != "" {
		t.Errorf("after the move (-want +got):\n%s", diff)
	}
	cl := f.hub.Clients()
	if len(cl) != 1 || cl[0].Team != "blue" {
		t.Errorf("clients %v, want alice in team blue", cl)
	}
}

func TestResumeSince(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	f.apply(f.putPolicy("moves-out", scopeTeam("acme", "red"), "1"), f.putPolicy("gets-deleted", scopeOrg("acme"), "1"),
		f.putPolicy("foreign", scopeOrg("other"), "1"))
	a, init := f.connect(t, alice, "")
	since := init.Version
	if err := a.ws.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatal(err)
	}

	// Missed while away:
	f.apply(f.putPolicy("t-acme-red", scopeTeam("acme", "red"), "changed"))   // upsert
	f.apply(f.putPolicy("moves-out", scopeTeam("acme", "blue"), "moved"))     // delete (scope at since looked up)
	f.apply(f.putPolicy("foreign", scopeOrg("other"), "changed"))             // nothing: never applied
	f.apply(f.putPolicy("foreign-new", scopeOrg("other"), "new"))             // nothing
	f.apply(f.deletePolicy("gets-deleted"))                                   // delete
	f.apply(f.putPolicy("new-for-alice", scopeEmp("acme", "alice"), "new"))   // upsert
	f.apply(f.putPolicy("came-and-went", scopeOrg("acme"), "x"))              // delete (it applied meanwhile)
	f.apply(f.putPolicy("came-and-went", scopeOrg("other"), "y"))             //
	f.apply(f.putPolicy("t-acme-blue", scopeTeam("acme", "blue"), "changed")) // nothing
	f.apply(f.putEmployee("bob", "acme", "blue", policy.StatusActive))        // not a policy

	t.Run("replays only what was missed", func(t *testing.T) {
		digest := f.wantDigest(alice)
		c := f.dial(t, dialOpts{token: f.token("alice", "acme", "red"), query: fmt.Sprintf("since=%d", since)})
		// The replay was written with the current digest.
		poll.Eventually(t, "the replay to be written", func() error {
			for _, cl := range f.hub.Clients() {
				if cl.Employee == "alice" && cl.VersionSent == digest {
					return nil
				}
			}
			return fmt.Errorf("no alice connection at digest %.8s: %v", digest, f.hub.Clients())
		}, poll.Within(msgTimeout))

		f.apply(f.putPolicy("marker-1", policy.Scope{}, "m"))
		got := c.until("marker-1")
		want := []string{"upsert:t-acme-red", "delete:moves-out", "delete:gets-deleted", "upsert:new-for-alice", "delete:came-and-went"}
		if diff := cmp.Diff(want, summary(got)); diff != "" {
			t.Errorf("replay (-want +got):\n%s", diff)
		}
		for i, m := range got {
			if i > 0 && m.Version <= got[i-1].Version {
				t.Errorf("versions out of order: %d after %d", m.Version, got[i-1].Version)
			}
			if m.Digest != digest {
				t.Errorf("%s digest %.8s, want %.8s", m.Type, m.Digest, digest)
			}
		}
	})
	t.Run("nothing missed sends nothing", func(t *testing.T) {
		c := f.dial(t, dialOpts{token: f.token("alice", "acme", "red"), query: fmt.Sprintf("since=%d", f.st.AppliedIndex())})
		f.apply(f.putPolicy("marker-2", policy.Scope{}, "m"))
		if got := c.until("marker-2"); len(got) != 0 {
			t.Errorf("got %v, want nothing before the marker", summary(got))
		}
	})
	t.Run("ahead of this node and it does not catch up: refused, not sent back in time", func(t *testing.T) {
		ahead := f.st.AppliedIndex() + 100
		f.setReadIndex(t, func() (uint64, error) { return ahead, nil })
		status, _, body := f.handshake(t, http.MethodGet, fmt.Sprintf("since=%d", ahead), bearer(f.token("alice", "acme", "red")))
		if status != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"unavailable"`) || !strings.Contains(string(body), "behind") {
			t.Errorf("status %d body %s, want 503 unavailable naming the node behind", status, body)
		}
	})
	t.Run("ahead of this node and no leader to ask: refused", func(t *testing.T) {
		f.setReadIndex(t, func() (uint64, error) { return 0, errors.New("no leader is reachable") })
		status, _, body := f.handshake(t, http.MethodGet, fmt.Sprintf("since=%d", f.st.AppliedIndex()+1), bearer(f.token("alice", "acme", "red")))
		if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "no leader") {
			t.Errorf("status %d body %s, want 503 unavailable with the read's error", status, body)
		}
	})
	t.Run("ahead of the whole cluster (restored from an older backup): init", func(t *testing.T) {
		c := f.dial(t, dialOpts{token: f.token("alice", "acme", "red"), query: fmt.Sprintf("since=%d", f.st.AppliedIndex()+100)})
		init := c.nextOf(feedv1.TypeInit)
		if diff := cmp.Diff(f.wantNames(alice), policyNames(init.Policies)); diff != "" {
			t.Errorf("init (-want +got):\n%s", diff)
		}
	})
	t.Run("ahead of this node and it catches up: resumes", func(t *testing.T) {
		// The client holds since (the first write below); the cluster
		// has committed both.
		since := f.st.AppliedIndex() + 1
		asked := make(chan struct{}, 1) // the handshake's consistent read has started
		f.setReadIndex(t, func() (uint64, error) {
			select {
			case asked <- struct{}{}:
			default:
			}
			return since + 1, nil
		})
		type dialed struct {
			c   *client
			err error
		}
		done := make(chan dialed, 1)
		go func() {
			c, _, err := f.tryDial(t, dialOpts{token: f.token("alice", "acme", "red"), query: fmt.Sprintf("since=%d", since)}) //nolint:bodyclose // websocket.Dial owns the response body
			done <- dialed{c, err}
		}()
		select {
		case <-asked:
		case d := <-done:
			t.Fatalf("the handshake ended (%v) without waiting for the node", d.err)
		case <-time.After(msgTimeout):
			t.Fatal("the handshake never asked for a consistent read")
		}
		f.apply(f.putPolicy("caught-up", scopeOrg("acme"), "1"), f.putPolicy("after-since", scopeOrg("acme"), "1"))
		d := <-done
		if d.err != nil {
			t.Fatalf("dial: %v", d.err)
		}
		f.apply(f.putPolicy("marker-ahead", policy.Scope{}, "m"))
		if diff := cmp.Diff([]string{"upsert:after-since"}, summary(d.c.until("marker-ahead"))); diff != "" {
			t.Errorf("after catching up (-want +got):\n%s", diff)
		}
	})
	t.Run("moved while away sends init", func(t *testing.T) {
		since := f.st.AppliedIndex()
		f.apply(f.putEmployee("alice", "acme", "blue", policy.StatusActive))
		c := f.dial(t, dialOpts{token: f.token("alice", "acme", ""), query: fmt.Sprintf("since=%d", since)})
		init := c.nextOf(feedv1.TypeInit)
		if diff := cmp.Diff(f.wantNames(identity("acme", "blue", "alice")), policyNames(init.Policies)); diff != "" {
			t.Errorf("init (-want +got):\n%s", diff)
		}
	})
	t.Run("far behind sends init without reading the event log", func(t *testing.T) {
		// More log entries than a replay may scan, none of them policy
		// events: a replay would find nothing to send, but reading the
		// range is what stalled a node in a reconnect storm.
		since := f.st.AppliedIndex()
		var cmds []*command.Command
		for i := range maxReplayEvents + 1 {
			cmds = append(cmds, f.putEmployee(fmt.Sprintf("filler-%d", i), "other", "", policy.StatusActive))
		}
		f.apply(cmds...)
		c := f.dial(t, dialOpts{token: f.token("alice", "acme", ""), query: fmt.Sprintf("since=%d", since)})
		c.nextOf(feedv1.TypeInit)
	})
	t.Run("pruned sends init", func(t *testing.T) {
		f.apply(must(t)(command.PruneEvents(time.Now().Add(time.Hour))))
		c := f.dial(t, dialOpts{token: f.token("alice", "acme", ""), query: fmt.Sprintf("since=%d", since)})
		init := c.nextOf(feedv1.TypeInit)
		if diff := cmp.Diff(f.wantNames(identity("acme", "blue", "alice")), policyNames(init.Policies)); diff != "" {
			t.Errorf("init (-want +got):\n%s", diff)
		}
	})
}

func TestPingPong(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) { testPingPong(t, mode.noPoll) })
	}
}

func testPingPong(t *testing.T, noPoll bool) {
	f := newFixture(t, fixtureOpts{noPoll: noPoll, feed: func(c *config.Feed) { c.PingInterval = 50 * time.Millisecond }})
	seedData(f)
	live := f.dial(t, dialOpts{token: f.token("bob", "acme", "blue")})
	start := time.Now()
	silent := f.dial(t, dialOpts{token: f.token("alice", "acme", "red"), noPong: true})
	if code := silent.closeCode(2 * time.Second); code != feedv1.ClosePongTimeout {
		t.Fatalf("close code %d, want %d", code, feedv1.ClosePongTimeout)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("closed after %v, before two ping intervals", d)
	}
	// The answering connection outlives many intervals.
	pings := 0
	for pings < 8 {
		select {
		case m := <-live.msgs:
			if m.Type == feedv1.TypePing {
				pings++
			}
		case <-live.done:
			t.Fatalf("answering connection closed: %v", live.err)
		case <-time.After(msgTimeout):
			t.Fatal("no ping")
		}
	}
	cl := f.hub.Clients()
	if len(cl) != 1 || cl[0].Employee != "bob" || cl[0].LastActiveUnixNano <= cl[0].ConnectedAtUnixNano {
		t.Fatalf("clients %v: want bob with a pong recorded", cl)
	}
}

// TestSlowConsumerDropped: a client that stops reading is closed with 4429
// once its queue is full, while another connection keeps receiving every
// update promptly.
func TestSlowConsumerDropped(t *testing.T) {
	f := newFixture(t, fixtureOpts{sendBuffer: 32 << 10, feed: func(c *config.Feed) {
		c.SendBuffer = 4
		c.WriteTimeout = 10 * time.Second
	}})
	seedData(f)
	// Small socket buffers on both sides, so that the server's writes
	// block after some hundred KiB rather than megabytes.
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) })
		return errors.Join(err, serr)
	}}
	small := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	t.Cleanup(small.CloseIdleConnections)
	slow, _, err := dialFeed(t, small, f.wsURL(""), dialOpts{token: f.token("alice", "acme", "red"), noRead: true}) //nolint:bodyclose // websocket.Dial owns the response body
	if err != nil {
		t.Fatal(err)
	}
	fast, _ := f.connect(t, bob, "")
	poll.Eventually(t, "both connected", func() error {
		if n := len(f.hub.Clients()); n != 2 {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	}, poll.Within(msgTimeout))

	big := strings.Repeat("x", 64<<10)
	dropped := false
	writes := 0
	for i := 0; i < 200 && !dropped; i++ {
		writes++
		name := fmt.Sprintf("big-%03d", i)
		start := time.Now()
		f.apply(f.putPolicy(name, scopeOrg("acme"), big))
		m := fast.nextOf(feedv1.TypeUpsert)
		if m.Policy.Name != name {
			t.Fatalf("fast client got %s, want %s", m.Policy.Name, name)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("fast client waited %v for %s", d, name)
		}
		dropped = !slices.ContainsFunc(f.hub.Clients(), func(c *clusterv1.ClientInfo) bool { return c.Employee == "alice" })
	}
	if !dropped {
		t.Fatal("the slow client was never dropped")
	}
	t.Logf("dropped after %d updates", writes)
	// It reads again: what was in flight, then the close.
	if code := slow.closeCode(msgTimeout); code != feedv1.CloseSlowConsumer {
		t.Fatalf("close code %d (%v), want %d", code, slow.err, feedv1.CloseSlowConsumer)
	}
}

func TestBadClientInput(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) { testBadClientInput(t, mode.noPoll) })
	}
}

func testBadClientInput(t *testing.T, noPoll bool) {
	tests := []struct {
		name string
		typ  websocket.MessageType
		data []byte
		want websocket.StatusCode
	}{
		{"invalid JSON", websocket.MessageText, []byte(`{"type":`), feedv1.CloseInvalidMessage},
		{"not an object", websocket.MessageText, []byte(`["pong"]`), feedv1.CloseInvalidMessage},
		{"unknown type", websocket.MessageText, []byte(`{"type":"subscribe","org":"other"}`), feedv1.CloseInvalidMessage},
		{"server message type", websocket.MessageText, []byte(`{"type":"upsert"}`), feedv1.CloseInvalidMessage},
		{"long unknown type", websocket.MessageText, []byte(`{"type":"` + strings.Repeat("é", 200) + `"}`), feedv1.CloseInvalidMessage},
		{"binary frame", websocket.MessageBinary, []byte(`{"type":"pong"}`), websocket.StatusUnsupportedData},
		{"oversized frame", websocket.MessageText, []byte(`{"type":"pong","x":"` + strings.Repeat("a", 8192) + `"}`), websocket.StatusMessageTooBig},
		// encoding/json would read both as a pong with U+FFFD in x.
		{"invalid UTF-8 in a pong", websocket.MessageText, []byte("{\"type\":\"pong\",\"x\":\"\xff\"}"), feedv1.CloseInvalidMessage},
		{"lone surrogate in a pong", websocket.MessageText, []byte(`{"type":"pong","x":["\ud800"]}`), feedv1.CloseInvalidMessage},
		{"invalid UTF-8 outside a string", websocket.MessageText, []byte("{\"type\":\"pong\"}\xff"), feedv1.CloseInvalidMessage},
	}
	f := newFixture(t, fixtureOpts{noPoll: noPoll})
	seedData(f)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := f.connect(t, alice, "")
			ctx, cancel := context.WithTimeout(context.Background(), msgTimeout)
			defer cancel()
			if err := c.ws.Write(ctx, tc.typ, tc.data); err != nil {
				t.Fatal(err)
			}
			if code := c.closeCode(msgTimeout); code != tc.want {
				t.Fatalf("close code %d (%v), want %d", code, c.err, tc.want)
			}
		})
	}
	t.Run("pong keeps the connection", func(t *testing.T) {
		c, _ := f.connect(t, alice, "")
		ctx, cancel := context.WithTimeout(context.Background(), msgTimeout)
		defer cancel()
		if err := c.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"pong","extra":1}`)); err != nil {
			t.Fatal(err)
		}
		f.apply(f.putPolicy("still-here", policy.Scope{}, "x"))
		if m := c.nextOf(feedv1.TypeUpsert); m.Policy.Name != "still-here" {
			t.Fatalf("got %+v", m)
		}
	})
}

// TestBadTokenBurst: a thousand refused handshakes cost nothing lasting.
func TestBadTokenBurst(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	warm := f.dial(t, dialOpts{token: f.token("alice", "acme", "red")})
	warm.nextOf(feedv1.TypeInit)
	f.hc.CloseIdleConnections()
	before := runtime.NumGoroutine()

	bad := signToken(t, []byte(strings.Repeat("z", 48)), "alice", "acme", "red")
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for w := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				tok := bad
				if (w+i)%3 == 0 {
					tok = "garbage." + fmt.Sprint(i)
				}
				status := rawHandshake(f, "Bearer "+tok)
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if diff := cmp.Diff(map[int]int{401: 1000}, statuses); diff != "" {
		t.Fatalf("statuses (-want +got):\n%s", diff)
	}
	f.hc.CloseIdleConnections()
	poll.Eventually(t, "goroutines back to the baseline", func() error {
		if n := runtime.NumGoroutine(); n > before+2 {
			return fmt.Errorf("%d goroutines, %d before", n, before)
		}
		return nil
	}, poll.Within(5*time.Second))

	// The hub still works.
	f.apply(f.putPolicy("after-burst", policy.Scope{}, "x"))
	if m := warm.nextOf(feedv1.TypeUpsert); m.Policy.Name != "after-burst" {
		t.Fatalf("got %+v", m)
	}
}

// rawHandshake is a handshake for load: the status only, or 0 on a
// transport error.
func rawHandshake(f *fixture, authz string) int {
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+feedv1.Path, nil)
	if err != nil {
		return 0
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Authorization", authz)
	resp, err := f.hc.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestSlowLorisHandshake: a peer that sends half a handshake and stalls
// does not hold anyone else up.
func TestSlowLorisHandshake(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	raw, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	w := bufio.NewWriter(raw)
	_, _ = w.WriteString("GET " + feedv1.Path + " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c, _ := f.connect(t, alice, "")
	f.apply(f.putPolicy("during-loris", policy.Scope{}, "x"))
	if m := c.nextOf(feedv1.TypeUpsert); m.Policy.Name != "during-loris" {
		t.Fatalf("got %+v", m)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v with a stalled handshake open", d)
	}
}

// TestCloseAll: shutdown closes every connection with 1001 and refuses new
// ones with 503.
func TestCloseAll(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	a, _ := f.connect(t, alice, "")
	b, _ := f.connect(t, bob, "")
	stalled := f.dial(t, dialOpts{token: f.token("carol", "other", "red"), noRead: true})
	done := make(chan struct{})
	go func() { f.hub.CloseAll(); close(done) }()
	for _, c := range []*client{a, b} {
		if code := c.closeCode(msgTimeout); code != websocket.StatusGoingAway {
			t.Errorf("close code %d, want 1001", code)
		}
	}
	select {
	case <-done:
	case <-time.After(shutdownGrace + 2*time.Second):
		t.Fatal("CloseAll did not return although a client stalls")
	}
	_ = stalled
	status, hdr, body := f.handshake(t, http.MethodGet, "", bearer(f.token("alice", "acme", "red")))
	if status != 503 || envelopeCode(t, body) != "unavailable" || hdr.Get("Retry-After") == "" {
		t.Fatalf("after CloseAll: %d %s", status, body)
	}
	if n := len(f.hub.Clients()); n != 0 {
		t.Fatalf("%d clients after CloseAll", n)
	}
}

func TestClientsAndMetrics(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	a, _ := f.connect(t, alice, "")
	f.connect(t, bob, "")
	f.connect(t, carol, "")
	poll.Eventually(t, "connection gauges", func() error {
		if got := servertest.Metric(t, f.reg, "policy_ws_connections_total"); got != 3 {
			return fmt.Errorf("policy_ws_connections_total %v, want 3", got)
		}
		if got := servertest.Metric(t, f.reg, "policy_ws_connections_by_org", "org", "acme"); got != 2 {
			return fmt.Errorf("policy_ws_connections_by_org{org=acme} %v, want 2", got)
		}
		return nil
	}, poll.Within(msgTimeout))

	sentBefore := servertest.Metric(t, f.reg, "policy_broadcast_count")
	latencyBefore := servertest.Metric(t, f.reg, "policy_broadcast_latency_ms")
	f.apply(f.putPolicy("counted", scopeOrg("acme"), "x"))
	m := a.nextOf(feedv1.TypeUpsert)
	poll.Eventually(t, "both acme messages counted", func() error {
		if got := servertest.Metric(t, f.reg, "policy_broadcast_count") - sentBefore; got != 2 {
			return fmt.Errorf("policy_broadcast_count grew by %v, want 2", got)
		}
		if got := servertest.Metric(t, f.reg, "policy_broadcast_latency_ms") - latencyBefore; got != 2 {
			return fmt.Errorf("policy_broadcast_latency_ms observed %v more, want 2", got)
		}
		return nil
	}, poll.Within(msgTimeout))

	var cl *clusterv1.ClientInfo
	for _, c := range f.hub.Clients() {
		if c.Employee == "alice" {
			cl = c
		}
	}
	if cl == nil {
		t.Fatal("alice not listed")
	}
	if cl.NodeId != "test-node" || cl.Transport != "ws" || cl.Org != "acme" || cl.Team != "red" ||
		cl.VersionSent != m.Digest || cl.State != "acked" || cl.PeerAddr == "" || cl.ClientAddress == "" ||
		cl.ConnectedAtUnixNano == 0 || cl.LastActiveUnixNano == 0 {
		t.Errorf("client info %v", cl)
	}
}

// TestResync: a resync sends every connection a fresh init.
func TestResync(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	a, _ := f.connect(t, alice, "")
	c, _ := f.connect(t, carol, "")
	f.hub.OnChange(store.Change{Index: f.st.AppliedIndex(), Resync: true, At: time.Now()})
	for _, cl := range []*client{a, c} {
		cl.nextOf(feedv1.TypeInit)
	}
}

// mirror is what a client holds: the policies (name → revision) and the
// version of the last message it processed.
type mirror struct {
	id       policy.Identity
	policies map[string]uint64
	last     uint64
	synced   bool
}

func (m *mirror) apply(t *testing.T, msg feedv1.Message) {
	t.Helper()
	switch msg.Type {
	case feedv1.TypeInit:
		m.policies = map[string]uint64{}
		for _, p := range msg.Policies {
			m.policies[p.Name] = p.Revision
		}
		m.synced = true
	case feedv1.TypeUpsert:
		m.policies[msg.Policy.Name] = msg.Policy.Revision
	case feedv1.TypeDelete:
		delete(m.policies, msg.PolicyName)
	default:
		t.Fatalf("unexpected %s", msg.Type)
	}
	if msg.Version < m.last && msg.Type != feedv1.TypeInit {
		t.Fatalf("%v: version %d after %d", m.id, msg.Version, m.last)
	}
	m.last = msg.Version
}

// TestResumeAnywhere connects clients while writes race with their
// handshakes, cuts them off after a random number of messages (the rest is
// lost, as when a connection dies), and resumes each from the version of
// the last message it processed. Whatever the cut, every client ends with
// exactly the set the store says applies.
func TestResumeAnywhere(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	mirrors := []*mirror{{id: alice}, {id: bob}, {id: carol}}
	scopes := []policy.Scope{{}, scopeOrg("acme"), scopeOrg("other"), scopeTeam("acme", "red"), scopeTeam("acme", "blue"),
		scopeTeam("other", "red"), scopeEmp("acme", "alice"), scopeEmp("acme", "bob")}
	writeBatch := func() {
		n := 1 + rng.IntN(4)
		var cmds []*command.Command
		for range n {
			// Few names, so batches often change one policy twice.
			name := fmt.Sprintf("r%d", rng.IntN(6))
			if rng.IntN(5) == 0 {
				if _, err := f.st.GetPolicy(name); err == nil {
					f.apply(f.deletePolicy(name)) // its own batch: it must exist
					continue
				}
			}
			cmds = append(cmds, f.putPolicy(name, scopes[rng.IntN(len(scopes))], fmt.Sprint(rng.IntN(100))))
		}
		if len(cmds) > 0 {
			f.apply(cmds...)
		}
	}
	connect := func(m *mirror) *client {
		q := ""
		if m.synced {
			q = fmt.Sprintf("since=%d", m.last)
		}
		return f.dial(t, dialOpts{token: f.token(m.id.Employee, m.id.Org, m.id.Team), query: q})
	}
	for round := range 30 {
		m := mirrors[rng.IntN(len(mirrors))]
		c := connect(m)
		for range rng.IntN(3) {
			writeBatch() // races with the handshake's init or replay
		}
		marker := fmt.Sprintf("m%03d", round)
		f.apply(f.putPolicy(marker, policy.Scope{}, "marker"))
		// Process k messages, then the connection "dies".
		k := rng.IntN(8)
		for i := 0; i < k; i++ {
			m.apply(t, c.next())
			if _, ok := m.policies[marker]; ok {
				break // an upsert, or in an init or a replay
			}
		}
		_ = c.ws.CloseNow()
		// Old markers pile up in every set; drop them so the store stays small.
		f.apply(f.deletePolicy(marker))
	}
	for _, m := range mirrors {
		c := connect(m)
		f.apply(f.putPolicy("final", policy.Scope{}, "end"))
		for {
			m.apply(t, c.next())
			if _, ok := m.policies["final"]; ok {
				break
			}
		}
		want := map[string]uint64{}
		list, err := f.st.ListPolicies(store.PolicyFilter{Identity: &m.id})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list {
			want[p.Name] = p.Revision
		}
		if diff := cmp.Diff(want, m.policies); diff != "" {
			t.Fatalf("seed %d: %v holds (-store +client):\n%s", seed, m.id, diff)
		}
		_ = c.ws.CloseNow()
		f.apply(f.deletePolicy("final"))
	}
}
