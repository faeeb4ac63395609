package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/adminclient"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
)

// TestTenantIsolationProperty is a randomized property test of scoped
// delivery on a real 3-node cluster in JWT mode: many orgs, teams and
// employees, each with a discovery stream and a WebSocket feed connection on
// random nodes, while concurrent writers create, move (change the scope of)
// and delete policies and move employees between teams.
//
// Property: no message on any connection carries a policy outside the
// applicable set of that connection's identity at that point: its org is the
// employee's or none (always), its team one the employee was in while the
// message was made, its employee the connection's own. Every message is
// checked; at the end every connection holds exactly its applicable set.
//
// "While the message was made" is bounded by what the message proves it
// includes (the feed's Raft index, or a snapshot's highest revision) and by
// when it arrived: any team the employee was moved to by a write that began
// before the message arrived is allowed, so the check is exact about orgs and
// employees and tolerates only the in-flight moves for teams. The policy's
// scope is checked as delivered, and the delivered (name, revision, scope)
// against the event log, so a server that relabels a scope is caught too.
//
// Set POLICYD_ISOLATION_SEED to replay a seed (the writes' content and
// order per writer, not their interleaving).
func TestTenantIsolationProperty(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("POLICYD_ISOLATION_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("POLICYD_ISOLATION_SEED: %v", err)
		}
	}
	t.Logf("seed %d (replay with POLICYD_ISOLATION_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))

	const (
		orgs, teamsPerOrg, employeesPerOrg = 3, 2, 3
		policies, writers, opsPerWriter    = 12, 3, 30
	)
	c := newCluster(t, 3, jwtMode(t))
	base := apiFor(t, c.leader())

	world := &isoWorld{moves: map[string][]isoMove{}}
	for o := range orgs {
		for e := range employeesPerOrg {
			emp := policy.Employee{ID: fmt.Sprintf("o%d-e%d", o, e), Org: fmt.Sprintf("o%d", o), Team: fmt.Sprintf("t%d", rng.IntN(teamsPerOrg)), Status: policy.StatusActive}
			body, _ := json.Marshal(emp)
			base.put("/v1/employees/"+emp.ID, body)
			world.employees = append(world.employees, emp)
		}
	}
	c.waitConverged()

	ctx, cancel := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	var conns []*isoConn
	for _, emp := range world.employees {
		token := signJWT(t, emp.ID, emp.Org, "", time.Hour) // no team claim: the record's team counts
		for _, transport := range []string{"grpc", "ws"} {
			n := c.nodes[rng.IntN(len(c.nodes))]
			ic := &isoConn{world: world, emp: emp, transport: transport, node: n, token: token, held: map[string]uint64{}}
			conns = append(conns, ic)
			readers.Add(1)
			go func() {
				defer readers.Done()
				ic.run(ctx)
			}()
		}
	}
	t.Cleanup(func() {
		cancel()
		readers.Wait()
	})
	// Every connection holds its first set before the writes start.
	poll.Eventually(t, "every connection's first set", func() error {
		for _, ic := range conns {
			if ic.messages() == 0 {
				return fmt.Errorf("%s has no message yet (last error: %w)", ic, ic.lastErr())
			}
		}
		return nil
	}, poll.Within(30*time.Second))

	// Each writer owns its employees, so their moves are sequential and a
	// move's answer is the move itself.
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wrng := rand.New(rand.NewPCG(uint64(seed), uint64(w+1)))
		var mine []policy.Employee
		for i, e := range world.employees {
			if i%writers == w {
				mine = append(mine, e)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- world.write(c, wrng, mine, orgs, teamsPerOrg, policies, opsPerWriter)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged()

	// The event log is the reference: what each revision of each policy and
	// employee was.
	log := isoReadLog(t, apiFor(t, c.leader()))

	// Converged: every connection holds exactly its final applicable set.
	final := log.policiesAt(^uint64(0))
	poll.Eventually(t, "every connection to hold its applicable set", func() error {
		for _, ic := range conns {
			id := log.identityAt(ic.emp, ^uint64(0))
			want := map[string]uint64{}
			for name, p := range final {
				if p.Scope.AppliesTo(id) {
					want[name] = p.Revision
				}
			}
			if got := ic.heldSet(); !mapsEqual(got, want) {
				return fmt.Errorf("%s (now %s) holds %v, want %v (last error: %w)", ic, id, got, want, ic.lastErr())
			}
		}
		return nil
	}, poll.Within(30*time.Second))

	cancel()
	readers.Wait()

	// Every message, checked against the log.
	var violations, checked, total int
	for _, ic := range conns {
		for _, m := range ic.log {
			total++
			for _, p := range m.policies {
				checked++
				if err := log.check(ic, m, p); err != nil {
					violations++
					if violations <= 20 {
						t.Errorf("%s message %d (%s, %d policies, connection %d): %v", ic, m.seq, m.kind, len(m.policies), m.conn, err)
					}
				}
			}
		}
		if ic.revoked {
			t.Errorf("%s was revoked, but its employee stayed active (ends: %q)", ic, ic.ends)
		}
		if len(ic.ends) > 0 {
			t.Logf("%s: connections ended: %q", ic, ic.ends)
		}
	}
	moves := 0
	for _, ms := range world.moves {
		moves += len(ms)
	}
	t.Logf("%d connections, %d messages, %d delivered policies checked, %d violations; %d policy writes, %d employee moves, %d reconnects",
		len(conns), total, checked, violations, world.policyWrites, moves, countReconnects(conns))
	if checked == 0 {
		t.Fatal("no policy was delivered: the test checked nothing")
	}
}

// isoWorld is what the writers did.
type isoWorld struct {
	employees    []policy.Employee
	mu           sync.Mutex
	moves        map[string][]isoMove // employee → moves in order
	policyWrites int
}

// isoMove is one employee write: the team it set, its revision and when it
// was sent.
type isoMove struct {
	team string
	rev  uint64
	call time.Time
}

// write runs one writer: policy puts with random scopes (moves between
// scopes when the name exists), deletes, and moves of its own employees.
func (w *isoWorld) write(c *cluster, rng *rand.Rand, mine []policy.Employee, orgs, teams, policies, ops int) error {
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	// One single-server client per node: each write goes to a node
	// chosen at random, never failed over.
	clients := make([]*adminclient.Client, len(c.nodes))
	for i, n := range c.nodes {
		var err error
		if clients[i], err = adminclient.New(adminclient.Config{Servers: []string{"http://" + n.HTTPAddr()}, HTTPClient: hc}); err != nil {
			return err
		}
	}
	do := func(method, path string, body []byte, out any) error {
		return clients[rng.IntN(len(clients))].Do(context.Background(), method, path, nil, body, out)
	}
	team := map[string]string{}
	for _, e := range mine {
		team[e.ID] = e.Team
	}
	for i := range ops {
		name := fmt.Sprintf("p%d", rng.IntN(policies))
		switch p := rng.Float64(); {
		case p < 0.15 && len(mine) > 0:
			e := mine[rng.IntN(len(mine))]
			next := fmt.Sprintf("t%d", (teamIndex(team[e.ID])+1+rng.IntN(teams-1))%teams)
			body, _ := json.Marshal(policy.Employee{ID: e.ID, Org: e.Org, Team: next, Status: policy.StatusActive})
			call := time.Now()
			var got policy.Employee
			if err := do(http.MethodPut, "/v1/employees/"+e.ID, body, &got); err != nil {
				return fmt.Errorf("op %d: move %s: %w", i, e.ID, err)
			}
			if got.Team != next {
				return fmt.Errorf("op %d: move %s: answer %+v", i, e.ID, got)
			}
			team[e.ID] = next
			w.mu.Lock()
			w.moves[e.ID] = append(w.moves[e.ID], isoMove{team: next, rev: got.Revision, call: call})
			w.mu.Unlock()
		case p < 0.3:
			if err := do(http.MethodDelete, "/v1/policies/"+name, nil, nil); err != nil && !errors.Is(err, adminclient.ErrNotFound) {
				return fmt.Errorf("op %d: delete %s: %w", i, name, err)
			}
		default:
			scope := policy.Scope{}
			switch s := rng.Float64(); {
			case s < 0.1:
			case s < 0.5:
				scope.Org = fmt.Sprintf("o%d", rng.IntN(orgs))
			case s < 0.8:
				scope.Org, scope.Team = fmt.Sprintf("o%d", rng.IntN(orgs)), fmt.Sprintf("t%d", rng.IntN(teams))
			default:
				e := w.employees[rng.IntN(len(w.employees))]
				scope.Org, scope.Employee = e.Org, e.ID
			}
			// 404: committed, then deleted by another writer before the
			// handler read it back for its answer.
			if err := do(http.MethodPut, "/v1/policies/"+name, scopedPolicy(name, scope, "isolation"), nil); err != nil && !errors.Is(err, adminclient.ErrNotFound) {
				return fmt.Errorf("op %d: put %s: %w", i, name, err)
			}
			w.mu.Lock()
			w.policyWrites++
			w.mu.Unlock()
		}
	}
	return nil
}

func teamIndex(team string) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(team, "t"))
	return i
}

