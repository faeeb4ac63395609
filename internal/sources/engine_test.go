package sources

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/store"
	"github.com/policyd/policyd/internal/third_party/raft"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDriver serves a fixed observation; a unit-test stand-in for the Git
// and Kubernetes drivers, which have tests of their own against real
// servers.
type fakeDriver struct {
	name string
	mu   sync.Mutex
	obs  *Observation
	err  error
	got  [][]Outcome
}

func (d *fakeDriver) Name() string { return d.name }
func (d *fakeDriver) Watch(ctx context.Context, changed func()) error {
	changed()
	<-ctx.Done()
	return nil
}
func (d *fakeDriver) Observe(context.Context) (*Observation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.obs, d.err
}
func (d *fakeDriver) Report(_ context.Context, o []Outcome) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, o)
}
func (d *fakeDriver) set(obs *Observation) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.obs = obs
}
func (d *fakeDriver) last() []Outcome {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.got) == 0 {
		return nil
	}
	return d.got[len(d.got)-1]
}

// cluster is one replica: a real store and FSM, with entries applied in
// order as a leader's would be.
type cluster struct {
	st      *store.Store
	fsm     *raftfsm.FSM
	mu      sync.Mutex
	index   uint64
	entries []*command.Command
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return &cluster{st: st, fsm: raftfsm.New(st, slog.New(slog.DiscardHandler))}
}

func (c *cluster) propose(_ context.Context, cmd *command.Command) (*commandv1.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	cmd.ProcessedAtUnixNano = time.Unix(1_700_000_000, 0).Add(time.Duration(c.index) * time.Second).UnixNano()
	data, err := command.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	c.entries = append(c.entries, cmd)
	res, _ := c.fsm.Apply(&raft.Log{Index: c.index, Term: 1, Type: raft.LogCommand, Data: data}).(*commandv1.Result)
	return res, nil
}

func (c *cluster) syncs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.entries {
		if e.Type() == command.TypeSyncSource {
			n++
		}
	}
	return n
}

