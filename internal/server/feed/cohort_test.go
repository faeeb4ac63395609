package feed

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// dispatchRollout hands the index and the hub the change the control side
// commits for r at the next index, as the node's dispatcher would, and
// returns that index. The fixture's dispatcher is idle: apply waits for
// the hub to take in each batch.
func (f *fixture) dispatchRollout(r *commandv1.Rollout, scopes ...policy.Scope) uint64 {
	f.t.Helper()
	idx := f.next
	f.next++
	c := store.Change{Index: idx, At: time.Now(), Entities: []store.EntityChange{servertest.RolloutEntity(f.t, r, idx, scopes...)}}
	if err := f.idx.Update(c); err != nil {
		f.t.Fatal(err)
	}
	f.hub.OnChange(c)
	return idx
}

func rolloutPut(p *policy.Policy) *commandv1.RolloutChange {
	return &commandv1.RolloutChange{Op: "put", Policy: &commandv1.Policy{Name: p.Name, Kind: p.Kind, Spec: p.Spec,
		Scope: &commandv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee}}}
}

// feedState is what a client holds after applying messages.
type feedState struct {
	policies map[string]string // name → spec
	digest   string
	version  uint64
}

func (s *feedState) apply(m feedv1.Message) {
	switch m.Type {
	case feedv1.TypeInit:
		s.policies = map[string]string{}
		for _, p := range m.Policies {
			s.policies[p.Name] = string(p.Spec)
		}
	case feedv1.TypeUpsert:
		s.policies[m.Policy.Name] = string(m.Policy.Spec)
	case feedv1.TypeDelete:
		delete(s.policies, m.PolicyName)
	default:
		return
	}
	s.digest, s.version = m.Digest, m.Version
}

// wantState is the state set describes.
func wantState(set *policyset.Set) map[string]string {
	out := map[string]string{}
	for _, rp := range set.Policies {
		out[rp.Policy.Name] = string(wirePolicy(rp.Policy).Spec)
	}
	return out
}