// isoPolicy is one delivered policy.
type isoPolicy struct {
	Name     string
	Revision uint64
	Scope    policy.Scope
}

// isoMsg is one received message that carries policies.
type isoMsg struct {
	seq      int
	kind     string
	at       time.Time
	conn     int    // which connection of the isoConn (reconnects count up)
	lower    uint64 // the Raft index the message is at least as new as
	policies []isoPolicy
}

// isoConn is one sidecar connection (reconnecting if the server ends it).
type isoConn struct {
	world     *isoWorld
	emp       policy.Employee
	transport string
	node      *Node
	token     string

	mu         sync.Mutex
	log        []isoMsg
	held       map[string]uint64
	err        error
	revoked    bool
	reconnects int
	ends       []string // why each connection ended
}

func (ic *isoConn) String() string {
	return fmt.Sprintf("%s %s on %s", ic.transport, ic.emp.ID, ic.node.ID())
}

func (ic *isoConn) messages() int {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return len(ic.log)
}

func (ic *isoConn) lastErr() error {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.err
}

func (ic *isoConn) heldSet() map[string]uint64 {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	out := make(map[string]uint64, len(ic.held))
	for k, v := range ic.held {
		out[k] = v
	}
	return out
}

// record logs a message and updates the held set: replace for a whole set,
// else upsert or delete.
func (ic *isoConn) record(kind string, lower uint64, ps []isoPolicy, whole bool, deleted string) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if whole {
		clear(ic.held)
	}
	for _, p := range ps {
		ic.held[p.Name] = p.Revision
	}
	if deleted != "" {
		delete(ic.held, deleted)
	}
	ic.log = append(ic.log, isoMsg{seq: len(ic.log), conn: ic.reconnects, kind: kind, at: time.Now(), lower: lower, policies: ps})
}

