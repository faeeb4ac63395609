package raftfsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// t0 is the base of every test timestamp.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// processedAt and originatedAt are what the proposer stamps on entry idx.
func processedAt(idx uint64) time.Time  { return t0.Add(time.Duration(idx) * time.Second) }
func originatedAt(idx uint64) time.Time { return processedAt(idx).Add(-time.Millisecond) }

func rev(v uint64) *uint64 { return &v }

func testLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// mustCmd returns a function that unwraps a command constructor's results
// into the envelope a log entry carries, failing the test on error:
// mustCmd(t)(command.PutPolicy(p, nil)).
func mustCmd(t testing.TB) func(*command.Command, error) *commandv1.Command {
	return func(c *command.Command, err error) *commandv1.Command {
		t.Helper()
		if err != nil {
			t.Fatalf("build command: %v", err)
		}
		env, err := command.Encode(c)
		if err != nil {
			t.Fatalf("encode command: %v", err)
		}
		return env
	}
}

// mustTyped is mustCmd for the typed command itself.
func mustTyped(t testing.TB) func(*command.Command, error) *command.Command {
	return func(c *command.Command, err error) *command.Command {
		t.Helper()
		if err != nil {
			t.Fatalf("build command: %v", err)
		}
		return c
	}
}

// enc is c as the envelope a log entry carries.
func enc(t testing.TB, c *command.Command) *commandv1.Command {
	t.Helper()
	env, err := command.Encode(c)
	if err != nil {
		t.Fatalf("encode command: %v", err)
	}
	return env
}

// stamp returns cmd with the proposer's timestamps for idx, encoded.
func stamp(t testing.TB, idx uint64, cmd *commandv1.Command) []byte {
	t.Helper()
	cp := proto.Clone(cmd).(*commandv1.Command)
	cp.ProcessedAtUnixNano = processedAt(idx).UnixNano()
	cp.OriginatedAtUnixNano = originatedAt(idx).UnixNano()
	b, err := proto.Marshal(cp)
	if err != nil {
		t.Fatalf("marshal command: %v", err)
	}
	return b
}

// entry is the raft log entry at idx carrying cmd.
func entry(t testing.TB, idx uint64, cmd *commandv1.Command) *raft.Log {
	t.Helper()
	return &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: stamp(t, idx, cmd)}
}

// rawEntry is a command log entry at idx with arbitrary data.
func rawEntry(idx uint64, data []byte) *raft.Log {
	return &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: data}
}

func pol(name, org, action string) *policy.Policy {
	return &policy.Policy{
		Name:  name,
		Kind:  policy.KindToolPolicy,
		Scope: policy.Scope{Org: org},
		Spec:  json.RawMessage(`{"action":"` + action + `","tool_name":"Bash"}`),
	}
}

func putPolicy(t testing.TB, name, org string, ifMatch *uint64) *commandv1.Command {
	t.Helper()
	return mustCmd(t)(command.PutPolicy(pol(name, org, "deny"), ifMatch))
}

func emp(id, org string) *policy.Employee {
	return &policy.Employee{ID: id, Org: org, Team: "platform", Status: policy.StatusActive}
}

// closeWithin closes st, failing the test if Close blocks (a leaked lock).
func closeWithin(t testing.TB, st *store.Store) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- st.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("store.Close blocked for 5s: a lock is still held")
	}
}

func openStoreAt(t testing.TB, path string) *store.Store {
	t.Helper()
	st, err := store.Open(path, testLogger())
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { closeWithin(t, st) })
	return st
}

// newFSM returns an FSM over a fresh store in a temporary directory.
func newFSM(t testing.TB) (*FSM, *store.Store) {
	t.Helper()
	st := openStoreAt(t, filepath.Join(t.TempDir(), "state.db"))
	return New(st, testLogger()), st
}

func digest(t testing.TB, st *store.Store) string {
	t.Helper()
	d, _, err := st.Digest()
	if err != nil {
		t.Fatalf("Digest: %v", err)
	}
	return d
}

// asResult asserts that an apply response is a *commandv1.Result.
func asResult(t testing.TB, v any) *commandv1.Result {
	t.Helper()
	r, ok := v.(*commandv1.Result)
	if !ok || r == nil {
		t.Fatalf("apply response = %#v, want a non-nil *commandv1.Result", v)
	}
	return r
}

// applyAll applies logs in one batch and returns the results, all of which
// must be non-nil.
func applyAll(t testing.TB, f *FSM, logs ...*raft.Log) []*commandv1.Result {
	t.Helper()
	out := f.ApplyBatch(logs)
	if got, want := len(out), len(logs); got != want {
		t.Fatalf("ApplyBatch returned %d results for %d entries", got, want)
	}
	rs := make([]*commandv1.Result, len(out))
	for i, v := range out {
		rs[i] = asResult(t, v)
	}
	return rs
}

// applyRecover runs ApplyBatch and returns what it panicked with, or nil.
func applyRecover(f *FSM, logs []*raft.Log) (panicked any) {
	defer func() { panicked = recover() }()
	f.ApplyBatch(logs)
	return nil
}

