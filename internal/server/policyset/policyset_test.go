package policyset

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/store"
)

// TestIndexMatchesStore is a property test: after random batches of policy
// writes, moves and deletes, the index's set and version for every identity
// equal what store.PolicySet reads from the database, which the REST API
// serves. A stale cache entry or a missed invalidation shows up here.
func TestIndexMatchesStore(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	logger := slog.New(slog.DiscardHandler)
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	}()
	fsm := raftfsm.New(st, logger)
	sub := st.SubscribeWithData()
	defer sub.Close()
	x, err := New(st)
	if err != nil {
		t.Fatal(err)
	}

	scopes := []policy.Scope{{}, {Org: "a"}, {Org: "b"}, {Org: "a", Team: "t"}, {Org: "a", Team: "u"},
		{Org: "a", Team: "t", Employee: "e1"}, {Org: "a", Employee: "e2"}, {Org: "b", Team: "t"}}
	// e5 shares team a/t with e1 but no policy names it, and a/t itself
	// is asked for too: the index hands them one *Set.
	identities := []policy.Identity{{}, {Org: "a"}, {Org: "a", Team: "t", Employee: "e1"}, {Org: "a", Team: "u", Employee: "e2"},
		{Org: "b", Team: "t", Employee: "e3"}, {Org: "c", Employee: "e4"}, {Org: "a", Team: "t", Employee: "e5"}, {Org: "a", Team: "t"}}
	next := uint64(1)
	for round := range 60 {
		var logs []*raft.Log
		for range 1 + rng.IntN(4) {
			name := fmt.Sprintf("p%d", rng.IntN(8))
			var cmd *command.Command
			if rng.IntN(4) == 0 {
				cmd, err = command.DeletePolicy(name, nil)
			} else {
				spec, _ := json.Marshal(map[string]any{"tool_name": "Bash", "action": "deny", "reason": fmt.Sprint(rng.IntN(3))})
				cmd, err = command.PutPolicy(&policy.Policy{Name: name, Kind: policy.KindToolPolicy, Scope: scopes[rng.IntN(len(scopes))], Spec: spec}, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			cmd.ProcessedAtUnixNano = time.Now().UnixNano()
			data, err := command.Marshal(cmd)
			if err != nil {
				t.Fatal(err)
			}
			logs = append(logs, &raft.Log{Index: next, Term: 1, Type: raft.LogCommand, Data: data})
			next++
		}
		fsm.ApplyBatch(logs) // deleting a missing policy is a business error: fine here
		// Read sets before the update too, so stale cache entries exist to
		// be invalidated.
		for _, id := range identities {
			x.Set(id)
		}
		for _, c := range sub.Next() {
			if err := x.Update(c); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range identities {
			want, err := st.PolicySet(id)
			if err != nil {
				t.Fatal(err)
			}
			got := x.Set(id)
			var gotNames, wantNames []string
			for _, p := range got.Policies {
				gotNames = append(gotNames, p.Policy.Name)
			}
			for _, p := range want.Policies {
				wantNames = append(wantNames, p.Name)
			}
			if got.Version != want.Version || !slices.Equal(gotNames, wantNames) {
				t.Fatalf("round %d, identity %s: index has %v (%.8s), store has %v (%.8s)", round, id, gotNames, got.Version, wantNames, want.Version)
			}
		}
	}
	if x.Applied() != next-1 {
		t.Fatalf("Applied() = %d, want %d", x.Applied(), next-1)
	}
	if _, ok := x.Get("nonexistent"); ok {
		t.Fatal("Get of a missing policy succeeded")
	}
}

// TestEmployeesShareTeamSet: an employee that no policy names gets its
// team's *Set (so that a change is hashed and encoded once per team), and a
// policy naming it gives it a set of its own until the policy goes.
func TestEmployeesShareTeamSet(t *testing.T) {
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
	fsm := raftfsm.New(st, logger)
	sub := st.SubscribeWithData()
	t.Cleanup(sub.Close)
	x, err := New(st)
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1)
	apply := func(cmd *command.Command, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		data, err := command.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		fsm.ApplyBatch([]*raft.Log{{Index: next, Term: 1, Type: raft.LogCommand, Data: data}})
		next++
		for _, c := range sub.Next() {
			if err := x.Update(c); err != nil {
				t.Fatal(err)
			}
		}
	}
	put := func(name string, scope policy.Scope) {
		apply(command.PutPolicy(&policy.Policy{Name: name, Kind: policy.KindToolPolicy, Scope: scope,
			Spec: json.RawMessage(`{"tool_name":"Bash","action":"deny","reason":"r"}`)}, nil))
	}
	team := policy.Identity{Org: "a", Team: "t"}
	e1 := policy.Identity{Org: "a", Team: "t", Employee: "e1"}
	e2 := policy.Identity{Org: "a", Team: "t", Employee: "e2"}
	tests := []struct {
		name   string
		change func()
		shared map[policy.Identity]bool // identity → whether it has the team's *Set
		want   map[policy.Identity][]string
	}{
		{"no policy names anyone", func() { put("org", policy.Scope{Org: "a"}) },
			map[policy.Identity]bool{e1: true, e2: true},
			map[policy.Identity][]string{e1: {"org"}, e2: {"org"}}},
		{"a policy names e1", func() { put("own", e1) },
			map[policy.Identity]bool{e1: false, e2: true},
			map[policy.Identity][]string{e1: {"org", "own"}, e2: {"org"}}},
		{"it moves to the team", func() { put("own", team) },
			map[policy.Identity]bool{e1: true, e2: true},
			map[policy.Identity][]string{e1: {"org", "own"}, e2: {"org", "own"}}},
		{"it names e2, then goes", func() {
			put("own", e2)
			apply(command.DeletePolicy("own", nil))
		},
			map[policy.Identity]bool{e1: true, e2: true},
			map[policy.Identity][]string{e1: {"org"}, e2: {"org"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.change()
			teamSet := x.Set(team)
			for id, wantShared := range tc.shared {
				got := x.Set(id)
				if shared := got == teamSet; shared != wantShared {
					t.Errorf("%s shares the team's set = %v, want %v", id, shared, wantShared)
				}
				if got != x.Set(id) {
					t.Errorf("%s: a second Set call returned another *Set", id)
				}
				var names []string
				for _, p := range got.Policies {
					names = append(names, p.Policy.Name)
				}
				want, err := st.PolicySet(id)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(names, tc.want[id]) || got.Version != want.Version {
					t.Errorf("%s: index has %v (%.8s), want %v (store %.8s)", id, names, got.Version, tc.want[id], want.Version)
				}
			}
		})
	}
}

// TestIndexTakesEachBatchsOwnState: when the dispatcher takes in a batch
// after later batches were committed, the index must hold the state as of
// that batch, not the later state of the policies it touched next to the
// earlier state of others: a set that never existed at any index.
func TestIndexTakesEachBatchsOwnState(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	}()
	put := func(index uint64, names ...string) {
		t.Helper()
		m := store.Meta{Index: index, ProcessedAt: time.Unix(int64(index), 0), OriginatedAt: time.Unix(int64(index), 0)}
		err := st.ApplyBatch(index, func(b *store.Batch) error {
			for _, n := range names {
				p, err := policy.DecodePolicy([]byte(`{"name":"` + n + `","kind":"ToolPolicy","scope":{"org":"o"},"spec":{"tool_name":"Bash","action":"deny","reason":"r"}}`))
				if err != nil {
					return err
				}
				if _, _, err := b.PutPolicy(m, p, nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("batch %d: %v", index, err)
		}
	}
	put(1, "a", "b")
	x, err := New(st)
	if err != nil {
		t.Fatal(err)
	}
	sub := st.SubscribeWithData()
	defer sub.Close()
	// A subscription without the states cannot feed the index, and says so.
	plain := st.Subscribe()
	defer plain.Close()
	// Committed before the dispatcher takes in any of them.
	put(2, "b")
	put(3, "a")
	put(4, "b")
	put(5, "c")
	id := policy.Identity{Org: "o"}
	want := map[uint64]map[string]uint64{ // revision of each policy after each batch
		2: {"a": 1, "b": 2},
		3: {"a": 3, "b": 2},
		4: {"a": 3, "b": 4},
		5: {"a": 3, "b": 4, "c": 5},
	}
	changes := sub.Next()
	if len(changes) != 4 {
		t.Fatalf("%d changes queued, want 4", len(changes))
	}
	if err := x.Update(plain.Next()[0]); err == nil || !strings.Contains(err.Error(), "SubscribeWithData") {
		t.Errorf("Update with a change without states: %v, want an error naming SubscribeWithData", err)
	}
	for _, c := range changes {
		if err := x.Update(c); err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, rp := range x.Set(id).Policies {
			got[rp.Policy.Name] = rp.Policy.Revision
		}
		if !maps.Equal(got, want[c.Index]) {
			t.Errorf("after batch %d: revisions %v, want %v", c.Index, got, want[c.Index])
		}
	}

	// A reload reads the store past queued batches; taking them in again
	// must not move the index back.
	put(6, "a")
	put(7, "a")
	queued := sub.Next()
	if err := x.Update(store.Change{Index: 5, Resync: true}); err != nil {
		t.Fatal(err)
	}
	for _, c := range queued {
		if err := x.Update(c); err != nil {
			t.Fatal(err)
		}
		if rev := x.Set(id).Policies[0].Policy.Revision; rev != 7 {
			t.Errorf("after a reload at index 7 and then batch %d: a at revision %d, want 7", c.Index, rev)
		}
	}
}