// run keeps the connection open until ctx ends, reconnecting (bounded) if
// the server ends it.
func (ic *isoConn) run(ctx context.Context) {
	for attempt := 0; ctx.Err() == nil && attempt < 50; attempt++ {
		var err error
		if ic.transport == "grpc" {
			err = ic.runGRPC(ctx)
		} else {
			err = ic.runWS(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		ic.mu.Lock()
		ic.err = err
		ic.ends = append(ic.ends, err.Error())
		ic.reconnects++
		ic.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond): // reconnect backoff
		}
	}
}

func (ic *isoConn) runGRPC(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cc, err := grpc.NewClient(ic.node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return err
	}
	defer cc.Close()
	s, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).StreamPolicies(bearer(ctx, ic.token))
	if err != nil {
		return err
	}
	addr := "iso-" + ic.emp.ID
	if err := s.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: addr}); err != nil {
		return err
	}
	for {
		r, err := s.Recv()
		if err != nil {
			if st, ok := status.FromError(err); ok && st.Code() == codes.PermissionDenied {
				ic.mu.Lock()
				ic.revoked = true
				ic.mu.Unlock()
			}
			return err
		}
		if !r.GetUnchanged() {
			var ps []isoPolicy
			var lower uint64
			for _, p := range r.GetPolicies() {
				sc := p.GetScope()
				ps = append(ps, isoPolicy{Name: p.GetName(), Revision: p.GetRevision(),
					Scope: policy.Scope{Org: sc.GetOrg(), Team: sc.GetTeam(), Employee: sc.GetEmployee()}})
				lower = max(lower, p.GetRevision())
			}
			ic.record("snapshot", lower, ps, true, "")
		}
		if err := s.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: addr, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
			return err
		}
	}
}