func TestApplyCommands(t *testing.T) {
	f, st := newFSM(t)
	in := pol("acme.deny-shell", "acme", "deny")
	in.Revision, in.CreatedAt = 99, t0.Add(-time.Hour) // server-managed: dropped

	steps := []struct {
		name    string
		cmd     *commandv1.Command
		wantRev uint64
		wantErr error // store.ErrConflict, store.ErrNotFound or nil
	}{
		{"create policy", mustCmd(t)(command.PutPolicy(in, nil)), 1, nil},
		{"create again with if-match 0", putPolicy(t, "acme.deny-shell", "acme", rev(0)), 0, store.ErrConflict},
		{"update with matching revision", putPolicy(t, "acme.deny-shell", "beta", rev(1)), 3, nil},
		{"update with stale revision", putPolicy(t, "acme.deny-shell", "beta", rev(1)), 0, store.ErrConflict},
		{"delete with stale revision", mustCmd(t)(command.DeletePolicy("acme.deny-shell", rev(1))), 0, store.ErrConflict},
		{"delete missing policy", mustCmd(t)(command.DeletePolicy("nope", nil)), 0, store.ErrNotFound},
		{"delete with matching revision", mustCmd(t)(command.DeletePolicy("acme.deny-shell", rev(3))), 7, nil},
		{"create employee", mustCmd(t)(command.PutEmployee(emp("alice", "acme"), rev(0))), 8, nil},
		{"create employee again with if-match 0", mustCmd(t)(command.PutEmployee(emp("alice", "acme"), rev(0))), 0, store.ErrConflict},
		{"update employee", mustCmd(t)(command.PutEmployee(emp("alice", "beta"), rev(8))), 10, nil},
		{"delete missing employee", mustCmd(t)(command.DeleteEmployee("bob", nil)), 0, store.ErrNotFound},
		{"delete employee with stale revision", mustCmd(t)(command.DeleteEmployee("alice", rev(8))), 0, store.ErrConflict},
		{"delete employee", mustCmd(t)(command.DeleteEmployee("alice", rev(10))), 13, nil},
		{"register member", mustCmd(t)(command.RegisterMember(store.Member{ID: "n1", RaftAddr: "10.0.0.1:7000", HTTPAddr: "h", GRPCAddr: "g"})), 14, nil},
		{"remove member", mustCmd(t)(command.RemoveMember("n1")), 15, nil},
		{"remove unknown member", mustCmd(t)(command.RemoveMember("n2")), 16, nil},
	}
	for i, st := range steps {
		idx := uint64(i + 1)
		t.Run(st.name, func(t *testing.T) {
			r := asResult(t, f.Apply(entry(t, idx, st.cmd)))
			if got, want := r.GetIndex(), idx; got != want {
				t.Errorf("Index = %d, want %d", got, want)
			}
			// A failed command's Revision is not part of the contract
			// (deletes report the index, puts 0); only check successes.
			if got, want := r.GetRevision(), st.wantRev; st.wantErr == nil && got != want {
				t.Errorf("Revision = %d, want %d", got, want)
			}
			err := command.ResultErr(r)
			switch {
			case st.wantErr == nil && err != nil:
				t.Errorf("ResultErr = %v, want nil", err)
			case st.wantErr != nil && !errors.Is(err, st.wantErr):
				t.Errorf("ResultErr = %v, want %v", err, st.wantErr)
			case st.wantErr != nil && (r.GetMessage() == "" || err.Error() != r.GetMessage()):
				t.Errorf("ResultErr message %q, Result.Message %q: want equal and non-empty", err, r.GetMessage())
			}
		})
	}
	if got, want := st.AppliedIndex(), uint64(len(steps)); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}

	// Timestamps come from the command, never from the clock.
	page, err := st.ListEvents(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		ID                        uint64
		Action                    store.Action
		ProcessedAt, OriginatedAt time.Time
	}
	var got []ev
	for _, e := range page.Events {
		got = append(got, ev{e.ID, e.Action, e.ProcessedAt, e.OriginatedAt})
	}
	var want []ev
	for _, w := range []struct {
		id uint64
		a  store.Action
	}{{1, store.ActionCreate}, {3, store.ActionUpdate}, {7, store.ActionDelete}, {8, store.ActionCreate}, {10, store.ActionUpdate}, {13, store.ActionDelete}} {
		want = append(want, ev{w.id, w.a, processedAt(w.id), originatedAt(w.id)})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	// Prune: the revision carries the number of events removed.
	r := asResult(t, f.Apply(entry(t, 17, mustCmd(t)(command.PruneEvents(processedAt(8))))))
	if got, want := r.GetRevision(), uint64(3); got != want {
		t.Errorf("prune Revision = %d, want %d (events 1, 3, 7)", got, want)
	}
	page, err = st.ListEvents(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := page.PrunedThrough, uint64(7); got != want {
		t.Errorf("PrunedThrough = %d, want %d", got, want)
	}
	if got, want := len(page.Events), 3; got != want {
		t.Errorf("%d events left, want %d", got, want)
	}
}

func TestPutPolicyStoresCommandFields(t *testing.T) {
	f, st := newFSM(t)
	in := pol("p", "acme", "deny")
	in.Labels = map[string]string{"tier": "prod"}
	in.Spec = json.RawMessage(`{"tool_name": "Bash", "action": "deny"}`)
	in.Revision, in.CreatedAt, in.UpdatedAt = 99, t0.Add(-time.Hour), t0.Add(-time.Hour)
	asResult(t, f.Apply(entry(t, 5, mustCmd(t)(command.PutPolicy(in, nil)))))
	asResult(t, f.Apply(entry(t, 6, mustCmd(t)(command.PutPolicy(in, nil)))))
	got, err := st.GetPolicy("p")
	if err != nil {
		t.Fatal(err)
	}
	want := &policy.Policy{
		Name: "p", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "acme"},
		Labels:   map[string]string{"tier": "prod"},
		Spec:     json.RawMessage(`{"action":"deny","tool_name":"Bash"}`),
		Revision: 6, CreatedAt: processedAt(5), UpdatedAt: processedAt(6),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stored policy (-want +got):\n%s", diff)
	}

	e := emp("alice", "acme")
	e.Revision, e.CreatedAt = 42, t0.Add(-time.Hour)
	asResult(t, f.Apply(entry(t, 7, mustCmd(t)(command.PutEmployee(e, nil)))))
	gotE, err := st.GetEmployee("alice")
	if err != nil {
		t.Fatal(err)
	}
	wantE := emp("alice", "acme")
	wantE.Revision, wantE.CreatedAt, wantE.UpdatedAt = 7, processedAt(7), processedAt(7)
	if diff := cmp.Diff(wantE, gotE); diff != "" {
		t.Errorf("stored employee (-want +got):\n%s", diff)
	}

	m := store.Member{ID: "n1", RaftAddr: "r", HTTPAddr: "h", GRPCAddr: "g"}
	asResult(t, f.Apply(entry(t, 8, mustCmd(t)(command.RegisterMember(m)))))
	if got, err := st.Member("n1"); err != nil || got != m {
		t.Errorf("Member(n1) = %+v, %v; want %+v", got, err, m)
	}
}

