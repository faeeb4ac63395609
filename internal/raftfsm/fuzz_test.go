package raftfsm

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// Run longer with:
//
//	go test ./internal/raftfsm/ -run '^$' -fuzz '^FuzzDecodeEntry$' -fuzztime 60s

// errRollback abandons a fuzz input's batch, so every input sees the same
// base state.
var errRollback = errors.New("rollback")

// fuzzBase is the state every fuzz input is applied to: one of each entity,
// so that updates, deletes and compare-and-set guards have something to hit.
func fuzzBase(t testing.TB) []*commandv1.Command {
	t.Helper()
	m := mustCmd(t)
	return []*commandv1.Command{
		m(command.PutPolicy(pol("p", "acme", "deny"), nil)),
		m(command.PutEmployee(emp("alice", "acme"), nil)),
		m(command.RegisterMember(store.Member{ID: "n1", RaftAddr: "r1"})),
		// r4, staging "staged".
		m(command.RolloutStart(&commandv1.Rollout{OnHalt: store.OnHaltStay,
			Changes: []*commandv1.RolloutChange{{Op: store.OpPut, Policy: &commandv1.Policy{Name: "staged", Kind: policy.KindToolPolicy, Spec: []byte(`{"action":"deny","tool_name":"Bash"}`)}}},
			Stages:  []*commandv1.RolloutStage{{Percent: 10, BakeMs: 1000}, {Percent: 100, BakeMs: 1000}}})),
	}
}

// fuzzMove is a transition of the base state's rollout r4.
func fuzzMove(t testing.TB, fromState string, fromStage uint32, to string, stage uint32, at int64) *commandv1.Command {
	return mustCmd(t)(command.RolloutTransition(&commandv1.RolloutTransition{Id: "r4", ExpectState: fromState, ExpectStage: fromStage, State: to, Stage: stage, AtUnixMs: at, Reason: "r"}))
}

// fuzzSeeds are encoded entries: one valid command of every type (several
// aimed at the base state), and broken ones.
func fuzzSeeds(t testing.TB) [][]byte {
	t.Helper()
	m := mustCmd(t)
	cmds := []*commandv1.Command{
		m(command.PutPolicy(pol("p", "acme", "audit"), rev(1))),
		m(command.PutPolicy(pol("q", "", "allow"), rev(0))),
		m(command.PutPolicy(&policy.Policy{Name: "v", Kind: policy.KindValidatingPolicy, Scope: policy.Scope{Org: "acme", Team: "t", Employee: "e"},
			Labels: map[string]string{"tier": "prod"}, Spec: []byte(`{"validations":[{"expression":"true","message":"m"}]}`)}, nil)),
		m(command.DeletePolicy("p", rev(1))),
		m(command.DeletePolicy("missing", nil)),
		m(command.PutEmployee(emp("alice", "beta"), rev(2))),
		m(command.PutEmployee(emp("bob", "acme"), nil)),
		m(command.DeleteEmployee("alice", rev(7))),
		m(command.RegisterMember(store.Member{ID: "n2", RaftAddr: "r2", HTTPAddr: "h2", GRPCAddr: "g2"})),
		m(command.RemoveMember("n1")),
		m(command.PruneEvents(t0.Add(1 << 40))),
		{Type: 0xFE, Payload: []byte("future")},
		{Type: 0x7E},
		{Type: 0x1FE},
		{Type: uint32(command.TypePutPolicy), Payload: []byte{0xff}},
		{Type: uint32(command.TypePutPolicy), Payload: []byte{0x0a, 0x02, '{', '}'}},
		{Type: uint32(command.TypePutEmployee), Payload: []byte{0x0a, 0x02, '{', '}'}},
		{Type: uint32(command.TypeDeletePolicy), Payload: []byte{0x0a, 0x01, 0xff}},
		m(command.RegisterMember(store.Member{RaftAddr: "r"})), // empty id: was accepted, then panicked in Apply
		m(command.RolloutStart(&commandv1.Rollout{OnHalt: store.OnHaltRollback,
			Changes: []*commandv1.RolloutChange{{Op: store.OpPut, Policy: &commandv1.Policy{Name: "staged", Spec: []byte(`{}`)}}, {Op: store.OpDelete, Name: "p"}},
			Stages:  []*commandv1.RolloutStage{{Percent: 100, BakeMs: 1000}}})),
		m(command.PutPolicy(pol("staged", "acme", "deny"), nil)),
		fuzzMove(t, store.RolloutRunning, 0, store.RolloutRunning, 1, 1),
		fuzzMove(t, store.RolloutRunning, 0, store.RolloutCompleted, 0, 0),
		fuzzMove(t, store.RolloutRunning, 0, store.RolloutPaused, 0, 253402300799999),
		fuzzMove(t, store.RolloutRunning, 0, store.RolloutRunning, 1, 1<<62), // past year 9999: refused
		{Type: uint32(command.TypeRolloutStart), Payload: []byte{0x0a, 0x00}},
		{Type: uint32(command.TypeRolloutTransition), Payload: []byte{0x0a, 0x01, 'x'}},
	}
	var out [][]byte
	for i, c := range cmds {
		out = append(out, stamp(t, uint64(i+1), c))
	}
	return append(out, nil, []byte{0xff, 0xff}, []byte("\x08\x01\x12\x03abc"))
}