func (ic *isoConn) runWS(ctx context.Context) error {
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	ws, resp, err := websocket.Dial(dctx, "ws://"+ic.node.HTTPAddr()+feedv1.Path, &websocket.DialOptions{ //nolint:bodyclose // Dial owns the response body
		HTTPClient: hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + ic.token}},
	})
	dcancel()
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusForbidden {
			ic.mu.Lock()
			ic.revoked = true
			ic.mu.Unlock()
		}
		return fmt.Errorf("dial: %w", err)
	}
	defer func() { _ = ws.CloseNow() }()
	ws.SetReadLimit(64 << 20)
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			return err
		}
		var m feedv1.Message
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("undecodable message %q: %w", data, err)
		}
		conv := func(p feedv1.Policy) isoPolicy {
			return isoPolicy{Name: p.Name, Revision: p.Revision, Scope: policy.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee}}
		}
		switch m.Type {
		case feedv1.TypePing:
			wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
			_ = ws.Write(wctx, websocket.MessageText, []byte(`{"type":"pong"}`))
			wcancel()
		case feedv1.TypeInit:
			var ps []isoPolicy
			for _, p := range m.Policies {
				ps = append(ps, conv(p))
			}
			ic.record("init", m.Version, ps, true, "")
		case feedv1.TypeUpsert:
			if m.Policy == nil {
				return errors.New("upsert without a policy")
			}
			ic.record("upsert", m.Version, []isoPolicy{conv(*m.Policy)}, false, "")
		case feedv1.TypeDelete:
			ic.record("delete", m.Version, nil, false, m.PolicyName)
		case feedv1.TypeRevoke:
			ic.mu.Lock()
			ic.revoked = true
			ic.mu.Unlock()
			return fmt.Errorf("revoked: %s", m.Reason)
		}
	}
}

func countReconnects(conns []*isoConn) int {
	n := 0
	for _, ic := range conns {
		ic.mu.Lock()
		n += ic.reconnects
		ic.mu.Unlock()
	}
	return n
}

// isoLog is the event log: every policy and employee revision.
type isoLog struct {
	policies  []isoLogPolicy          // in index order
	byRev     map[uint64]isoLogPolicy // policy writes by revision
	employees map[string][]isoLogEmp  // employee → writes in index order
}

type isoLogPolicy struct {
	isoPolicy
	deleted bool
}

type isoLogEmp struct {
	rev  uint64
	team string
}