func TestResultErr(t *testing.T) {
	tests := []struct {
		name    string
		r       *commandv1.Result
		wantErr error
	}{
		{"success", &commandv1.Result{Index: 3, Revision: 3}, nil},
		{"not found", &commandv1.Result{Code: "not_found", Message: "policy \"x\": not found"}, store.ErrNotFound},
		{"conflict", &commandv1.Result{Code: "conflict", Message: "conflict"}, store.ErrConflict},
		{"invalid", &commandv1.Result{Code: "invalid", Message: "bad"}, command.ErrInvalidCommand},
		{"unknown code", &commandv1.Result{Code: "from-the-future", Message: "?"}, command.ErrInvalidCommand},
		{"nil result", nil, command.ErrInvalidCommand},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := command.ResultErr(tc.r)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("ResultErr = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ResultErr = %v, want %v", err, tc.wantErr)
			}
			if tc.r != nil && err.Error() != tc.r.GetMessage() {
				t.Errorf("message = %q, want %q", err, tc.r.GetMessage())
			}
			// Exactly one sentinel.
			for _, other := range []error{store.ErrNotFound, store.ErrConflict, command.ErrInvalidCommand} {
				if !errors.Is(other, tc.wantErr) && errors.Is(err, other) {
					t.Errorf("ResultErr also matches %v", other)
				}
			}
		})
	}
	// A Result survives the wire (a forwarded write) with its error.
	b, err := proto.Marshal(&commandv1.Result{Index: 9, Code: "conflict", Message: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var back commandv1.Result
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if err := command.ResultErr(&back); !errors.Is(err, store.ErrConflict) {
		t.Errorf("ResultErr after a round trip = %v, want ErrConflict", err)
	}
}

func TestApplyBatchIsOneTransaction(t *testing.T) {
	f, st := newFSM(t)
	sub := st.Subscribe()
	defer sub.Close()
	cmds := []*commandv1.Command{
		putPolicy(t, "a", "acme", nil),
		putPolicy(t, "b", "beta", nil),
		mustCmd(t)(command.PutEmployee(emp("alice", "acme"), nil)),
		mustCmd(t)(command.RegisterMember(store.Member{ID: "n1"})),
		mustCmd(t)(command.DeletePolicy("a", rev(1))),
	}
	var logs []*raft.Log
	for i, c := range cmds {
		logs = append(logs, entry(t, uint64(i+1), c))
	}
	rs := applyAll(t, f, logs...)
	for i, r := range rs {
		if got, want := r.GetIndex(), uint64(i+1); got != want {
			t.Errorf("result %d: Index = %d, want %d", i, got, want)
		}
		if err := command.ResultErr(r); err != nil {
			t.Errorf("result %d: %v", i, err)
		}
	}
	if got, want := st.AppliedIndex(), uint64(len(cmds)); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}
	select {
	case <-sub.Ready():
	default:
		t.Fatal("subscriber not signalled after ApplyBatch returned")
	}
	changes := sub.Next()
	if got, want := len(changes), 1; got != want {
		t.Fatalf("subscriber saw %d changes, want %d (one per batch): %+v", got, want, changes)
	}
	type ec struct {
		Type   store.EntityType
		ID     string
		Action store.Action
		Index  uint64
	}
	var got []ec
	for _, e := range changes[0].Entities {
		got = append(got, ec{e.Type, e.ID, e.Action, e.Index})
	}
	want := []ec{
		{store.EntityPolicy, "a", store.ActionCreate, 1},
		{store.EntityPolicy, "b", store.ActionCreate, 2},
		{store.EntityEmployee, "alice", store.ActionCreate, 3},
		{store.EntityMember, "n1", store.ActionUpdate, 4},
		{store.EntityPolicy, "a", store.ActionDelete, 5},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entity changes (-want +got):\n%s", diff)
	}
	if got, want := changes[0].Index, uint64(5); got != want || changes[0].Resync {
		t.Errorf("change Index = %d (resync %v), want %d", got, changes[0].Resync, want)
	}

	if out := f.ApplyBatch(nil); len(out) != 0 {
		t.Errorf("ApplyBatch(nil) = %v, want empty", out)
	}
}