// checkApply decodes data as the entry after base and, if DecodeEntry
// accepts it, applies it inside a batch that is then rolled back. The
// property: DecodeEntry never panics, and an accepted entry's Apply returns
// a Result (business errors included) without panicking.
func checkApply(t *testing.T, st *store.Store, data []byte) {
	t.Helper()
	idx := st.AppliedIndex() + 1
	e, err := DecodeEntry(idx, data)
	if err != nil {
		if e != nil {
			t.Fatalf("DecodeEntry returned an entry with its error %v", err)
		}
		return
	}
	if e.Meta.Index != idx {
		t.Fatalf("Meta.Index = %d, want %d", e.Meta.Index, idx)
	}
	if e.Apply == nil {
		if _, known := knownTypes[e.Type]; known || e.Type&command.IgnoreUnknown == 0 {
			t.Fatalf("type 0x%02x decoded without Apply", uint8(e.Type))
		}
		return
	}
	var r *commandv1.Result
	err = st.ApplyBatch(idx, func(b *store.Batch) error {
		r = e.Apply(b)
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("ApplyBatch = %v, want the rollback", err)
	}
	if r == nil {
		t.Fatal("Apply returned a nil Result")
	}
	if r.GetIndex() != idx {
		t.Errorf("Result.Index = %d, want %d", r.GetIndex(), idx)
	}
	switch r.GetCode() {
	case "", command.CodeNotFound, command.CodeConflict:
	default:
		t.Errorf("Result.Code = %q, want a known code", r.GetCode())
	}
	if (command.ResultErr(r) == nil) != (r.GetCode() == "") {
		t.Errorf("command.ResultErr(%v) = %v", r, command.ResultErr(r))
	}
}

// fuzzStore opens a store holding the fuzz base state.
func fuzzStore(t testing.TB) *store.Store {
	t.Helper()
	st := openStoreAt(t, filepath.Join(t.TempDir(), "state.db"))
	f := New(st, testLogger())
	for i, c := range fuzzBase(t) {
		asResult(t, f.Apply(entry(t, uint64(i+1), c)))
	}
	return st
}

func FuzzDecodeEntry(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	// One store per fuzz worker; each input's batch is rolled back.
	st := fuzzStore(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkApply(t, st, data)
	})
}

// TestDecodedEntriesApply checks the fuzz property on inputs that matter:
// the seeds, and commands the proposer should never send but DecodeEntry
// accepts.
func TestDecodedEntriesApply(t *testing.T) {
	st := fuzzStore(t)
	for _, s := range fuzzSeeds(t) {
		checkApply(t, st, s)
	}
	before := digest(t, st)
	m := mustCmd(t)
	big := strings.Repeat("x", 32769)
	tests := []struct {
		name string
		cmd  *commandv1.Command
	}{
		{"register member with an empty id", m(command.RegisterMember(store.Member{RaftAddr: "r"}))},
		{"remove member with an empty id", m(command.RemoveMember(""))},
		{"delete policy with an empty name", m(command.DeletePolicy("", nil))},
		{"delete employee with an empty id", m(command.DeleteEmployee("", nil))},
		{"prune with a zero cutoff", m(command.New(&commandv1.PruneEvents{}))},
		{"policy with a non-object spec", m(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`{"name":"n","spec":[1,"x",null]}`)}))},
		{"policy with a null spec", m(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`{"name":"n","spec":null}`)}))},
		// Keys longer than bbolt allows (32 KiB) would make Apply panic on
		// every replica, and again on every restart; DecodeEntry must refuse
		// them so the leader, which decodes every command before proposing,
		// never lets one into the log.
		{"oversize policy name", m(command.PutPolicy(pol(big, "acme", "deny"), nil))},
		{"oversize policy org", m(command.PutPolicy(pol("p2", big, "deny"), nil))},
		{"oversize employee id", m(command.PutEmployee(emp(big, "acme"), nil))},
		{"oversize employee org", m(command.PutEmployee(emp("e2", big), nil))},
		{"oversize member id", m(command.RegisterMember(store.Member{ID: big}))},
		{"rollout put with a spec that is not JSON", m(command.New(&commandv1.RolloutStart{Rollout: &commandv1.Rollout{OnHalt: store.OnHaltStay,
			Changes: []*commandv1.RolloutChange{{Op: store.OpPut, Policy: &commandv1.Policy{Name: "n", Spec: []byte(`{"a":`)}}},
			Stages:  []*commandv1.RolloutStage{{Percent: 100, BakeMs: 1000}}}}))},
		{"rollout transition past year 9999", fuzzMove(t, store.RolloutRunning, 0, store.RolloutRunning, 1, 253402300800000)},
		{"rollout transition with an oversize id", m(command.RolloutTransition(&commandv1.RolloutTransition{Id: big}))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("DecodeEntry accepted the entry but Apply panicked: %v", p)
				}
			}()
			checkApply(t, st, stamp(t, st.AppliedIndex()+1, tc.cmd))
		})
	}
	if got := digest(t, st); got != before {
		t.Error("rolled-back inputs changed the base state")
	}
}
