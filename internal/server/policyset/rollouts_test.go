package policyset

import (
	"cmp"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/store"
)

func TestInCohort(t *testing.T) {
	members := make([]string, 10000)
	for i := range members {
		members[i] = fmt.Sprintf("sidecar-%d.example:%d", i, 5000+i%7)
	}

	t.Run("the contract's hash", func(t *testing.T) {
		// Written out independently of InCohort, so that a change to
		// the hash (which would flip members on a mixed-version cluster)
		// fails here.
		for _, m := range members[:500] {
			h := fnv.New64a()
			h.Write([]byte("r42\x00" + m))
			bucket := h.Sum64() % 10000
			for _, p := range []uint32{0, 1, 5, 37, 99, 100} {
				if got, want := InCohort("r42", m, p), bucket < uint64(p)*100; got != want {
					t.Fatalf("InCohort(r42, %q, %d) = %v, want %v (bucket %d)", m, p, got, want, bucket)
				}
			}
		}
	})

	t.Run("growing percent only adds members", func(t *testing.T) {
		for _, m := range members {
			in := false
			for p := uint32(0); p <= 100; p++ {
				now := InCohort("r7", m, p)
				if in && !now {
					t.Fatalf("%s is in at some percent below %d and out at %d", m, p, p)
				}
				in = now
			}
			if !in {
				t.Fatalf("%s is not in at 100%%", m)
			}
			if InCohort("r7", m, 0) {
				t.Fatalf("%s is in at 0%%", m)
			}
		}
	})

	t.Run("spread within binomial bounds", func(t *testing.T) {
		for _, id := range []string{"r1", "r12345", "r99999999"} {
			for _, p := range []uint32{5, 25, 50} {
				n := 0
				for _, m := range members {
					if InCohort(id, m, p) {
						n++
					}
				}
				// Five standard deviations: a correct hash fails this
				// about once in 3.5 million runs, a skewed one always.
				mean := float64(len(members)) * float64(p) / 100
				sd := math.Sqrt(mean * (1 - float64(p)/100))
				if math.Abs(float64(n)-mean) > 5*sd {
					t.Errorf("rollout %s at %d%%: %d of %d members, want %.0f ± %.0f", id, p, n, len(members), mean, 5*sd)
				}
			}
		}
	})

	t.Run("the same inputs give the same answer", func(t *testing.T) {
		for _, m := range members[:1000] {
			a := InCohort("r3", m, 25)
			for range 3 {
				if InCohort("r3", m, 25) != a {
					t.Fatalf("InCohort(r3, %q, 25) changed between calls", m)
				}
			}
		}
	})
}