func TestReplayAfterRestartSkipsApplied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st1, err := store.Open(path, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	f1 := New(st1, testLogger())
	var first []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		first = append(first, entry(t, i, putPolicy(t, fmt.Sprintf("p%02d", i), "acme", nil)))
	}
	applyAll(t, f1, first[:4]...)
	applyAll(t, f1, first[4:]...)
	before := digest(t, st1)
	if err := st1.Close(); err != nil {
		t.Fatal(err)
	}

	st2 := openStoreAt(t, path)
	if got, want := st2.AppliedIndex(), uint64(10); got != want {
		t.Fatalf("AppliedIndex after reopen = %d, want %d", got, want)
	}
	f2 := New(st2, testLogger())
	sub := st2.Subscribe()
	defer sub.Close()

	// Raft replays from the last snapshot: 1..10 again (here with different
	// payloads, to prove they are skipped), then the new 11 and 12.
	var replay []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		replay = append(replay, entry(t, i, putPolicy(t, fmt.Sprintf("other%02d", i), "beta", nil)))
	}
	// A batch entirely at or below the applied index changes nothing.
	for i, v := range f2.ApplyBatch(replay[:5]) {
		if v != nil {
			t.Errorf("replayed entry %d: result %v, want nil", i+1, v)
		}
	}
	if v := f2.Apply(replay[9]); v != nil {
		t.Errorf("replayed single entry 10: result %v, want nil", v)
	}
	if got := sub.Next(); got != nil {
		t.Errorf("replaying applied entries notified %+v", got)
	}
	if got := digest(t, st2); got != before {
		t.Error("replaying applied entries changed the state")
	}

	replay = append(replay,
		entry(t, 11, putPolicy(t, "q11", "acme", nil)),
		entry(t, 12, putPolicy(t, "q12", "acme", nil)))
	out := f2.ApplyBatch(replay)
	for i, v := range out {
		idx := uint64(i + 1)
		if idx <= 10 {
			if v != nil {
				t.Errorf("entry %d: result %v, want nil (skipped)", idx, v)
			}
			continue
		}
		r := asResult(t, v)
		if r.GetRevision() != idx || command.ResultErr(r) != nil {
			t.Errorf("entry %d: result %v, want revision %d", idx, r, idx)
		}
	}
	if got, want := st2.AppliedIndex(), uint64(12); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}
	list, err := st2.ListPolicies(store.PolicyFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list {
		names = append(names, p.Name)
		if strings.HasPrefix(p.Name, "p") && p.Revision > 10 {
			t.Errorf("policy %s rewritten at revision %d", p.Name, p.Revision)
		}
	}
	want := []string{"p01", "p02", "p03", "p04", "p05", "p06", "p07", "p08", "p09", "p10", "q11", "q12"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	changes := sub.Next()
	if len(changes) != 1 || len(changes[0].Entities) != 2 || changes[0].Entities[0].Index != 11 || changes[0].Entities[1].Index != 12 {
		t.Errorf("replay batch notified %+v, want one change with entities 11 and 12", changes)
	}
}

func TestNonCommandLogsAdvanceIndex(t *testing.T) {
	f, st := newFSM(t)
	garbage := []byte{0xff, 0x00, 0x13} // never decoded
	logs := []*raft.Log{
		entry(t, 1, putPolicy(t, "a", "acme", nil)),
		{Index: 2, Term: 1, Type: raft.LogConfiguration, Data: garbage},
		{Index: 3, Term: 1, Type: raft.LogNoop},
		entry(t, 4, putPolicy(t, "b", "acme", nil)),
		{Index: 5, Term: 1, Type: raft.LogBarrier, Data: garbage},
	}
	out := f.ApplyBatch(logs)
	for i, v := range out {
		isCmd := logs[i].Type == raft.LogCommand
		if isCmd {
			if r := asResult(t, v); r.GetIndex() != logs[i].Index {
				t.Errorf("entry %d: Index = %d", logs[i].Index, r.GetIndex())
			}
		} else if v != nil {
			t.Errorf("entry %d (%v): result %v, want nil", logs[i].Index, logs[i].Type, v)
		}
	}
	if got, want := st.AppliedIndex(), uint64(5); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}
	before := digest(t, st)

	if v := f.Apply(&raft.Log{Index: 6, Term: 2, Type: raft.LogNoop}); v != nil {
		t.Errorf("Apply(LogNoop) = %v, want nil", v)
	}
	if got, want := st.AppliedIndex(), uint64(6); got != want {
		t.Errorf("AppliedIndex after a no-op = %d, want %d", got, want)
	}
	f.ApplyBatch([]*raft.Log{{Index: 7, Term: 2, Type: raft.LogConfiguration, Data: garbage}})
	if got, want := st.AppliedIndex(), uint64(7); got != want {
		t.Errorf("AppliedIndex after a configuration entry = %d, want %d", got, want)
	}
	if got := digest(t, st); got != before {
		t.Error("non-command entries changed the state")
	}
}