func (c *cluster) owners(t *testing.T) map[string]string {
	t.Helper()
	ps, err := c.st.ListPolicies(store.PolicyFilter{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range ps {
		out[p.Name] = p.Source
	}
	return out
}

func newEngine(t *testing.T, c *cluster, cfg Config, d Driver) *Engine {
	t.Helper()
	v, err := policy.NewValidator(nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, slog.New(slog.DiscardHandler), Deps{Store: c.st, Validator: v, Propose: c.propose}, d)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func tool(name, action string) *policy.Policy {
	return &policy.Policy{Name: name, Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "acme"},
		Spec: json.RawMessage(fmt.Sprintf(`{"tool_name":"Bash","action":%q}`, action))}
}

func declare(ps ...*policy.Policy) []Declared {
	out := make([]Declared, len(ps))
	for i, p := range ps {
		out[i] = Declared{Policy: p, Object: "ToolPolicy " + p.Name}
	}
	return out
}

func states(o []Outcome) map[string]string {
	out := map[string]string{}
	for _, x := range o {
		out[x.Name] = x.State
	}
	return out
}

// TestSyncs walks a source through its cases, one sync at a time: create,
// no-op, change and delete; invalid objects keep their last good version;
// a conflict with the API's policy, then adoption; a prune refusal, then
// the grant; an atomic observation with one bad object applies nothing;
// a partial read never prunes.
func TestSyncs(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	if _, err := c.propose(ctx, mustCmd(t)(command.PutPolicy(tool("acme.api", "deny"), nil))); err != nil {
		t.Fatal(err)
	}
	d := &fakeDriver{name: Kubernetes}
	e := newEngine(t, c, Config{MaxPruneRatio: 0.5}, d)
	bad := tool("acme.bad", "deny")
	bad.Spec = json.RawMessage(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["("]}}`)

	steps := []struct {
		name       string
		obs        Observation
		grant      bool
		wantResult string
		wantSyncs  int // entries so far
		wantOwners map[string]string
		wantStates map[string]string
	}{
		{
			name:       "create three",
			obs:        Observation{Revision: "1", Complete: true, Policies: declare(tool("acme.a", "deny"), tool("acme.b", "deny"), tool("acme.c", "deny"))},
			wantResult: ResultCommitted, wantSyncs: 1,
			wantOwners: map[string]string{"acme.api": "", "acme.a": Kubernetes, "acme.b": Kubernetes, "acme.c": Kubernetes},
			wantStates: map[string]string{"acme.a": StateCommitted, "acme.b": StateCommitted, "acme.c": StateCommitted},
		},
		{
			name:       "the same again commits nothing",
			obs:        Observation{Revision: "2", Complete: true, Policies: declare(tool("acme.a", "deny"), tool("acme.b", "deny"), tool("acme.c", "deny"))},
			wantResult: ResultUnchanged, wantSyncs: 1,
		},
		{
			name:       "change one, delete one, one invalid keeps its version",
			obs:        Observation{Revision: "3", Complete: true, Policies: declare(tool("acme.a", "audit"), func() *policy.Policy { p := *bad; p.Name = "acme.b"; return &p }())},
			wantResult: ResultCommitted, wantSyncs: 2,
			wantOwners: map[string]string{"acme.api": "", "acme.a": Kubernetes, "acme.b": Kubernetes},
			wantStates: map[string]string{"acme.a": StateCommitted, "acme.b": StateInvalid},
		},
		{
			name:       "the API's policy is a conflict",
			obs:        Observation{Revision: "4", Complete: true, Policies: declare(tool("acme.a", "audit"), tool("acme.b", "deny"), tool("acme.api", "allow"))},
			wantResult: ResultUnchanged, wantSyncs: 2, // acme.b is back to its last good version
			wantOwners: map[string]string{"acme.api": "", "acme.a": Kubernetes, "acme.b": Kubernetes},
			wantStates: map[string]string{"acme.a": StateCommitted, "acme.b": StateCommitted, "acme.api": StateConflict},
		},
		{
			name: "adopt takes it",
			obs: Observation{Revision: "5", Complete: true, Policies: append(declare(tool("acme.a", "audit"), tool("acme.b", "deny")),
				Declared{Policy: tool("acme.api", "allow"), Object: "ToolPolicy acme.api", Adopt: true})},
			wantResult: ResultCommitted, wantSyncs: 3,
			wantOwners: map[string]string{"acme.api": Kubernetes, "acme.a": Kubernetes, "acme.b": Kubernetes},
		},
		{
			name:       "a partial read never prunes",
			obs:        Observation{Revision: "6", Complete: false, Policies: declare(tool("acme.a", "audit"))},
			wantResult: ResultUnchanged, wantSyncs: 3,
			wantOwners: map[string]string{"acme.api": Kubernetes, "acme.a": Kubernetes, "acme.b": Kubernetes},
		},
		{
			name:       "deleting two of three is refused",
			obs:        Observation{Revision: "7", Complete: true, Policies: declare(tool("acme.a", "deny"))},
			wantResult: ResultPruneRefused, wantSyncs: 3,
			wantOwners: map[string]string{"acme.api": Kubernetes, "acme.a": Kubernetes, "acme.b": Kubernetes},
			wantStates: map[string]string{"acme.a": StatePruneRefused},
		},
		{
			name:       "until it is allowed",
			obs:        Observation{Revision: "7", Complete: true, Policies: declare(tool("acme.a", "deny"))},
			grant:      true,
			wantResult: ResultCommitted, wantSyncs: 5, // the request, then the sync
			wantOwners: map[string]string{"acme.a": Kubernetes},
		},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			obs := step.obs
			d.set(&obs)
			if step.grant {
				if _, err := c.propose(ctx, mustCmd(t)(command.RequestSourceSync(Kubernetes, true))); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.SyncNow(ctx, Kubernetes); err != nil {
				t.Fatal(err)
			}
			st, _ := e.Status(Kubernetes)
			if st.LastResult != step.wantResult {
				t.Errorf("result %s (%s), want %s", st.LastResult, st.LastError, step.wantResult)
			}
			c.mu.Lock()
			n := len(c.entries)
			c.mu.Unlock()
			if n-1 != step.wantSyncs { // less the API's put
				t.Errorf("%d entries after the API's put, want %d", n-1, step.wantSyncs)
			}
			if step.wantOwners != nil {
				if diff := cmp.Diff(step.wantOwners, c.owners(t)); diff != "" {
					t.Errorf("owners (-want +got):\n%s", diff)
				}
			}
			if step.wantStates != nil {
				if diff := cmp.Diff(step.wantStates, states(d.last())); diff != "" {
					t.Errorf("outcomes (-want +got):\n%s", diff)
				}
			}
		})
	}
	if rec, _ := c.st.Source(Kubernetes); rec.AllowPrune {
		t.Error("the grant to prune was not used up")
	}
	// And the next big prune is refused again.
	d.set(&Observation{Revision: "8", Complete: true})
	if err := e.SyncNow(ctx, Kubernetes); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.Status(Kubernetes); st.LastResult != ResultPruneRefused || st.PruneRefused == nil || st.PruneRefused.Deletes != 1 {
		t.Errorf("emptying after the grant: %+v; want a refusal of 1 delete", st)
	}
}

// TestAtomicRefusesWhole: one invalid document in a commit applies nothing
// of it, names the object and field, and the last good commit stays.
func TestAtomicRefusesWhole(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	d := &fakeDriver{name: GitName("policies")}
	e := newEngine(t, c, Config{}, d)
	d.set(&Observation{Revision: "c1", Complete: true, Atomic: true, Policies: declare(tool("acme.a", "deny"))})
	if err := e.SyncNow(ctx, d.name); err != nil {
		t.Fatal(err)
	}
	bad := tool("acme.b", "deny")
	bad.Spec = json.RawMessage(`{"tool_name":"Bash","action":"explode"}`)
	obs := &Observation{Revision: "c2", Complete: true, Atomic: true, Policies: []Declared{
		{Policy: tool("acme.a", "audit"), Object: "p/a.yaml#1"}, {Policy: bad, Object: "p/b.yaml#2"},
	}}
	d.set(obs)
	if err := e.SyncNow(ctx, d.name); err != nil {
		t.Fatal(err)
	}
	st, _ := e.Status(d.name)
	if st.LastResult != ResultInvalid || !strings.Contains(st.LastError, "p/b.yaml#2: ") || !strings.Contains(st.LastError, "spec.action") {
		t.Errorf("status %q: %q; want invalid naming p/b.yaml#2 and spec.action", st.LastResult, st.LastError)
	}
	p, err := c.st.GetPolicy("acme.a")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(p.Spec), `"deny"`) {
		t.Errorf("acme.a is %s; the refused commit changed it", p.Spec)
	}
	if rec, _ := c.st.Source(d.name); rec.Revision != "c1" {
		t.Errorf("recorded revision %q, want the last good c1", rec.Revision)
	}
}

// TestLargeSyncSplits: a sync above the entry bound is split into whole
// entries, in order; 5,000 policies of 4 KB are one.
func TestLargeSyncSplits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bound    int
		pad      int
		wantSync int
	}{
		{"5000 of 4 KB in one entry", 0, 4000, 1},
		{"split", 400 << 10, 200, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			d := &fakeDriver{name: Kubernetes}
			e := newEngine(t, c, Config{MaxEntryBytes: tc.bound}, d)
			pad := strings.Repeat("x", tc.pad)
			var ps []*policy.Policy
			for i := range 5000 {
				p := tool(fmt.Sprintf("acme.p%04d", i), "deny")
				p.Spec = json.RawMessage(fmt.Sprintf(`{"tool_name":"Bash","action":"deny","reason":%q}`, pad))
				ps = append(ps, p)
			}
			d.set(&Observation{Revision: "1", Complete: true, Policies: declare(ps...)})
			if err := e.SyncNow(context.Background(), Kubernetes); err != nil {
				t.Fatal(err)
			}
			if got := c.syncs(); got != tc.wantSync {
				t.Errorf("%d sync entries, want %d", got, tc.wantSync)
			}
			if got := len(c.owners(t)); got != 5000 {
				t.Errorf("%d policies, want 5000", got)
			}
			if rec, _ := c.st.Source(Kubernetes); rec.Policies != 5000 || rec.Revision != "1" {
				t.Errorf("record %+v, want 5000 policies at revision 1", rec)
			}
		})
	}
}

// TestRunDebouncesAndWakes: the loop syncs once at start, coalesces a
// burst of changes into one sync, and a sync request through the log
// wakes it.
func TestRunDebouncesAndWakes(t *testing.T) {
	c := newCluster(t)
	d := &burstDriver{fakeDriver: fakeDriver{name: Kubernetes}, kick: make(chan func(), 1)}
	d.set(&Observation{Revision: "1", Complete: true, Policies: declare(tool("acme.a", "deny"))})
	e := newEngine(t, c, Config{Debounce: 50 * time.Millisecond, MaxDebounce: time.Second}, d)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	defer func() { cancel(); <-done }()

	poll.Eventually(t, "the first sync", poll.Holds(func() bool { return c.syncs() == 1 }), poll.Within(5*time.Second))
	changed := <-d.kick
	d.set(&Observation{Revision: "2", Complete: true, Policies: declare(tool("acme.a", "audit"), tool("acme.b", "deny"))})
	for range 20 {
		changed()
	}
	poll.Eventually(t, "the burst's sync", poll.Holds(func() bool { return len(c.owners(t)) == 2 }), poll.Within(5*time.Second))
	if got := c.syncs(); got != 2 {
		t.Errorf("%d syncs after a burst of 20 changes, want 2", got)
	}
	d.set(&Observation{Revision: "3", Complete: true, Policies: declare(tool("acme.a", "allow"), tool("acme.b", "deny"))})
	if _, err := c.propose(ctx, mustCmd(t)(command.RequestSourceSync(Kubernetes, false))); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, "the requested sync", poll.Holds(func() bool { return c.syncs() == 3 }), poll.Within(5*time.Second))
}

// burstDriver hands the test its changed function.
type burstDriver struct {
	fakeDriver
	kick chan func()
}

func (d *burstDriver) Watch(ctx context.Context, changed func()) error {
	changed()
	d.kick <- changed
	<-ctx.Done()
	return nil
}

func mustCmd(t testing.TB) func(*command.Command, error) *command.Command {
	return func(c *command.Command, err error) *command.Command {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// TestDeclaredRollout: a change of an object with spec.rollout goes out as
// a staged rollout by the source, not with the sync; while it runs the
// policy is left alone; once it completes the policy is the source's at
// the candidate; a candidate that was rolled back is not tried again.
func TestDeclaredRollout(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	d := &fakeDriver{name: Kubernetes}
	e := newEngine(t, c, Config{}, d)
	withRollout := func(p *policy.Policy) Declared {
		return Declared{Policy: p, Object: "ToolPolicy " + p.Name, Rollout: &Rollout{Stages: []string{"50%", "100%"}, Bake: time.Minute}}
	}
	d.set(&Observation{Revision: "1", Complete: true, Policies: []Declared{withRollout(tool("acme.r", "deny"))}})
	if err := e.SyncNow(ctx, Kubernetes); err != nil {
		t.Fatal(err)
	}
	kinds := func() []command.Type {
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []command.Type
		for _, x := range c.entries {
			out = append(out, x.Type())
		}
		return out
	}
	if diff := cmp.Diff([]command.Type{command.TypeRolloutStart}, kinds()); diff != "" {
		t.Fatalf("entries (-want +got):\n%s", diff)
	}
	rs, _, err := c.st.Rollouts()
	if err != nil || len(rs) != 1 || rs[0].GetSource() != Kubernetes {
		t.Fatalf("rollouts %v, %v; want one by the source", rs, err)
	}
	// While it runs, another sync leaves the policy to it.
	d.set(&Observation{Revision: "2", Complete: true, Policies: []Declared{withRollout(tool("acme.r", "audit"))}})
	if err := e.SyncNow(ctx, Kubernetes); err != nil {
		t.Fatal(err)
	}
	if got := len(kinds()); got != 1 {
		t.Errorf("%d entries while the rollout runs, want still 1", got)
	}
	complete := func(id, to string) {
		t.Helper()
		if _, err := c.propose(ctx, mustCmd(t)(command.RolloutTransition(&commandv1.RolloutTransition{
			Id: id, ExpectState: store.RolloutRunning, State: to, AtUnixMs: 1, Reason: "test"}))); err != nil {
			t.Fatal(err)
		}
	}
	complete(rs[0].GetId(), store.RolloutCompleted)
	p, err := c.st.GetPolicy("acme.r")
	if err != nil || p.Source != Kubernetes || !strings.Contains(string(p.Spec), `"deny"`) {
		t.Fatalf("after completion: %+v, %v; want the candidate, owned by the source", p, err)
	}
	// The object changed meanwhile: that change is staged next; rolled
	// back, it is not tried again.
	if err := e.SyncNow(ctx, Kubernetes); err != nil {
		t.Fatal(err)
	}
	if rs, _, _ = c.st.Rollouts(); len(rs) != 2 {
		t.Fatalf("%d rollouts, want a second for the change", len(rs))
	}
	complete(rs[1].GetId(), store.RolloutRolledBack)
	if err := e.SyncNow(ctx, Kubernetes); err != nil {
		t.Fatal(err)
	}
	if rs, _, _ = c.st.Rollouts(); len(rs) != 2 {
		t.Errorf("%d rollouts; a rolled-back candidate was tried again", len(rs))
	}
	if got := states(d.last())["acme.r"]; got != StateFailed {
		t.Errorf("outcome %s, want %s", got, StateFailed)
	}
	// A bad spec.rollout makes the object invalid.
	bad := withRollout(tool("acme.r", "allow"))
	bad.Rollout.Stages = []string{"50%", "40%"}
	d.set(&Observation{Revision: "3", Complete: true, Policies: []Declared{bad}})
	if err := e.SyncNow(ctx, Kubernetes); err != nil {
		t.Fatal(err)
	}
	if o := d.last(); len(o) != 1 || o[0].State != StateInvalid || !strings.Contains(o[0].Message, "spec.rollout") {
		t.Errorf("outcomes %+v, want one invalid naming spec.rollout", o)
	}
}