func isoReadLog(t *testing.T, a *api) *isoLog {
	t.Helper()
	l := &isoLog{byRev: map[uint64]isoLogPolicy{}, employees: map[string][]isoLogEmp{}}
	after := uint64(0)
	for range 10000 {
		r := a.do(http.MethodGet, fmt.Sprintf("/v1/events?after=%d&limit=1000&consistent=true", after), nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET /v1/events: %d %s", r.status, r.body)
		}
		var page struct {
			Events []struct {
				ID         uint64          `json:"id"`
				EntityType string          `json:"entity_type"`
				Action     string          `json:"action"`
				EntityID   string          `json:"entity_id"`
				Data       json.RawMessage `json:"data"`
			} `json:"events"`
			LastID uint64 `json:"last_id"`
		}
		r.decode(t, &page)
		for _, ev := range page.Events {
			switch ev.EntityType {
			case "policy":
				var p policy.Policy
				if err := json.Unmarshal(ev.Data, &p); err != nil {
					t.Fatalf("event %d: %v", ev.ID, err)
				}
				lp := isoLogPolicy{isoPolicy: isoPolicy{Name: ev.EntityID, Revision: ev.ID, Scope: p.Scope}, deleted: ev.Action == "DELETE"}
				l.policies = append(l.policies, lp)
				if !lp.deleted {
					l.byRev[ev.ID] = lp
				}
			case "employee":
				var e policy.Employee
				if err := json.Unmarshal(ev.Data, &e); err != nil {
					t.Fatalf("event %d: %v", ev.ID, err)
				}
				l.employees[ev.EntityID] = append(l.employees[ev.EntityID], isoLogEmp{rev: ev.ID, team: e.Team})
			}
		}
		if page.LastID == after {
			return l
		}
		after = page.LastID
	}
	t.Fatal("event log did not end")
	return nil
}

// policiesAt is every policy as of index idx.
func (l *isoLog) policiesAt(idx uint64) map[string]isoPolicy {
	out := map[string]isoPolicy{}
	for _, p := range l.policies {
		if p.Revision > idx {
			break
		}
		if p.deleted {
			delete(out, p.Name)
		} else {
			out[p.Name] = p.isoPolicy
		}
	}
	return out
}

// identityAt is the employee's identity as of index idx.
func (l *isoLog) identityAt(e policy.Employee, idx uint64) policy.Identity {
	id := policy.Identity{Org: e.Org, Team: e.Team, Employee: e.ID}
	for _, w := range l.employees[e.ID] {
		if w.rev > idx {
			break
		}
		id.Team = w.team
	}
	return id
}

// check decides whether delivering p in message m to ic was allowed.
func (l *isoLog) check(ic *isoConn, m isoMsg, p isoPolicy) error {
	written, ok := l.byRev[p.Revision]
	switch {
	case !ok || written.Name != p.Name:
		return fmt.Errorf("policy %s at revision %d was never written", p.Name, p.Revision)
	case written.Scope != p.Scope:
		return fmt.Errorf("policy %s at revision %d delivered with scope %q, written with %q", p.Name, p.Revision, p.Scope, written.Scope)
	case p.Scope.Org != "" && p.Scope.Org != ic.emp.Org:
		return fmt.Errorf("CROSS-TENANT: policy %s (scope %q) delivered to %s of org %s", p.Name, p.Scope, ic.emp.ID, ic.emp.Org)
	case p.Scope.Employee != "" && p.Scope.Employee != ic.emp.ID:
		return fmt.Errorf("policy %s for employee %s delivered to %s", p.Name, p.Scope.Employee, ic.emp.ID)
	case p.Scope.Team == "":
		return nil
	}
	teams := []string{l.identityAt(ic.emp, max(m.lower, p.Revision)).Team}
	for _, w := range l.employees[ic.emp.ID] {
		if w.rev > max(m.lower, p.Revision) && ic.moveSentBefore(w.rev, m.at) {
			teams = append(teams, w.team)
		}
	}
	if !slices.Contains(teams, p.Scope.Team) {
		return fmt.Errorf("policy %s@%d (scope %q) delivered to %s, whose team was one of %v while the message (at least as new as index %d) was made; its writes (index, team): %v",
			p.Name, p.Revision, p.Scope, ic.emp.ID, teams, m.lower, l.employees[ic.emp.ID])
	}
	return nil
}

// moveSentBefore reports whether the employee write at rev was sent before
// at (so the message may reflect it). It reads the writers' record through
// the world the connection's employee belongs to.
func (ic *isoConn) moveSentBefore(rev uint64, at time.Time) bool {
	w := ic.world
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, mv := range w.moves[ic.emp.ID] {
		if mv.rev == rev {
			return mv.call.Before(at)
		}
	}
	return false
}

func mapsEqual(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