func TestIgnorableUnknownTypeIsSkipped(t *testing.T) {
	for _, typ := range []command.Type{0xFE, command.IgnoreUnknown | command.TypePutPolicy, command.IgnoreUnknown} {
		t.Run(fmt.Sprintf("type 0x%02x", uint8(typ)), func(t *testing.T) {
			f, st := newFSM(t)
			applyAll(t, f, entry(t, 1, putPolicy(t, "a", "acme", nil)))
			before := digest(t, st)
			cmd := &commandv1.Command{Type: uint32(typ), Payload: []byte("\xffnot a proto message")}
			r := asResult(t, f.Apply(entry(t, 2, cmd)))
			if diff := cmp.Diff(&commandv1.Result{Index: 2}, r, protocmp.Transform()); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if err := command.ResultErr(r); err != nil {
				t.Errorf("ResultErr = %v, want nil", err)
			}
			if got, want := st.AppliedIndex(), uint64(2); got != want {
				t.Errorf("AppliedIndex = %d, want %d", got, want)
			}
			if got := digest(t, st); got != before {
				t.Error("an ignored entry changed the state")
			}
			if got := f.Skipped(); got != 1 {
				t.Errorf("Skipped = %d, want 1", got)
			}
		})
	}
}

// TestTypesUnique: no two command types share a number once the
// IgnoreUnknown bit is masked, so that no entry can mean one command to a
// node that knows it and another to a node that does not.
func TestTypesUnique(t *testing.T) {
	seen := map[command.Type]command.Type{}
	for typ := range knownTypes {
		n := typ &^ command.IgnoreUnknown
		if other, ok := seen[n]; ok {
			t.Errorf("types 0x%02x and 0x%02x share number %d", uint8(typ), uint8(other), n)
		}
		seen[n] = typ
		if n == 0 {
			t.Errorf("type 0x%02x has number 0, which an empty entry decodes as", uint8(typ))
		}
	}
}

func TestUndecodableEntriesPanic(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want string // in the panic message
	}{
		{"unknown type without the ignore flag", stamp(t, 3, &commandv1.Command{Type: 0x7E, Payload: []byte("x")}), "unknown command type 126"},
		{"type zero (empty entry)", nil, "unknown command type 0"},
		{"type wider than a byte", stamp(t, 3, &commandv1.Command{Type: 0x1FE}), "not a byte"},
		{"garbage envelope", []byte{0xff, 0xff, 0xff}, "decode command envelope"},
		{"undecodable payload", stamp(t, 3, &commandv1.Command{Type: uint32(command.TypePutPolicy), Payload: []byte{0xff}}), "decode *commandv1.PutPolicy"},
		{"payload of another message type", stamp(t, 3, &commandv1.Command{Type: uint32(command.TypePutPolicy), Payload: []byte{0x0a, 0x01, 'x'}}), "decode policy"},
		{"policy without a name", stamp(t, 3, mustCmd(t)(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`{"kind":"ToolPolicy"}`)}))), "empty name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, st := newFSM(t)
			applyAll(t, f, entry(t, 1, putPolicy(t, "kept", "acme", nil)))
			before := digest(t, st)
			sub := st.Subscribe()
			defer sub.Close()

			// A good entry before the bad one in the same batch is rolled
			// back with it: the whole transaction is abandoned.
			p := applyRecover(f, []*raft.Log{
				entry(t, 2, putPolicy(t, "lost", "acme", nil)),
				rawEntry(3, tc.data),
			})
			if p == nil {
				t.Fatal("ApplyBatch did not panic")
			}
			if msg := fmt.Sprint(p); !strings.Contains(msg, tc.want) || !strings.Contains(msg, "entry 3") {
				t.Errorf("panic %q, want it to name entry 3 and contain %q", msg, tc.want)
			}
			if got, want := st.AppliedIndex(), uint64(1); got != want {
				t.Errorf("AppliedIndex after the panic = %d, want %d", got, want)
			}
			if got := digest(t, st); got != before {
				t.Error("state changed by a batch that panicked")
			}
			if _, err := st.GetPolicy("lost"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("entry 2 of the panicked batch was stored: %v", err)
			}
			if got := sub.Next(); got != nil {
				t.Errorf("a panicked batch notified %+v", got)
			}
			// The store is still usable: the same batch without the bad
			// entry applies, and Close does not block.
			applyAll(t, f, entry(t, 2, putPolicy(t, "lost", "acme", nil)))
			if got, want := st.AppliedIndex(), uint64(2); got != want {
				t.Errorf("AppliedIndex = %d, want %d", got, want)
			}
			closeWithin(t, st)
		})
	}
}