// TestRolloutCohortFeed: over the feed, a rollout moves the connections of
// its cohort that declared ?capabilities=rollouts to the candidate set with
// upserts and deletes, and back on rollback; nobody else hears of it; a
// resume cannot take a connection to the wrong set.
func TestRolloutCohortFeed(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	pool := make([]*command.Command, 0, 200)
	for i := range 200 {
		pool = append(pool, f.putEmployee(fmt.Sprintf("m%03d", i), "acme", "red", policy.StatusActive))
	}
	f.apply(pool...)
	f.apply(f.putPolicy("t-red-old", scopeTeam("acme", "red"), "old"))

	id := "r" + strconv.FormatUint(f.next, 10) // the index dispatchRollout will use
	var member, later, never string
	for i := range 200 {
		e := fmt.Sprintf("m%03d", i)
		switch {
		case member == "" && policyset.InCohort(id, e, 5):
			member = e
		case later == "" && !policyset.InCohort(id, e, 5) && policyset.InCohort(id, e, 50):
			later = e
		case never == "" && !policyset.InCohort(id, e, 50):
			never = e
		}
	}
	if member == "" || later == "" || never == "" {
		t.Fatalf("no employees in and out of the cohort of %s among 200", id)
	}
	caps := feedv1.QueryCapabilities + "=rollouts,shadow,future"
	type tc struct {
		c     *client
		state *feedState
	}
	conns := map[string]*tc{}
	open := func(name, e, query string) {
		c := f.dial(t, dialOpts{token: f.token(e, "acme", "red"), query: query})
		st := &feedState{}
		st.apply(c.nextOf(feedv1.TypeInit))
		conns[name] = &tc{c, st}
	}
	open("member", member, caps)
	open("member-v1", member, "")
	open("later", later, caps)
	open("never", never, caps)

	// read applies what each connection got up to the marker policy.
	marker := 0
	read := func() map[string][]string {
		t.Helper()
		marker++
		name := "marker-" + strconv.Itoa(marker)
		f.apply(f.putPolicy(name, policy.Scope{}, "m"))
		got := map[string][]string{}
		for n, c := range conns {
			var msgs []feedv1.Message
			for {
				m := c.c.next()
				c.state.apply(m)
				if m.Type == feedv1.TypeUpsert && m.Policy.Name == name {
					break
				}
				msgs = append(msgs, m)
			}
			got[n] = summary(msgs)
		}
		return got
	}
	check := func(what string, name, e string, caps policyset.Caps) {
		t.Helper()
		set := f.idx.SetFor(identity("acme", "red", e), e, caps)
		st := conns[name].state
		want := wantState(set)
		if diff := cmp.Diff(want, st.policies); diff != "" {
			t.Errorf("%s: %s holds (-want +got):\n%s", what, name, diff)
		}
		if st.digest != set.Version {
			t.Errorf("%s: %s digest %.8s, want %.8s", what, name, st.digest, set.Version)
		}
	}
	on := policyset.Caps{Rollouts: true, Shadow: true}
	r := &commandv1.Rollout{
		Id: id, State: store.RolloutRunning, OnHalt: "rollback", CreatedAtUnixMs: 1_800_000_000_000,
		Stages: []*commandv1.RolloutStage{{Percent: 5, BakeMs: 1000}, {Percent: 50, BakeMs: 1000}, {Percent: 100, BakeMs: 1000}},
		Changes: []*commandv1.RolloutChange{
			rolloutPut(toolPolicy("t-acme-red", scopeTeam("acme", "red"), "candidate")),
			rolloutPut(toolPolicy("new-red", scopeTeam("acme", "red"), "new")),
			{Op: "delete", Name: "t-red-old"},
		},
	}
	red := scopeTeam("acme", "red")

	// Stage 0: the member with the capability moves, in name order at the
	// rollout's index; nobody else hears anything.
	at := f.dispatchRollout(r, red)
	got := read()
	if want := []string{"upsert:new-red", "upsert:t-acme-red", "delete:t-red-old"}; !slices.Equal(got["member"], want) {
		t.Errorf("stage 0: member got %v, want %v", got["member"], want)
	}
	for _, n := range []string{"member-v1", "later", "never"} {
		if len(got[n]) != 0 {
			t.Errorf("stage 0: %s got %v, want nothing", n, got[n])
		}
	}
	check("stage 0", "member", member, on)
	check("stage 0", "member-v1", member, policyset.Caps{})
	check("stage 0", "never", never, on)
	if conns["member"].state.digest == conns["member-v1"].state.digest {
		t.Errorf("the candidate has the stable digest")
	}
	clients := map[string][]string{}
	for _, c := range f.hub.Clients() {
		clients[c.GetEmployee()+"/"+fmt.Sprint(c.GetCapabilities())] = c.GetRollouts()
	}
	if got := clients[member+"/[rollouts shadow]"]; !slices.Equal(got, []string{id + ":0"}) {
		t.Errorf("member's ClientInfo rollouts %v, want [%s:0] (clients %v)", got, id, clients)
	}
	if got, ok := clients[member+"/[]"]; !ok || len(got) != 0 {
		t.Errorf("v1 connection's ClientInfo rollouts %v (present %v), want none", got, ok)
	}

	// Stage 1: later joins; the member holds the candidate already.
	r.Stage = 1
	f.dispatchRollout(r, red)
	got = read()
	if len(got["member"]) != 0 || len(got["later"]) != 3 || len(got["never"]) != 0 || len(got["member-v1"]) != 0 {
		t.Errorf("stage 1: got %v, want only later's three messages", got)
	}
	check("stage 1", "later", later, on)

	// Resumes. A cohort member must not be replayed the stable history.
	t.Run("resume of a cohort member gets init", func(t *testing.T) {
		c := f.dial(t, dialOpts{token: f.token(member, "acme", "red"), query: caps + "&since=" + strconv.FormatUint(at, 10)})
		m := c.nextOf(feedv1.TypeInit)
		st := &feedState{}
		st.apply(m)
		if set := f.idx.SetFor(identity("acme", "red", member), member, on); st.digest != set.Version {
			t.Errorf("init digest %.8s, want the candidate's %.8s", st.digest, set.Version)
		}
	})
	t.Run("an identity the rollout does not touch is replayed", func(t *testing.T) {
		b, init := f.connect(t, bob, "")
		_ = b.ws.Close(websocket.StatusNormalClosure, "bye")
		f.apply(f.putPolicy("t-acme-blue", scopeTeam("acme", "blue"), "changed"))
		c := f.dial(t, dialOpts{token: f.token("bob", "acme", "blue"), query: caps + "&since=" + strconv.FormatUint(init.Version, 10)})
		if m := c.next(); m.Type != feedv1.TypeUpsert || m.Policy.Name != "t-acme-blue" {
			t.Errorf("bob's resume: %s %v, want the replayed upsert of t-acme-blue", m.Type, m.Policy)
		}
	})

	// Rollback: both cohort members move back.
	beforeRollback := f.next - 1
	r.State = store.RolloutRolledBack
	f.dispatchRollout(r, red)
	got = read()
	if want := []string{"delete:new-red", "upsert:t-acme-red", "upsert:t-red-old"}; !slices.Equal(got["member"], want) || !slices.Equal(got["later"], want) {
		t.Errorf("rollback: member got %v, later %v, want %v", got["member"], got["later"], want)
	}
	if len(got["never"]) != 0 || len(got["member-v1"]) != 0 {
		t.Errorf("rollback: never got %v, member-v1 %v, want nothing", got["never"], got["member-v1"])
	}
	for _, n := range []string{"member", "later", "never", "member-v1"} {
		if d := conns[n].state.digest; d != conns["never"].state.digest {
			t.Errorf("after the rollback %s has digest %.8s, want the stable %.8s", n, d, conns["never"].state.digest)
		}
	}
	check("rollback", "member", member, on)
	t.Run("resume from before the rollback gets init", func(t *testing.T) {
		c := f.dial(t, dialOpts{token: f.token(member, "acme", "red"), query: caps + "&since=" + strconv.FormatUint(beforeRollback, 10)})
		if m := c.next(); m.Type != feedv1.TypeInit {
			t.Errorf("resume from within the rolled-back rollout: %s, want init", m.Type)
		}
	})
}