func TestParseCaps(t *testing.T) {
	tests := []struct {
		in   []string
		want Caps
	}{
		{nil, Caps{}},
		{[]string{"rollouts"}, Caps{Rollouts: true}},
		{[]string{"shadow", " rollouts ", "teleport"}, Caps{Rollouts: true, Shadow: true}},
		{[]string{"Rollouts"}, Caps{}},
	}
	for _, tc := range tests {
		if got := ParseCaps(tc.in); got != tc.want {
			t.Errorf("ParseCaps(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	if got, want := (Caps{Rollouts: true, Shadow: true}).List(), []string{"rollouts", "shadow"}; !slices.Equal(got, want) {
		t.Errorf("List() = %v, want %v", got, want)
	}
}

// rolloutEnv is an index over a real store, fed by a real FSM for policy
// writes and by hand-made rollout changes (the control side's shape).
type rolloutEnv struct {
	t    *testing.T
	st   *store.Store
	fsm  *raftfsm.FSM
	sub  *store.Subscription
	x    *Index
	next uint64
}

func newRolloutEnv(t *testing.T) *rolloutEnv {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	sub := st.SubscribeWithData()
	t.Cleanup(sub.Close)
	x, err := New(st)
	if err != nil {
		t.Fatal(err)
	}
	return &rolloutEnv{t: t, st: st, fsm: raftfsm.New(st, logger), sub: sub, x: x, next: 1}
}

func (e *rolloutEnv) apply(cmd *command.Command, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
	data, err := command.Marshal(cmd)
	if err != nil {
		e.t.Fatal(err)
	}
	e.fsm.ApplyBatch([]*raft.Log{{Index: e.next, Term: 1, Type: raft.LogCommand, Data: data}})
	e.next++
	for _, c := range e.sub.Next() {
		if err := e.x.Update(c); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *rolloutEnv) put(name string, scope policy.Scope, reason string) {
	e.t.Helper()
	e.apply(command.PutPolicy(testPolicy(name, scope, reason), nil))
}

func testPolicy(name string, scope policy.Scope, reason string) *policy.Policy {
	return &policy.Policy{Name: name, Kind: policy.KindToolPolicy, Scope: scope,
		Spec: json.RawMessage(`{"action":"deny","reason":"` + reason + `","tool_name":"Bash"}`)}
}

// rolloutChange is the notification the control side sends for r.
func (e *rolloutEnv) rolloutChange(r *commandv1.Rollout, extra ...store.EntityChange) store.Change {
	e.t.Helper()
	data, err := proto.Marshal(r)
	if err != nil {
		e.t.Fatal(err)
	}
	idx := e.next
	e.next++
	var scopes []policy.Scope
	for _, ch := range r.GetChanges() {
		name := ch.GetName()
		if p := ch.GetPolicy(); p != nil {
			scopes = append(scopes, command.PolicyOf(p).Scope)
			name = p.GetName()
		}
		if rp, ok := e.x.Get(name); ok {
			scopes = append(scopes, rp.Policy.Scope)
		}
	}
	ents := []store.EntityChange{{Type: store.EntityRollout, ID: r.GetId(), Action: store.ActionUpdate, Index: idx, Data: data, Scopes: scopes}}
	for _, x := range extra {
		x.Index = idx
		ents = append(ents, x)
	}
	return store.Change{Index: idx, Entities: ents}
}

func (e *rolloutEnv) update(c store.Change) {
	e.t.Helper()
	if err := e.x.Update(c); err != nil {
		e.t.Fatal(err)
	}
}

func putChange(p *policy.Policy) *commandv1.RolloutChange {
	sc := p.Scope
	return &commandv1.RolloutChange{Op: "put", Policy: &commandv1.Policy{Name: p.Name, Kind: p.Kind, Spec: p.Spec, Labels: p.Labels,
		Scope: &commandv1.Scope{Org: sc.Org, Team: sc.Team, Employee: sc.Employee}}}
}

func newRollout(id string, state string, stage uint32, changes ...*commandv1.RolloutChange) *commandv1.Rollout {
	return &commandv1.Rollout{
		Id: id, Changes: changes, State: state, Stage: stage, OnHalt: "rollback", CreatedAtUnixMs: 1_800_000_000_000,
		Stages: []*commandv1.RolloutStage{{Percent: 5, BakeMs: 1000}, {Percent: 50, BakeMs: 1000}, {Percent: 100, BakeMs: 1000}},
	}
}

// members finds n members in the cohort of id at percent and n out of it.
func members(id string, percent uint32, n int) (in, out []string) {
	for i := 0; len(in) < n || len(out) < n; i++ {
		m := "client-" + strconv.Itoa(i)
		if InCohort(id, m, percent) {
			if len(in) < n {
				in = append(in, m)
			}
		} else if len(out) < n {
			out = append(out, m)
		}
	}
	return in, out
}

func names(s *Set) []string {
	var out []string
	for _, p := range s.Policies {
		out = append(out, p.Policy.Name+"@"+strconv.FormatUint(p.Policy.Revision, 10))
	}
	return out
}

// wantVersion is the content hash of the policies as listed.
func wantVersion(ps []store.RawPolicy) string {
	h := store.NewSetHash()
	for _, p := range ps {
		h.Add(p.Policy.Name, p.Stored)
	}
	return h.Sum()
}

func TestSetFor(t *testing.T) {
	env := newRolloutEnv(t)
	x := env.x
	team := policy.Identity{Org: "a", Team: "t"}
	e1 := policy.Identity{Org: "a", Team: "t", Employee: "e1"}
	other := policy.Identity{Org: "b", Team: "t", Employee: "e9"}
	env.put("keep", policy.Scope{Org: "a"}, "k")      // 1
	env.put("change", policy.Scope{Org: "a"}, "old")  // 2
	env.put("remove", policy.Scope{Org: "a"}, "r")    // 3
	env.put("elsewhere", policy.Scope{Org: "b"}, "e") // 4
	stable := x.Set(e1)
	if got, want := names(stable), []string{"change@2", "keep@1", "remove@3"}; !slices.Equal(got, want) {
		t.Fatalf("stable set %v, want %v", got, want)
	}

	// The id is the start's index, as the FSM assigns it.
	id := "r" + strconv.FormatUint(env.next, 10)
	rollout := newRollout(id, store.RolloutRunning, 0,
		putChange(testPolicy("change", policy.Scope{Org: "a"}, "new")),
		putChange(testPolicy("added", policy.Scope{Org: "a", Team: "t"}, "n")),
		&commandv1.RolloutChange{Op: "delete", Name: "remove"})
	env.update(env.rolloutChange(rollout))
	in5, out5 := members(id, 5, 3)
	on := Caps{Rollouts: true}

	t.Run("v1 client and non-members get the stable set", func(t *testing.T) {
		for _, m := range in5 {
			if got := x.SetFor(e1, m, Caps{}); got != x.Set(e1) {
				t.Errorf("member %s without the capability got %v (%v), want the stable *Set", m, names(got), got.Rollouts)
			}
			if got := x.SetFor(e1, m, Caps{Shadow: true}); got != x.Set(e1) {
				t.Errorf("member %s with shadow only got a candidate", m)
			}
		}
		for _, m := range out5 {
			if got := x.SetFor(e1, m, on); got != x.Set(e1) {
				t.Errorf("non-member %s got %v (%v), want the stable *Set", m, names(got), got.Rollouts)
			}
		}
		if got := x.SetFor(e1, "", on); got != x.Set(e1) {
			t.Errorf("no member: got a candidate")
		}
	})

	t.Run("cohort members share one candidate set", func(t *testing.T) {
		first := x.SetFor(e1, in5[0], on)
		if got, want := names(first), []string{"added@0", "change@0", "keep@1"}; !slices.Equal(got, want) {
			t.Fatalf("candidate %v, want %v", got, want)
		}
		if got, want := first.Rollouts, []string{id + ":0"}; !slices.Equal(got, want) {
			t.Errorf("Rollouts = %v, want %v", got, want)
		}
		if first.Version != wantVersion(first.Policies) || first.Version == stable.Version {
			t.Errorf("candidate version %.8s is not its content's hash (stable %.8s)", first.Version, stable.Version)
		}
		cand, _ := x.Get("keep")
		if !gocmp.Equal(first.Policies[2].Stored, cand.Stored) {
			t.Errorf("an unchanged policy is not served as stored")
		}
		for _, m := range in5[1:] {
			for _, id := range []policy.Identity{e1, {Org: "a", Team: "t", Employee: "e2"}, team} {
				if got := x.SetFor(id, m, on); got != first {
					t.Errorf("%s member %s got another *Set %v", id, m, names(got))
				}
			}
		}
	})

	t.Run("an identity the rollout does not touch stays stable", func(t *testing.T) {
		for _, m := range in5 {
			if got := x.SetFor(other, m, on); got != x.Set(other) {
				t.Errorf("org b member %s got a candidate %v", m, got.Rollouts)
			}
		}
	})

	t.Run("a later policy write reaches the candidate", func(t *testing.T) {
		before := x.SetFor(e1, in5[0], on)
		env.put("keep", policy.Scope{Org: "a"}, "k2") // 6
		got := x.SetFor(e1, in5[0], on)
		if got == before || !slices.Equal(names(got), []string{"added@0", "change@0", "keep@6"}) {
			t.Errorf("after a write: candidate %v (same *Set: %v)", names(got), got == before)
		}
		if got.Version != wantVersion(got.Policies) {
			t.Errorf("version is not the content's hash")
		}
	})

	t.Run("the next stage adds members, keeps the content", func(t *testing.T) {
		before := x.SetFor(e1, in5[0], on)
		rollout.Stage = 1
		env.update(env.rolloutChange(rollout))
		got := x.SetFor(e1, in5[0], on)
		if got.Version != before.Version || !slices.Equal(got.Rollouts, []string{id + ":1"}) {
			t.Errorf("stage 1: version %.8s (was %.8s), tags %v", got.Version, before.Version, got.Rollouts)
		}
		in50, _ := members(id, 50, 20)
		for _, m := range in50 {
			if s := x.SetFor(e1, m, on); s != got {
				t.Errorf("50%% member %s: not the candidate (%v)", m, s.Rollouts)
			}
		}
		if tagged, ok := x.SetTagged(e1, []string{id + ":1"}); !ok || tagged != got {
			t.Errorf("SetTagged(stage 1) = %v, %v; want the candidate", tagged, ok)
		}
		if _, ok := x.SetTagged(e1, []string{id + ":0"}); ok {
			t.Errorf("SetTagged of a past stage succeeded")
		}
		if _, ok := x.SetTagged(other, []string{id + ":1"}); ok {
			t.Errorf("SetTagged for an untouched identity succeeded")
		}
	})

	t.Run("paused and halted-stay still deliver", func(t *testing.T) {
		for _, tc := range []struct{ state, onHalt string }{{store.RolloutPaused, "rollback"}, {store.RolloutHalted, store.OnHaltStay}} {
			rollout.State, rollout.OnHalt = tc.state, tc.onHalt
			env.update(env.rolloutChange(rollout))
			if got := x.SetFor(e1, in5[0], on); len(got.Rollouts) != 1 {
				t.Errorf("%s (on_halt %s): member got the stable set", tc.state, tc.onHalt)
			}
		}
	})

	t.Run("rollback returns everyone to the stable set", func(t *testing.T) {
		since := env.next - 1
		rollout.State = store.RolloutRolledBack
		env.update(env.rolloutChange(rollout))
		for _, m := range in5 {
			if got := x.SetFor(e1, m, on); got != x.Set(e1) {
				t.Errorf("member %s still has %v", m, got.Rollouts)
			}
		}
		if x.HasRollouts() {
			t.Errorf("HasRollouts after the rollback")
		}
		if !x.ChangedSince(e1, since) {
			t.Errorf("ChangedSince(e1, %d) = false: a cohort member resuming from before the rollback would keep the candidate", since)
		}
		if x.ChangedSince(e1, env.next) {
			t.Errorf("ChangedSince after the rollback = true")
		}
		if x.ChangedSince(other, since) {
			t.Errorf("ChangedSince for an untouched identity = true")
		}
	})
}

// TestSetForCompletion: a completed rollout's batch carries its policy
// writes; the cohort's next set is the new stable one.
func TestSetForCompletion(t *testing.T) {
	env := newRolloutEnv(t)
	x := env.x
	e1 := policy.Identity{Org: "a", Team: "t", Employee: "e1"}
	env.put("p", policy.Scope{Org: "a"}, "old")
	r := newRollout("r5", store.RolloutRunning, 2, putChange(testPolicy("p", policy.Scope{Org: "a"}, "new")))
	env.update(env.rolloutChange(r))
	on := Caps{Rollouts: true}
	if got := x.SetFor(e1, "anyone", on); !slices.Equal(got.Rollouts, []string{"r5:2"}) {
		t.Fatalf("at 100%%: %v, want the candidate", got.Rollouts)
	}
	if !x.ChangedSince(e1, 1) {
		t.Errorf("ChangedSince with an active rollout = false")
	}
	since := env.next - 1

	// The completion: the rollout change and the policy write in one batch.
	r.State = store.RolloutCompleted
	done := policy.Policy{Name: "p", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "a"},
		Spec: json.RawMessage(`{"action":"deny","reason":"new","tool_name":"Bash"}`), Revision: env.next}
	stored, err := done.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	env.update(env.rolloutChange(r, store.EntityChange{Type: store.EntityPolicy, ID: "p", Action: store.ActionUpdate,
		Data: stored, Policy: &done, Scopes: []policy.Scope{{Org: "a"}}}))
	got := x.SetFor(e1, "anyone", on)
	if got != x.Set(e1) || !slices.Equal(names(got), []string{fmt.Sprintf("p@%d", env.next-1)}) {
		t.Errorf("after completion: %v %v, want the new stable set", names(got), got.Rollouts)
	}
	if x.ChangedSince(e1, since) {
		t.Errorf("ChangedSince after a completion = true: the event log describes it")
	}
}

// TestRolloutsReload: the index loads active rollouts at start and on a
// resync, and takes in later changes after them.
func TestRolloutsReload(t *testing.T) {
	env := newRolloutEnv(t)
	env.put("p", policy.Scope{Org: "a"}, "old")
	e1 := policy.Identity{Org: "a", Team: "t", Employee: "e1"}
	r := newRollout("r2", store.RolloutRunning, 2, putChange(testPolicy("p", policy.Scope{Org: "a"}, "new")))
	stored := []*commandv1.Rollout{r, newRollout("r1", store.RolloutAborted, 0, putChange(testPolicy("p", policy.Scope{Org: "a"}, "x")))}
	list := func() ([]*commandv1.Rollout, uint64, error) { return stored, 3, nil }
	x, err := newIndex(env.st, list)
	if err != nil {
		t.Fatal(err)
	}
	on := Caps{Rollouts: true}
	if got := x.SetFor(e1, "m", on); !slices.Equal(got.Rollouts, []string{"r2:2"}) {
		t.Fatalf("loaded: %v, want the candidate of r2", got.Rollouts)
	}
	// A batch the load already holds is not taken in again...
	old := proto.CloneOf(r)
	old.State = store.RolloutRolledBack
	data, _ := proto.Marshal(old)
	if err := x.Update(store.Change{Index: 3, Entities: []store.EntityChange{{Type: store.EntityRollout, ID: "r2", Data: data}}}); err != nil {
		t.Fatal(err)
	}
	if got := x.SetFor(e1, "m", on); len(got.Rollouts) == 0 {
		t.Errorf("a batch at the load's index was taken in again")
	}
	// ...a later one is.
	if err := x.Update(store.Change{Index: 4, Entities: []store.EntityChange{{Type: store.EntityRollout, ID: "r2", Data: data}}}); err != nil {
		t.Fatal(err)
	}
	if got := x.SetFor(e1, "m", on); len(got.Rollouts) != 0 {
		t.Errorf("rolled back at index 4: still %v", got.Rollouts)
	}
	// Resync reloads the stored state.
	if err := x.Update(store.Change{Index: 5, Resync: true}); err != nil {
		t.Fatal(err)
	}
	if got := x.SetFor(e1, "m", on); !slices.Equal(got.Rollouts, []string{"r2:2"}) {
		t.Errorf("after a resync: %v, want the stored rollout's candidate", got.Rollouts)
	}
	// r1 ended at an unknown index: a resume from within it resyncs.
	if !x.ChangedSince(policy.Identity{Org: "a", Team: "u", Employee: "e3"}, 1) {
		t.Errorf("ChangedSince within an aborted rollout loaded from the store = false")
	}
}

// TestCandidateSetForEmployeeScope: a put naming one employee gives that
// employee a candidate set of its own; its teammates share the team's.
func TestCandidateSetForEmployeeScope(t *testing.T) {
	env := newRolloutEnv(t)
	x := env.x
	env.put("team", policy.Scope{Org: "a", Team: "t"}, "t")
	e1 := policy.Identity{Org: "a", Team: "t", Employee: "e1"}
	e2 := policy.Identity{Org: "a", Team: "t", Employee: "e2"}
	env.update(env.rolloutChange(newRollout("r9", store.RolloutRunning, 2,
		putChange(testPolicy("mine", policy.Scope{Org: "a", Employee: "e1"}, "m")),
		putChange(testPolicy("team", policy.Scope{Org: "a", Team: "t"}, "t2")))))
	on := Caps{Rollouts: true}
	s1, s2 := x.SetFor(e1, "m1", on), x.SetFor(e2, "m2", on)
	if got, want := names(s1), []string{"mine@0", "team@0"}; !slices.Equal(got, want) {
		t.Errorf("e1: %v, want %v", got, want)
	}
	if got, want := names(s2), []string{"team@0"}; !slices.Equal(got, want) {
		t.Errorf("e2: %v, want %v", got, want)
	}
	if s2 != x.SetFor(policy.Identity{Org: "a", Team: "t", Employee: "e3"}, "m3", on) {
		t.Errorf("teammates the rollout does not name do not share a candidate set")
	}
}

// TestSetForMatchesModel is a property test: after random policy writes and
// rollout starts, stage changes, pauses, halts, rollbacks, aborts and
// completions, SetFor for every identity and member equals the stable set
// the store reads with the changes of every active rollout the member is in
// (and that touches the identity) applied, and its version is that
// content's hash. A stale candidate or a missed invalidation shows up here.
func TestSetForMatchesModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	env := newRolloutEnv(t)
	x := env.x
	scopes := []policy.Scope{{}, {Org: "a"}, {Org: "b"}, {Org: "a", Team: "t"}, {Org: "a", Team: "u"},
		{Org: "a", Team: "t", Employee: "e1"}, {Org: "a", Employee: "e2"}}
	identities := []policy.Identity{{Org: "a", Team: "t", Employee: "e1"}, {Org: "a", Team: "u", Employee: "e2"},
		{Org: "a", Team: "t", Employee: "e5"}, {Org: "b", Team: "t", Employee: "e3"}, {Org: "c"}}
	membersList := []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"}
	on := Caps{Rollouts: true}

	active := map[string]*commandv1.Rollout{}
	candidates, ended := 0, 0
	locked := func(name string) bool {
		for _, r := range active {
			for _, ch := range r.GetChanges() {
				if ch.GetName() == name || ch.GetPolicy().GetName() == name {
					return true
				}
			}
		}
		return false
	}
	for round := range 150 {
		switch op := rng.IntN(10); {
		case op < 4: // a plain write to a policy no rollout stages
			name := fmt.Sprintf("p%d", rng.IntN(6))
			if locked(name) {
				continue
			}
			if _, ok := x.Get(name); ok && rng.IntN(3) == 0 {
				env.apply(command.DeletePolicy(name, nil))
			} else {
				env.put(name, scopes[rng.IntN(len(scopes))], fmt.Sprint(rng.IntN(3)))
			}
		case op < 6 && len(active) < 3: // a new rollout
			var changes []*commandv1.RolloutChange
			for range 1 + rng.IntN(2) {
				name := fmt.Sprintf("p%d", rng.IntN(6))
				if locked(name) || slices.ContainsFunc(changes, func(c *commandv1.RolloutChange) bool {
					return c.GetName() == name || c.GetPolicy().GetName() == name
				}) {
					continue
				}
				if _, ok := x.Get(name); ok && rng.IntN(3) == 0 {
					changes = append(changes, &commandv1.RolloutChange{Op: "delete", Name: name})
				} else {
					changes = append(changes, putChange(testPolicy(name, scopes[rng.IntN(len(scopes))], "cand"+fmt.Sprint(round))))
				}
			}
			if len(changes) == 0 {
				continue
			}
			r := newRollout("r"+strconv.FormatUint(env.next, 10), store.RolloutRunning, 0, changes...)
			r.Stages = []*commandv1.RolloutStage{{Percent: 30}, {Percent: 60}, {Percent: 100}}
			r.CreatedAtUnixMs = int64(1_800_000_000_000 + round)
			active[r.GetId()] = r
			env.update(env.rolloutChange(r))
		case len(active) > 0: // move one
			ids := slices.Sorted(maps.Keys(active))
			r := active[ids[rng.IntN(len(ids))]]
			switch rng.IntN(6) {
			case 0:
				if int(r.Stage)+1 < len(r.Stages) {
					r.Stage++
				}
				r.State = store.RolloutRunning
			case 1:
				r.State = store.RolloutPaused
			case 2:
				r.State, r.OnHalt = store.RolloutHalted, store.OnHaltStay
			case 3:
				r.State = []string{store.RolloutRolledBack, store.RolloutAborted}[rng.IntN(2)]
			case 4, 5:
				// Completion: the changes become ordinary writes, then the
				// rollout ends.
				for _, ch := range r.GetChanges() {
					if ch.GetOp() == "delete" {
						if _, ok := x.Get(ch.GetName()); ok {
							env.apply(command.DeletePolicy(ch.GetName(), nil))
						}
						continue
					}
					env.apply(command.PutPolicy(command.PolicyOf(ch.GetPolicy()), nil))
				}
				r.State = store.RolloutCompleted
			}
			if !delivers(r) {
				delete(active, r.GetId())
				ended++
			}
			env.update(env.rolloutChange(r))
		}

		for _, id := range identities {
			stable, err := env.st.PolicySet(id)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range membersList {
				want := map[string][]byte{}
				for _, p := range stable.Policies {
					rp, _ := x.Get(p.Name)
					want[p.Name] = rp.Stored
				}
				var tags []string
				for _, rid := range slices.SortedFunc(maps.Keys(active), func(a, b string) int { return cmp.Compare(rolloutStart(a), rolloutStart(b)) }) {
					r := active[rid]
					if !InCohort(rid, m, r.Stages[r.Stage].GetPercent()) {
						continue
					}
					touches := false
					for _, ch := range r.GetChanges() {
						name := ch.GetName()
						if p := ch.GetPolicy(); p != nil {
							name = p.GetName()
							touches = touches || command.PolicyOf(p).Scope.AppliesTo(id)
						}
						if rp, ok := x.Get(name); ok {
							touches = touches || rp.Policy.Scope.AppliesTo(id)
						}
					}
					if !touches {
						continue
					}
					tags = append(tags, rid+":"+strconv.FormatUint(uint64(r.Stage), 10))
					for _, ch := range r.GetChanges() {
						if ch.GetOp() == "delete" {
							delete(want, ch.GetName())
							continue
						}
						cand, err := store.CandidatePolicy(r, ch.GetPolicy())
						if err != nil {
							t.Fatal(err)
						}
						if cand.Policy.Scope.AppliesTo(id) {
							want[cand.Policy.Name] = cand.Stored
						} else {
							delete(want, cand.Policy.Name)
						}
					}
				}
				h := store.NewSetHash()
				var wantNames []string
				for _, n := range slices.Sorted(maps.Keys(want)) {
					h.Add(n, want[n])
					wantNames = append(wantNames, n)
				}
				got := x.SetFor(id, m, on)
				var gotNames []string
				for _, p := range got.Policies {
					gotNames = append(gotNames, p.Policy.Name)
				}
				if got.Version != h.Sum() || !slices.Equal(gotNames, wantNames) || !slices.Equal(got.Rollouts, tags) {
					t.Fatalf("round %d, %s member %s: index has %v %v (%.8s), want %v %v (%.8s)",
						round, id, m, gotNames, got.Rollouts, got.Version, wantNames, tags, h.Sum())
				}
				if len(tags) > 0 {
					candidates++
				}
				if len(tags) == 0 && got != x.Set(id) {
					t.Fatalf("round %d, %s member %s: stable content but not the stable *Set", round, id, m)
				}
			}
		}
	}
	t.Logf("%d candidate sets checked, %d rollouts ended", candidates, ended)
	if candidates < 100 || ended < 5 {
		t.Fatalf("the model exercised too little: %d candidate sets, %d rollouts ended", candidates, ended)
	}
}