func TestDecodeEntry(t *testing.T) {
	const idx = 42
	good := []struct {
		name string
		cmd  *commandv1.Command
	}{
		{"put policy", putPolicy(t, "p", "acme", nil)},
		{"put policy if-match", putPolicy(t, "p", "acme", rev(0))},
		{"delete policy", mustCmd(t)(command.DeletePolicy("p", rev(4)))},
		{"put employee", mustCmd(t)(command.PutEmployee(emp("alice", "acme"), nil))},
		{"delete employee", mustCmd(t)(command.DeleteEmployee("alice", nil))},
		{"register member", mustCmd(t)(command.RegisterMember(store.Member{ID: "n1", RaftAddr: "r"}))},
		{"remove member", mustCmd(t)(command.RemoveMember("n1"))},
		{"prune events", mustCmd(t)(command.PruneEvents(t0))},
		{"empty payload for a type whose fields are all optional", &commandv1.Command{Type: uint32(command.TypePruneEvents)}},
	}
	for _, tc := range good {
		t.Run("ok/"+tc.name, func(t *testing.T) {
			e, err := DecodeEntry(idx, stamp(t, idx, tc.cmd))
			if err != nil {
				t.Fatalf("DecodeEntry: %v", err)
			}
			want := store.Meta{Index: idx, ProcessedAt: processedAt(idx), OriginatedAt: originatedAt(idx)}
			if diff := cmp.Diff(want, e.Meta); diff != "" {
				t.Errorf("Meta (-want +got):\n%s", diff)
			}
			if got, want := e.Type, command.Type(tc.cmd.GetType()); got != want {
				t.Errorf("command.Type = %d, want %d", got, want)
			}
			if e.Apply == nil {
				t.Error("Apply is nil for a known type")
			}
		})
	}
	t.Run("ok/ignorable unknown type", func(t *testing.T) {
		e, err := DecodeEntry(idx, stamp(t, idx, &commandv1.Command{Type: 0xC0, Payload: []byte{0xff}}))
		if err != nil {
			t.Fatalf("DecodeEntry: %v", err)
		}
		if e.Type != 0xC0 || e.Apply != nil || e.Meta.Index != idx {
			t.Errorf("entry = %+v, want type 0xc0, index %d and no Apply", e, idx)
		}
	})
	t.Run("ok/zero timestamps", func(t *testing.T) {
		b, err := proto.Marshal(putPolicy(t, "p", "", nil))
		if err != nil {
			t.Fatal(err)
		}
		e, err := DecodeEntry(idx, b)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := e.Meta.ProcessedAt, time.Unix(0, 0).UTC(); !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("ProcessedAt = %v, want %v in UTC", got, want)
		}
	})

	badPayload := []byte{0xff} // a truncated tag: no message decodes it
	var bad = []struct {
		name string
		data []byte
		want string
	}{
		{"garbage envelope", []byte{0xff, 0xff}, "decode command envelope"},
		{"envelope with a truncated field", []byte{0x12, 0x05, 'a'}, "decode command envelope"},
		{"empty entry", nil, "unknown command type 0 "},
		{"unknown type", stamp(t, idx, &commandv1.Command{Type: 0x7F}), "unknown command type 127"},
		{"type wider than a byte", stamp(t, idx, &commandv1.Command{Type: 0x100 | uint32(command.TypePutPolicy)}), "not a byte"},
		{"put policy: bad JSON", stamp(t, idx, mustCmd(t)(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`{"name":`)}))), "decode policy"},
		{"put policy: JSON of the wrong shape", stamp(t, idx, mustCmd(t)(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`{"name":1}`)}))), "decode policy"},
		{"put policy: empty name", stamp(t, idx, mustCmd(t)(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`{}`)}))), "empty name"},
		{"put policy: null", stamp(t, idx, mustCmd(t)(command.New(&commandv1.PutPolicy{PolicyJson: []byte(`null`)}))), "empty name"},
		{"delete policy: empty name", stamp(t, idx, mustCmd(t)(command.DeletePolicy("", nil))), "empty name"},
		{"delete employee: oversize id", stamp(t, idx, mustCmd(t)(command.DeleteEmployee(strings.Repeat("e", command.MaxKeyLen+1), nil))), "more than"},
		{"remove member: empty id", stamp(t, idx, mustCmd(t)(command.RemoveMember(""))), "empty id"},
		{"put employee: bad JSON", stamp(t, idx, mustCmd(t)(command.New(&commandv1.PutEmployee{EmployeeJson: []byte(`[`)}))), "decode employee"},
		{"put employee: empty id", stamp(t, idx, mustCmd(t)(command.New(&commandv1.PutEmployee{EmployeeJson: []byte(`{"org":"acme"}`)}))), "empty id"},
		{"register member: empty id", stamp(t, idx, mustCmd(t)(command.RegisterMember(store.Member{RaftAddr: "r"}))), "empty id"},
		{"delete policy: invalid UTF-8 name", stamp(t, idx, &commandv1.Command{Type: uint32(command.TypeDeletePolicy), Payload: []byte{0x0a, 0x01, 0xff}}), "decode *commandv1.DeletePolicy"},
	}
	for typ := range knownTypes {
		bad = append(bad, struct {
			name string
			data []byte
			want string
		}{fmt.Sprintf("undecodable payload for type %d", typ), stamp(t, idx, &commandv1.Command{Type: uint32(typ), Payload: badPayload}), "decode *commandv1."})
	}
	for _, tc := range bad {
		t.Run("error/"+tc.name, func(t *testing.T) {
			e, err := DecodeEntry(idx, tc.data)
			if err == nil {
				t.Fatalf("DecodeEntry = %+v, want an error", e)
			}
			if e != nil {
				t.Errorf("DecodeEntry returned an entry with its error: %+v", e)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.HasPrefix(msg, "entry 42: ") {
				t.Errorf("error %q, want it to start with %q and contain %q", msg, "entry 42: ", tc.want)
			}
		})
	}
}