// TestRolloutCompletionFeed: a completion's batch carries the rollout's end
// and its changes as ordinary policy writes. A cohort connection gets each
// written policy once, in its new revision, with the stable digest; so
// does everyone else.
func TestRolloutCompletionFeed(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	caps := feedv1.QueryCapabilities + "=rollouts"
	cohort := f.dial(t, dialOpts{token: f.token("alice", "acme", "red"), query: caps})
	cohort.nextOf(feedv1.TypeInit)
	v1, _ := f.connect(t, alice, "")
	red := scopeTeam("acme", "red")
	r := &commandv1.Rollout{
		Id: "r" + strconv.FormatUint(f.next, 10), State: store.RolloutRunning, Stage: 1, OnHalt: "rollback", CreatedAtUnixMs: 1_800_000_000_000,
		Stages:  []*commandv1.RolloutStage{{Percent: 5, BakeMs: 1000}, {Percent: 100, BakeMs: 1000}},
		Changes: []*commandv1.RolloutChange{rolloutPut(toolPolicy("t-acme-red", red, "candidate"))},
	}
	f.dispatchRollout(r, red)
	if m := cohort.next(); m.Type != feedv1.TypeUpsert || m.Policy.Name != "t-acme-red" || m.Policy.Revision != 0 {
		t.Fatalf("at 100%%: %s %+v, want the candidate's upsert", m.Type, m.Policy)
	}

	// The completion batch, as the control side commits it: the write,
	// then the rollout's end.
	idx := f.next
	f.next++
	done := toolPolicy("t-acme-red", red, "candidate")
	done.Revision, done.CreatedAt, done.UpdatedAt = idx, time.Unix(1, 0).UTC(), time.Unix(2, 0).UTC()
	stored, err := done.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	r.State = store.RolloutCompleted
	c := store.Change{Index: idx, At: time.Now(), Entities: []store.EntityChange{
		{Type: store.EntityPolicy, ID: "t-acme-red", Action: store.ActionUpdate, Index: idx, Data: stored, Policy: done, Scopes: []policy.Scope{red}},
		servertest.RolloutEntity(t, r, idx, red),
	}}
	if err := f.idx.Update(c); err != nil {
		t.Fatal(err)
	}
	f.hub.OnChange(c)
	stable := f.idx.Set(alice).Version
	f.apply(f.putPolicy("marker", policy.Scope{}, "m"))
	for name, cl := range map[string]*client{"cohort": cohort, "v1": v1} {
		got := cl.until("marker")
		if len(got) != 1 || got[0].Type != feedv1.TypeUpsert || got[0].Policy.Revision != idx || got[0].Digest != stable {
			t.Errorf("%s after the completion: %v, want one upsert of t-acme-red at revision %d with digest %.8s (got %+v)", name, summary(got), idx, stable, got)
		}
	}
}