// mixedEntries is a run of every command type, with business errors mixed in.
func mixedEntries(t testing.TB) []*raft.Log {
	t.Helper()
	cmds := []*commandv1.Command{
		putPolicy(t, "global", "", nil),
		putPolicy(t, "acme.a", "acme", nil),
		mustCmd(t)(command.PutEmployee(emp("alice", "acme"), nil)),
		mustCmd(t)(command.RegisterMember(store.Member{ID: "n1", RaftAddr: "r1"})),
		putPolicy(t, "acme.a", "beta", rev(2)),
		putPolicy(t, "acme.a", "beta", rev(2)),        // conflict
		mustCmd(t)(command.DeletePolicy("nope", nil)), // not found
		mustCmd(t)(command.PutEmployee(emp("bob", "beta"), nil)),
		mustCmd(t)(command.DeleteEmployee("alice", nil)),
		mustCmd(t)(command.RegisterMember(store.Member{ID: "n2", RaftAddr: "r2"})),
		mustCmd(t)(command.RemoveMember("n1")),
		{Type: 0xFE}, // ignored
		mustCmd(t)(command.PruneEvents(processedAt(3))),
		putPolicy(t, "global", "", rev(1)),
		mustCmd(t)(command.DeletePolicy("acme.a", nil)),
	}
	var logs []*raft.Log
	for i, c := range cmds {
		logs = append(logs, entry(t, uint64(i+1), c))
	}
	return logs
}

func TestDeterministicAcrossBatching(t *testing.T) {
	logs := mixedEntries(t)
	one, stOne := newFSM(t)
	for _, l := range logs {
		one.Apply(l)
	}
	batched, stBatched := newFSM(t)
	for i := 0; i < len(logs); i += 4 {
		batched.ApplyBatch(logs[i:min(i+4, len(logs))])
	}
	if a, b := digest(t, stOne), digest(t, stBatched); a != b {
		t.Errorf("digest one by one %s, batched %s", a, b)
	}
	for _, st := range []*store.Store{stOne, stBatched} {
		if got, want := st.AppliedIndex(), uint64(len(logs)); got != want {
			t.Errorf("AppliedIndex = %d, want %d", got, want)
		}
	}
	ea, err := stOne.ListEvents(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	eb, err := stBatched.ListEvents(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ea, eb); diff != "" {
		t.Errorf("event logs differ (-one +batched):\n%s", diff)
	}
	id := policy.Identity{Org: "beta", Team: "platform", Employee: "bob"}
	sa, err := stOne.PolicySet(id)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := stBatched.PolicySet(id)
	if err != nil {
		t.Fatal(err)
	}
	if sa.Version != sb.Version {
		t.Errorf("policy-set versions differ: %s vs %s", sa.Version, sb.Version)
	}
}

// bufSink is a raft.SnapshotSink over a bytes.Buffer.
type bufSink struct {
	buf       bytes.Buffer
	writeErr  error
	closed    bool
	cancelled bool
}

var _ raft.SnapshotSink = (*bufSink)(nil)

func (s *bufSink) Write(p []byte) (int, error) {
	if s.writeErr != nil {
		return 0, s.writeErr
	}
	return s.buf.Write(p)
}
func (s *bufSink) Close() error  { s.closed = true; return nil }
func (s *bufSink) ID() string    { return "test-snapshot" }
func (s *bufSink) Cancel() error { s.cancelled = true; return nil }

// trackingReader records whether it was closed.
type trackingReader struct {
	io.Reader
	closed bool
}

func (r *trackingReader) Close() error { r.closed = true; return nil }

func TestSnapshotRestore(t *testing.T) {
	logs := mixedEntries(t)
	a, stA := newFSM(t)
	a.ApplyBatch(logs[:10])
	wantDigest := digest(t, stA)

	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	a.ApplyBatch(logs[10:]) // after the snapshot, before it is persisted
	sink := &bufSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	snap.Release()
	if !sink.closed || sink.cancelled {
		t.Errorf("sink closed %v, cancelled %v; want closed only", sink.closed, sink.cancelled)
	}

	// B has other state, at the same index.
	b, stB := newFSM(t)
	var other []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		other = append(other, entry(t, i, putPolicy(t, fmt.Sprintf("b%d", i), "zeta", nil)))
	}
	b.ApplyBatch(other)
	if digest(t, stB) == wantDigest {
		t.Fatal("test setup: B already equals A")
	}
	sub := stB.Subscribe()
	defer sub.Close()
	rc := &trackingReader{Reader: bytes.NewReader(sink.buf.Bytes())}
	if err := b.Restore(rc); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if !rc.closed {
		t.Error("Restore did not close its reader")
	}
	if got, want := stB.AppliedIndex(), uint64(10); got != want {
		t.Errorf("AppliedIndex after Restore = %d, want %d", got, want)
	}
	if got := digest(t, stB); got != wantDigest {
		t.Errorf("digest after Restore = %s, want A's at the snapshot %s", got, wantDigest)
	}
	if changes := sub.Next(); len(changes) != 1 || !changes[0].Resync || changes[0].Index != 10 {
		t.Errorf("subscriber after Restore got %+v, want one Resync at 10", changes)
	}

	// Raft then replays the log after the snapshot: B catches up with A.
	out := b.ApplyBatch(logs)
	for i, v := range out[:10] {
		if v != nil {
			t.Errorf("entry %d before the snapshot index: result %v, want nil", i+1, v)
		}
	}
	if a, b := digest(t, stA), digest(t, stB); a != b {
		t.Errorf("after replay: A %s, B %s", a, b)
	}

	// Restoring garbage fails, closes the reader and leaves B as it was.
	before := digest(t, stB)
	rc = &trackingReader{Reader: io.NopCloser(bytes.NewReader(bytes.Repeat([]byte{0xAB}, 8<<10)))}
	if err := b.Restore(rc); err == nil {
		t.Error("Restore of garbage succeeded")
	}
	if !rc.closed {
		t.Error("a failed Restore did not close its reader")
	}
	if got := digest(t, stB); got != before {
		t.Error("a failed Restore changed the state")
	}
	applyAll(t, b, entry(t, uint64(len(logs)+1), putPolicy(t, "after", "acme", nil)))
}

func TestPersistCancelsOnWriteError(t *testing.T) {
	f, _ := newFSM(t)
	applyAll(t, f, entry(t, 1, putPolicy(t, "p", "acme", nil)))
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	errDisk := errors.New("disk full")
	sink := &bufSink{writeErr: errDisk}
	// bbolt's WriteTo formats the cause with %s, so only the text survives.
	if err := snap.Persist(sink); err == nil || !strings.Contains(err.Error(), errDisk.Error()) {
		t.Errorf("Persist = %v, want an error containing %q", err, errDisk)
	}
	if !sink.cancelled || sink.closed {
		t.Errorf("sink cancelled %v, closed %v; want cancelled only", sink.cancelled, sink.closed)
	}
}

func TestSnapshotOfClosedStore(t *testing.T) {
	f, st := newFSM(t)
	closeWithin(t, st)
	if _, err := f.Snapshot(); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Snapshot of a closed store = %v, want ErrClosed", err)
	}
}

// TestPutPolicyStoresCanonical: a policy proposed with a non-canonical spec
// (keys unsorted, spaces, big integers) is stored canonical, because
// PutPolicy canonicalises it: policy-set versions then depend on content,
// not on how a client formatted it.
func TestPutPolicyStoresCanonical(t *testing.T) {
	f, st := newFSM(t)
	p := &policy.Policy{Name: "p", Kind: "RateLimit",
		Spec: json.RawMessage(`{ "z": 1, "a": {"y": [1.50, 2], "b": 12345678901234567890} }`)}
	cmd := mustCmd(t)(command.PutPolicy(p, nil))
	f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: stamp(t, 1, cmd)})
	got, err := st.GetPolicy("p")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":{"b":12345678901234567890,"y":[1.50,2]},"z":1}`; string(got.Spec) != want {
		t.Errorf("stored spec = %s, want %s", got.Spec, want)
	}
}

// knownTypes is every command type this node applies: commandv1.Body's
// fields.
var knownTypes = func() map[command.Type]bool {
	m := map[command.Type]bool{}
	fs := (&commandv1.Body{}).ProtoReflect().Descriptor().Oneofs().ByName("kind").Fields()
	for i := range fs.Len() {
		m[command.Type(fs.Get(i).Number())] = true
	}
	return m
}()

// withAudit is cmd with its actor and request id set.
func withAudit(cmd *commandv1.Command, actor, requestID string) *commandv1.Command {
	cmd.Actor, cmd.RequestId = actor, requestID
	return cmd
}

// TestEveryTypeApplies: prepare has a case for every field of
// commandv1.Body, so that no type the table names is one the FSM cannot
// apply. An empty payload may be refused, but not as an unknown type.
func TestEveryTypeApplies(t *testing.T) {
	for typ := range knownTypes {
		c, err := command.Decode(&commandv1.Command{Type: uint32(typ)})
		if err != nil {
			t.Fatalf("type 0x%02x: %v", uint8(typ), err)
		}
		if _, err := prepare(store.Meta{}, c); err != nil && strings.Contains(err.Error(), "has no apply") {
			t.Errorf("type 0x%02x: %v", uint8(typ), err)
		}
	}
}

// TestDecodedSkipsTheDecode: an entry whose bytes were recorded with
// Decoded applies the recorded command, not what the bytes decode to, and
// once forgotten the bytes are decoded again. Bytes that do not decode show
// which path ran.
func TestDecodedSkipsTheDecode(t *testing.T) {
	f, st := newFSM(t)
	c := mustTyped(t)(command.PutPolicy(pol("acme.recorded", "acme", "deny"), nil))
	c.ProcessedAtUnixNano = processedAt(1).UnixNano()
	garbage := []byte{0xff, 0xff, 0xff}
	forget := f.Decoded(garbage, c)
	if err := command.ResultErr(asResult(t, f.Apply(rawEntry(1, garbage)))); err != nil {
		t.Fatalf("apply of a recorded command: %v", err)
	}
	if _, err := st.GetPolicy("acme.recorded"); err != nil {
		t.Fatalf("the recorded command was not applied: %v", err)
	}

	// Applied, the record is gone: the same bytes are decoded, and refused.
	if got := applyRecover(f, []*raft.Log{rawEntry(2, garbage)}); got == nil {
		t.Error("the record was used twice")
	}
	forget() // a no-op now

	// Forgotten before it applies, likewise.
	f2, _ := newFSM(t)
	forget = f2.Decoded(garbage, c)
	forget()
	if got := applyRecover(f2, []*raft.Log{rawEntry(1, garbage)}); got == nil {
		t.Error("a forgotten record was used")
	}
}
