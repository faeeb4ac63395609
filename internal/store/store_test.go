package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// t0 is the base of every test timestamp; meta(i) is i seconds after it.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func meta(idx uint64) Meta {
	at := t0.Add(time.Duration(idx) * time.Second)
	return Meta{Index: idx, ProcessedAt: at, OriginatedAt: at.Add(-time.Millisecond)}
}

func rev(v uint64) *uint64 { return &v }

func testLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// openAt opens the store at path and closes it when the test ends.
func openAt(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path, testLogger())
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	t.Cleanup(func() { closeWithin(t, s) })
	return s
}

// closeWithin closes s, failing the test if Close blocks (a leaked lock)
// rather than hanging the test binary.
func closeWithin(t *testing.T, s *Store) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Close blocked for 5s: a lock is still held")
	}
}

// openStore opens a fresh store in a temporary directory.
func openStore(t *testing.T) *Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "state.db"))
}

// apply runs fn as the batch ending at last and fails the test on error.
func apply(t *testing.T, s *Store, last uint64, fn func(b *Batch) error) {
	t.Helper()
	if err := s.ApplyBatch(last, fn); err != nil {
		t.Fatalf("ApplyBatch(%d): %v", last, err)
	}
}

func pol(name string, sc policy.Scope, action string) *policy.Policy {
	return &policy.Policy{
		Name:  name,
		Kind:  policy.KindToolPolicy,
		Scope: sc,
		Spec:  json.RawMessage(`{"action":"` + action + `","tool_name":"Bash"}`), // canonical
	}
}

func emp(id, org, team string) *policy.Employee {
	return &policy.Employee{ID: id, Org: org, Team: team, Status: policy.StatusActive}
}

// putPolicy stores p in its own batch at idx and returns the stored policy.
func putPolicy(t *testing.T, s *Store, idx uint64, p *policy.Policy) *policy.Policy {
	t.Helper()
	var stored *policy.Policy
	apply(t, s, idx, func(b *Batch) error {
		var err error
		stored, _, err = b.PutPolicy(meta(idx), p, nil)
		return err
	})
	return stored
}

// putEmployee stores e in its own batch at idx.
func putEmployee(t *testing.T, s *Store, idx uint64, e *policy.Employee) *policy.Employee {
	t.Helper()
	var stored *policy.Employee
	apply(t, s, idx, func(b *Batch) error {
		var err error
		stored, _, err = b.PutEmployee(meta(idx), e, nil)
		return err
	})
	return stored
}

func digest(t *testing.T, s *Store) string {
	t.Helper()
	d, _, err := s.Digest()
	if err != nil {
		t.Fatalf("Digest: %v", err)
	}
	return d
}

func events(t *testing.T, s *Store, f EventFilter) *EventPage {
	t.Helper()
	page, err := s.ListEvents(f)
	if err != nil {
		t.Fatalf("ListEvents(%+v): %v", f, err)
	}
	return page
}

func eventIDs(evs []Event) []uint64 {
	ids := []uint64{}
	for _, ev := range evs {
		ids = append(ids, ev.ID)
	}
	return ids
}

func states(t *testing.T, s *Store) []EntityState {
	t.Helper()
	st, err := s.EntityStates()
	if err != nil {
		t.Fatalf("EntityStates: %v", err)
	}
	return st
}

func canonical(t *testing.T, p *policy.Policy) []byte {
	t.Helper()
	raw, err := p.Canonical()
	if err != nil {
		t.Fatalf("Canonical(%q): %v", p.Name, err)
	}
	return raw
}

// waitReady waits for a subscription's Ready signal, with a deadline.
func waitReady(t *testing.T, sub *Subscription) {
	t.Helper()
	select {
	case <-sub.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("subscription not ready after 5s")
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestOpenFresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "dir", "state.db")
	s := openAt(t, path)
	if got, want := s.AppliedIndex(), uint64(0); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}
	if got, want := s.Path(), path; got != want {
		t.Errorf("Path = %q, want %q", got, want)
	}
	ps, err := s.ListPolicies(PolicyFilter{})
	if err != nil || len(ps) != 0 {
		t.Errorf("ListPolicies = %v, %v; want none", ps, err)
	}
	page := events(t, s, EventFilter{})
	if diff := cmp.Diff(&EventPage{Events: []Event{}}, page); diff != "" {
		t.Errorf("ListEvents on a fresh store (-want +got):\n%s", diff)
	}
	set, err := s.PolicySet(policy.Identity{Org: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	empty := sha256.Sum256(nil)
	if got, want := set.Version, hex.EncodeToString(empty[:]); got != want {
		t.Errorf("empty PolicySet.Version = %s, want %s", got, want)
	}
	if _, idx, err := s.Digest(); err != nil || idx != 0 {
		t.Errorf("Digest index = %d, %v; want 0, nil", idx, err)
	}
}

func TestApplyBatchWritesEntityEventAndVersion(t *testing.T) {
	s := openStore(t)
	acme := policy.Scope{Org: "acme"}
	beta := policy.Scope{Org: "beta"}

	// 1: create a policy in acme.
	created := putPolicy(t, s, 1, pol("acme.deny-shell", acme, "deny"))
	wantCreated := pol("acme.deny-shell", acme, "deny")
	wantCreated.Revision, wantCreated.CreatedAt, wantCreated.UpdatedAt = 1, meta(1).ProcessedAt, meta(1).ProcessedAt
	if diff := cmp.Diff(wantCreated, created); diff != "" {
		t.Errorf("PutPolicy(create) returned (-want +got):\n%s", diff)
	}

	// 2: create an employee in acme.
	e := putEmployee(t, s, 2, emp("alice", "acme", "platform"))
	if got, want := e.Revision, uint64(2); got != want {
		t.Errorf("employee revision = %d, want %d", got, want)
	}

	// 3: update the policy and move it from acme to beta. Client-set
	// server-managed fields are ignored.
	upd := pol("acme.deny-shell", beta, "audit")
	upd.Revision, upd.CreatedAt = 999, t0.Add(-time.Hour)
	updated := putPolicy(t, s, 3, upd)
	wantUpdated := pol("acme.deny-shell", beta, "audit")
	wantUpdated.Revision, wantUpdated.CreatedAt, wantUpdated.UpdatedAt = 3, meta(1).ProcessedAt, meta(3).ProcessedAt
	if diff := cmp.Diff(wantUpdated, updated); diff != "" {
		t.Errorf("PutPolicy(update) returned (-want +got):\n%s", diff)
	}
	got, err := s.GetPolicy("acme.deny-shell")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantUpdated, got); diff != "" {
		t.Errorf("GetPolicy after update (-want +got):\n%s", diff)
	}

	// 4: delete it.
	apply(t, s, 4, func(b *Batch) error { return b.DeletePolicy(meta(4), "acme.deny-shell", nil) })
	if _, err := s.GetPolicy("acme.deny-shell"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetPolicy after delete: err = %v, want ErrNotFound", err)
	}
	if got, want := s.AppliedIndex(), uint64(4); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}

	// The event log holds one event per change, ID = index, with the
	// entity's stored bytes.
	type evSummary struct {
		ID           uint64
		Type         EntityType
		Org          string
		Action       Action
		EntityID     string
		OriginatedAt time.Time
		ProcessedAt  time.Time
	}
	page := events(t, s, EventFilter{})
	var gotEv []evSummary
	for _, ev := range page.Events {
		gotEv = append(gotEv, evSummary{ev.ID, ev.EntityType, ev.Org, ev.Action, ev.EntityID, ev.OriginatedAt, ev.ProcessedAt})
	}
	wantEv := []evSummary{
		{1, EntityPolicy, "acme", ActionCreate, "acme.deny-shell", meta(1).OriginatedAt, meta(1).ProcessedAt},
		{2, EntityEmployee, "acme", ActionCreate, "alice", meta(2).OriginatedAt, meta(2).ProcessedAt},
		{3, EntityPolicy, "beta", ActionUpdate, "acme.deny-shell", meta(3).OriginatedAt, meta(3).ProcessedAt},
		{4, EntityPolicy, "beta", ActionDelete, "acme.deny-shell", meta(4).OriginatedAt, meta(4).ProcessedAt},
	}
	if diff := cmp.Diff(wantEv, gotEv); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if len(page.Events) == 4 {
		wantData := [][]byte{canonical(t, created), nil, canonical(t, updated), canonical(t, updated)}
		for i, want := range wantData {
			if want == nil {
				continue
			}
			if got := page.Events[i].Data; !bytes.Equal(got, want) {
				t.Errorf("event %d data = %s, want %s", page.Events[i].ID, got, want)
			}
		}
		var ge policy.Employee
		if err := json.Unmarshal(page.Events[1].Data, &ge); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(e, &ge); diff != "" {
			t.Errorf("employee event data (-want +got):\n%s", diff)
		}
	}

	// Entity-state versions per (type, org): the move touched both orgs.
	wantStates := []EntityState{
		{EntityType: EntityEmployee, Org: "acme", Version: 2, UpdatedAt: meta(2).ProcessedAt},
		{EntityType: EntityPolicy, Org: "acme", Version: 3, UpdatedAt: meta(3).ProcessedAt},
		{EntityType: EntityPolicy, Org: "beta", Version: 4, UpdatedAt: meta(4).ProcessedAt},
	}
	if diff := cmp.Diff(wantStates, states(t, s)); diff != "" {
		t.Errorf("EntityStates (-want +got):\n%s", diff)
	}
}

func TestApplyBatchEmployeesAndMembers(t *testing.T) {
	s := openStore(t)
	putEmployee(t, s, 1, emp("alice", "acme", "platform"))
	upd := emp("alice", "acme", "security")
	upd.Status = policy.StatusInactive
	got := putEmployee(t, s, 2, upd)
	want := emp("alice", "acme", "security")
	want.Status, want.Revision, want.CreatedAt, want.UpdatedAt = policy.StatusInactive, 2, meta(1).ProcessedAt, meta(2).ProcessedAt
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PutEmployee(update) (-want +got):\n%s", diff)
	}
	if got, err := s.GetEmployee("alice"); err != nil || !cmp.Equal(want, got) {
		t.Errorf("GetEmployee = %+v, %v; want %+v", got, err, want)
	}
	putEmployee(t, s, 3, emp("bob", "beta", ""))
	list, err := s.ListEmployees("acme", "")
	if err != nil || len(list) != 1 || list[0].ID != "alice" {
		t.Errorf("ListEmployees(acme) = %v, %v; want [alice]", list, err)
	}
	apply(t, s, 4, func(b *Batch) error { return b.DeleteEmployee(meta(4), "alice", rev(2)) })
	if _, err := s.GetEmployee("alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetEmployee after delete: %v, want ErrNotFound", err)
	}

	m := Member{ID: "n1", RaftAddr: "10.0.0.1:7000", HTTPAddr: "10.0.0.1:8080", GRPCAddr: "10.0.0.1:9090"}
	apply(t, s, 5, func(b *Batch) error { return b.PutMember(meta(5), m) })
	if got, err := s.Member("n1"); err != nil || got != m {
		t.Errorf("Member(n1) = %+v, %v; want %+v", got, err, m)
	}
	apply(t, s, 6, func(b *Batch) error { return b.DeleteMember(meta(6), "n1") })
	if _, err := s.Member("n1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Member after delete: %v, want ErrNotFound", err)
	}
	// Members are not tenant state: no events for them.
	if got, want := eventIDs(events(t, s, EventFilter{}).Events), []uint64{1, 2, 3, 4}; !cmp.Equal(got, want) {
		t.Errorf("event IDs = %v, want %v", got, want)
	}
}

func TestCompareAndSet(t *testing.T) {
	tests := []struct {
		name    string
		entity  EntityType // EntityPolicy or EntityEmployee
		delete  bool
		exists  bool // created at index 1 (revision 1) first
		ifMatch *uint64
		wantErr error
	}{
		{name: "put/nil/absent", entity: EntityPolicy},
		{name: "put/nil/exists", entity: EntityPolicy, exists: true},
		{name: "put/0/absent", entity: EntityPolicy, ifMatch: rev(0)},
		{name: "put/0/exists", entity: EntityPolicy, exists: true, ifMatch: rev(0), wantErr: ErrConflict},
		{name: "put/match/exists", entity: EntityPolicy, exists: true, ifMatch: rev(1)},
		{name: "put/mismatch/exists", entity: EntityPolicy, exists: true, ifMatch: rev(7), wantErr: ErrConflict},
		{name: "put/rev/absent", entity: EntityPolicy, ifMatch: rev(1), wantErr: ErrConflict},
		{name: "delete/nil/absent", entity: EntityPolicy, delete: true, wantErr: ErrNotFound},
		{name: "delete/0/absent", entity: EntityPolicy, delete: true, ifMatch: rev(0), wantErr: ErrNotFound},
		{name: "delete/rev/absent", entity: EntityPolicy, delete: true, ifMatch: rev(1), wantErr: ErrNotFound},
		{name: "delete/nil/exists", entity: EntityPolicy, delete: true, exists: true},
		{name: "delete/match/exists", entity: EntityPolicy, delete: true, exists: true, ifMatch: rev(1)},
		{name: "delete/mismatch/exists", entity: EntityPolicy, delete: true, exists: true, ifMatch: rev(7), wantErr: ErrConflict},
		{name: "delete/0/exists", entity: EntityPolicy, delete: true, exists: true, ifMatch: rev(0), wantErr: ErrConflict},
		{name: "employee put/0/exists", entity: EntityEmployee, exists: true, ifMatch: rev(0), wantErr: ErrConflict},
		{name: "employee put/match/exists", entity: EntityEmployee, exists: true, ifMatch: rev(1)},
		{name: "employee put/mismatch/exists", entity: EntityEmployee, exists: true, ifMatch: rev(2), wantErr: ErrConflict},
		{name: "employee put/rev/absent", entity: EntityEmployee, ifMatch: rev(1), wantErr: ErrConflict},
		{name: "employee put/0/absent", entity: EntityEmployee, ifMatch: rev(0)},
		{name: "employee delete/nil/absent", entity: EntityEmployee, delete: true, wantErr: ErrNotFound},
		{name: "employee delete/match/exists", entity: EntityEmployee, delete: true, exists: true, ifMatch: rev(1)},
		{name: "employee delete/mismatch/exists", entity: EntityEmployee, delete: true, exists: true, ifMatch: rev(3), wantErr: ErrConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			if tc.exists {
				if tc.entity == EntityPolicy {
					putPolicy(t, s, 1, pol("p", policy.Scope{Org: "acme"}, "deny"))
				} else {
					putEmployee(t, s, 1, emp("alice", "acme", "platform"))
				}
			}
			beforeDigest := digest(t, s)
			beforeEvents := events(t, s, EventFilter{})
			beforeStates := states(t, s)
			sub := s.Subscribe()
			defer sub.Close()

			var opErr error
			apply(t, s, 2, func(b *Batch) error {
				switch {
				case tc.entity == EntityPolicy && !tc.delete:
					_, _, opErr = b.PutPolicy(meta(2), pol("p", policy.Scope{Org: "beta"}, "audit"), tc.ifMatch)
				case tc.entity == EntityPolicy:
					opErr = b.DeletePolicy(meta(2), "p", tc.ifMatch)
				case !tc.delete:
					_, _, opErr = b.PutEmployee(meta(2), emp("alice", "beta", "x"), tc.ifMatch)
				default:
					opErr = b.DeleteEmployee(meta(2), "alice", tc.ifMatch)
				}
				return nil // business errors do not abort the batch
			})
			if tc.wantErr == nil {
				if opErr != nil {
					t.Fatalf("err = %v, want nil", opErr)
				}
				if got, want := len(events(t, s, EventFilter{}).Events), len(beforeEvents.Events)+1; got != want {
					t.Errorf("events = %d, want %d", got, want)
				}
				if digest(t, s) == beforeDigest {
					t.Error("digest unchanged after a successful write")
				}
				return
			}
			if !errors.Is(opErr, tc.wantErr) {
				t.Fatalf("err = %v, want %v", opErr, tc.wantErr)
			}
			// A failed precondition writes nothing.
			if got := digest(t, s); got != beforeDigest {
				t.Errorf("digest changed after a failed precondition")
			}
			if diff := cmp.Diff(beforeEvents.Events, events(t, s, EventFilter{}).Events); diff != "" {
				t.Errorf("events changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(beforeStates, states(t, s)); diff != "" {
				t.Errorf("entity states changed (-before +after):\n%s", diff)
			}
			// The batch still commits (the applied index advances) but
			// notifies no entity change.
			if got, want := s.AppliedIndex(), uint64(2); got != want {
				t.Errorf("AppliedIndex = %d, want %d", got, want)
			}
			if diff := cmp.Diff([]Change{{Index: 2}}, sub.Next(), ignoreChangeTime); diff != "" {
				t.Errorf("notified changes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReopenKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	putPolicy(t, s, 1, pol("g", policy.Scope{}, "deny"))
	putEmployee(t, s, 2, emp("alice", "acme", "platform"))
	apply(t, s, 5, func(b *Batch) error { return b.PutMember(meta(5), Member{ID: "n1", RaftAddr: "a:1"}) })
	wantDigest := digest(t, s)
	wantEvents := events(t, s, EventFilter{})
	wantPolicies, err := s.ListPolicies(PolicyFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}

	s2 := openAt(t, path)
	if got, want := s2.AppliedIndex(), uint64(5); got != want {
		t.Errorf("AppliedIndex after reopen = %d, want %d", got, want)
	}
	if got := digest(t, s2); got != wantDigest {
		t.Errorf("digest after reopen = %s, want %s", got, wantDigest)
	}
	if diff := cmp.Diff(wantEvents, events(t, s2, EventFilter{})); diff != "" {
		t.Errorf("events after reopen (-want +got):\n%s", diff)
	}
	gotPolicies, err := s2.ListPolicies(PolicyFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantPolicies, gotPolicies); diff != "" {
		t.Errorf("policies after reopen (-want +got):\n%s", diff)
	}
}

func TestApplyBatchErrorRollsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	putPolicy(t, s, 1, pol("kept", policy.Scope{}, "deny"))
	before := digest(t, s)
	sub := s.Subscribe()

	errBoom := errors.New("boom")
	err = s.ApplyBatch(2, func(b *Batch) error {
		if _, _, err := b.PutPolicy(meta(2), pol("lost", policy.Scope{Org: "acme"}, "deny"), nil); err != nil {
			return err
		}
		if _, err := b.PruneEvents(t0.Add(time.Hour)); err != nil {
			return err
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("ApplyBatch err = %v, want %v", err, errBoom)
	}
	if got, want := s.AppliedIndex(), uint64(1); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}
	if _, err := s.GetPolicy("lost"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetPolicy(lost) err = %v, want ErrNotFound", err)
	}
	if got := digest(t, s); got != before {
		t.Error("digest changed after a failed batch")
	}
	if got := sub.Next(); got != nil {
		t.Errorf("a failed batch notified %+v", got)
	}
	if got := events(t, s, EventFilter{}); len(got.Events) != 1 || got.PrunedThrough != 0 {
		t.Errorf("events after failed batch = %+v, want the one event and nothing pruned", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openAt(t, path)
	if got, want := s2.AppliedIndex(), uint64(1); got != want {
		t.Errorf("AppliedIndex on disk = %d, want %d", got, want)
	}
}

func TestApplyBatchPanicReleasesStore(t *testing.T) {
	s := openStore(t)
	putPolicy(t, s, 1, pol("kept", policy.Scope{}, "deny"))
	before := digest(t, s)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("ApplyBatch did not propagate the panic")
			}
		}()
		_ = s.ApplyBatch(2, func(b *Batch) error {
			if _, _, err := b.PutPolicy(meta(2), pol("lost", policy.Scope{}, "deny"), nil); err != nil {
				return err
			}
			panic("undecodable entry")
		})
	}()
	if got, want := s.AppliedIndex(), uint64(1); got != want {
		t.Errorf("AppliedIndex = %d, want %d", got, want)
	}
	if got := digest(t, s); got != before {
		t.Error("a panicked batch changed the state")
	}
	// Close takes the store's write lock: it must not block.
	closeWithin(t, s)
}

func TestClosedStore(t *testing.T) {
	s := openStore(t)
	putPolicy(t, s, 1, pol("p", policy.Scope{}, "deny"))
	var snap bytes.Buffer
	sn, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sn.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	sn.Release()
	sn.Release() // safe twice
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyBatch(2, func(*Batch) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("ApplyBatch after Close: %v, want ErrClosed", err)
	}
	if _, err := s.GetPolicy("p"); !errors.Is(err, ErrClosed) {
		t.Errorf("GetPolicy after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Snapshot(); !errors.Is(err, ErrClosed) {
		t.Errorf("Snapshot after Close: %v, want ErrClosed", err)
	}
	if err := s.Restore(&snap); !errors.Is(err, ErrClosed) {
		t.Errorf("Restore after Close: %v, want ErrClosed", err)
	}
	if _, err := os.Stat(s.Path() + ".restore"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("restore temp file left behind: %v", err)
	}
}

func TestPolicySetApplicability(t *testing.T) {
	s := openStore(t)
	all := []*policy.Policy{
		pol("global", policy.Scope{}, "deny"),
		pol("org.acme", policy.Scope{Org: "acme"}, "deny"),
		pol("org.beta", policy.Scope{Org: "beta"}, "deny"),
		pol("team.acme.platform", policy.Scope{Org: "acme", Team: "platform"}, "deny"),
		pol("team.acme.security", policy.Scope{Org: "acme", Team: "security"}, "deny"),
		pol("team.beta.platform", policy.Scope{Org: "beta", Team: "platform"}, "deny"),
		pol("emp.acme.alice", policy.Scope{Org: "acme", Employee: "alice"}, "deny"),
		pol("emp.acme.platform.bob", policy.Scope{Org: "acme", Team: "platform", Employee: "bob"}, "deny"),
	}
	stored := map[string]*policy.Policy{}
	// Insert out of name order: the set is sorted by name regardless.
	for i, j := range []int{5, 1, 7, 0, 3, 6, 2, 4} {
		p := putPolicy(t, s, uint64(i+1), all[j])
		stored[p.Name] = p
	}

	tests := []struct {
		name string
		id   policy.Identity
		want []string
	}{
		{"alice in acme/platform", policy.Identity{Org: "acme", Team: "platform", Employee: "alice"},
			[]string{"emp.acme.alice", "global", "org.acme", "team.acme.platform"}},
		{"bob in acme/platform", policy.Identity{Org: "acme", Team: "platform", Employee: "bob"},
			[]string{"emp.acme.platform.bob", "global", "org.acme", "team.acme.platform"}},
		{"bob in acme/security", policy.Identity{Org: "acme", Team: "security", Employee: "bob"},
			[]string{"global", "org.acme", "team.acme.security"}},
		{"carol in beta/platform", policy.Identity{Org: "beta", Team: "platform", Employee: "carol"},
			[]string{"global", "org.beta", "team.beta.platform"}},
		{"org only", policy.Identity{Org: "acme"}, []string{"global", "org.acme"}},
		{"unknown org", policy.Identity{Org: "zeta", Team: "platform", Employee: "alice"}, []string{"global"}},
		{"global identity", policy.Identity{}, []string{"global"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			set, err := s.PolicySet(tc.id)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range set.Policies {
				names = append(names, p.Name)
			}
			if diff := cmp.Diff(tc.want, names); diff != "" {
				t.Errorf("applicable policies (-want +got):\n%s", diff)
			}
			if got, want := set.Version, wantVersion(t, stored, tc.want); got != want {
				t.Errorf("Version = %s, want %s", got, want)
			}
			if got, want := set.Index, uint64(len(all)); got != want {
				t.Errorf("Index = %d, want %d", got, want)
			}
			if diff := cmp.Diff(tc.id, set.Identity); diff != "" {
				t.Errorf("Identity (-want +got):\n%s", diff)
			}
			// ListPolicies with the same identity agrees.
			id := tc.id
			list, err := s.ListPolicies(PolicyFilter{Identity: &id})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(set.Policies, list); diff != "" {
				t.Errorf("ListPolicies(identity) differs from PolicySet (-set +list):\n%s", diff)
			}
		})
	}

	if list, err := s.ListPolicies(PolicyFilter{Kind: "Nope"}); err != nil || len(list) != 0 {
		t.Errorf("ListPolicies(kind Nope) = %v, %v; want none", list, err)
	}
	if list, err := s.ListPolicies(PolicyFilter{Kind: policy.KindToolPolicy}); err != nil || len(list) != len(all) {
		t.Errorf("ListPolicies(kind ToolPolicy) = %d policies, %v; want %d", len(list), err, len(all))
	}
}

// wantVersion computes a policy-set version independently of the store:
// SHA-256 over the names in order, each followed by its canonical bytes.
func wantVersion(t *testing.T, stored map[string]*policy.Policy, names []string) string {
	t.Helper()
	names = append([]string(nil), names...)
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		h.Write([]byte(n))
		h.Write(canonical(t, stored[n]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestPolicySetVersion(t *testing.T) {
	acmeID := policy.Identity{Org: "acme", Team: "platform", Employee: "alice"}
	betaID := policy.Identity{Org: "beta", Team: "platform", Employee: "bob"}

	// Two stores fed the same batches agree on versions and digest.
	a, b := openStore(t), openStore(t)
	feed := func(s *Store) {
		apply(t, s, 3, func(bt *Batch) error {
			for i, p := range []*policy.Policy{
				pol("global", policy.Scope{}, "deny"),
				pol("org.acme", policy.Scope{Org: "acme"}, "deny"),
				pol("org.beta", policy.Scope{Org: "beta"}, "deny"),
			} {
				if _, _, err := bt.PutPolicy(meta(uint64(i+1)), p, nil); err != nil {
					return err
				}
			}
			return nil
		})
	}
	feed(a)
	feed(b)
	version := func(s *Store, id policy.Identity) string {
		t.Helper()
		set, err := s.PolicySet(id)
		if err != nil {
			t.Fatal(err)
		}
		return set.Version
	}
	if va, vb := version(a, acmeID), version(b, acmeID); va != vb {
		t.Errorf("versions differ between stores: %s vs %s", va, vb)
	}
	if da, db := digest(t, a), digest(t, b); da != db {
		t.Errorf("digests differ between stores: %s vs %s", da, db)
	}
	// The version is taken from the stored bytes, exactly as documented.
	var raw []byte
	if err := a.db.View(func(tx *bolt.Tx) error {
		h := sha256.New()
		for _, n := range []string{"global", "org.acme"} {
			h.Write([]byte(n))
			h.Write(tx.Bucket(bucketPolicies).Get([]byte(n)))
		}
		raw = h.Sum(nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := version(a, acmeID), hex.EncodeToString(raw); got != want {
		t.Errorf("Version = %s, want sha256 over stored bytes %s", got, want)
	}

	// Each step changes (or keeps) the acme and beta versions.
	steps := []struct {
		name                 string
		fn                   func(bt *Batch, m Meta) error
		acmeChange, betaChng bool
	}{
		{"update applicable org policy", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutPolicy(m, pol("org.acme", policy.Scope{Org: "acme"}, "audit"), nil)
			return err
		}, true, false},
		{"rewrite identical content", func(bt *Batch, m Meta) error {
			// Same content, but the revision and updated_at change: the
			// stored bytes differ, so the version does too.
			_, _, err := bt.PutPolicy(m, pol("org.acme", policy.Scope{Org: "acme"}, "audit"), nil)
			return err
		}, true, false},
		{"add non-applicable policy", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutPolicy(m, pol("team.acme.security", policy.Scope{Org: "acme", Team: "security"}, "deny"), nil)
			return err
		}, false, false},
		{"update non-applicable policy", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutPolicy(m, pol("team.acme.security", policy.Scope{Org: "acme", Team: "security"}, "allow"), nil)
			return err
		}, false, false},
		{"add employee", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutEmployee(m, emp("alice", "acme", "platform"), nil)
			return err
		}, false, false},
		{"update global policy", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutPolicy(m, pol("global", policy.Scope{}, "audit"), nil)
			return err
		}, true, true},
		{"move policy into the identity's scope", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutPolicy(m, pol("team.acme.security", policy.Scope{Org: "acme", Team: "platform"}, "allow"), nil)
			return err
		}, true, false},
		{"delete beta policy", func(bt *Batch, m Meta) error { return bt.DeletePolicy(m, "org.beta", nil) }, false, true},
		{"delete applicable policy", func(bt *Batch, m Meta) error { return bt.DeletePolicy(m, "org.acme", nil) }, true, false},
	}
	idx := uint64(3)
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			acmeBefore, betaBefore := version(a, acmeID), version(a, betaID)
			idx++
			for _, s := range []*Store{a, b} {
				apply(t, s, idx, func(bt *Batch) error { return st.fn(bt, meta(idx)) })
			}
			if got := version(a, acmeID) != acmeBefore; got != st.acmeChange {
				t.Errorf("acme version changed = %v, want %v", got, st.acmeChange)
			}
			if got := version(a, betaID) != betaBefore; got != st.betaChng {
				t.Errorf("beta version changed = %v, want %v", got, st.betaChng)
			}
			if va, vb := version(a, acmeID), version(b, acmeID); va != vb {
				t.Errorf("stores disagree on the acme version: %s vs %s", va, vb)
			}
			if da, db := digest(t, a), digest(t, b); da != db {
				t.Errorf("stores disagree on the digest: %s vs %s", da, db)
			}
		})
	}
}

func TestListEvents(t *testing.T) {
	s := openStore(t)
	// Two batches, several events each.
	apply(t, s, 3, func(b *Batch) error {
		if _, _, err := b.PutPolicy(meta(1), pol("g", policy.Scope{}, "deny"), nil); err != nil {
			return err
		}
		if _, _, err := b.PutPolicy(meta(2), pol("a", policy.Scope{Org: "acme"}, "deny"), nil); err != nil {
			return err
		}
		_, _, err := b.PutEmployee(meta(3), emp("alice", "acme", "platform"), nil)
		return err
	})
	apply(t, s, 6, func(b *Batch) error {
		if _, _, err := b.PutPolicy(meta(4), pol("b", policy.Scope{Org: "beta"}, "deny"), nil); err != nil {
			return err
		}
		if _, _, err := b.PutEmployee(meta(5), emp("bob", "beta", ""), nil); err != nil {
			return err
		}
		_, _, err := b.PutPolicy(meta(6), pol("a", policy.Scope{Org: "acme"}, "audit"), nil)
		return err
	})

	tests := []struct {
		name       string
		f          EventFilter
		wantIDs    []uint64
		wantLastID uint64
	}{
		{"all", EventFilter{}, []uint64{1, 2, 3, 4, 5, 6}, 6},
		{"type policy", EventFilter{Type: EntityPolicy}, []uint64{1, 2, 4, 6}, 6},
		{"type employee", EventFilter{Type: EntityEmployee}, []uint64{3, 5}, 6},
		{"type drift", EventFilter{Type: EntityDrift}, []uint64{}, 6},
		{"org acme", EventFilter{Org: "acme"}, []uint64{2, 3, 6}, 6},
		{"org acme type policy", EventFilter{Org: "acme", Type: EntityPolicy}, []uint64{2, 6}, 6},
		{"global org with OrgSet", EventFilter{Org: "", OrgSet: true}, []uint64{1}, 6},
		{"empty org without OrgSet is any org", EventFilter{Org: ""}, []uint64{1, 2, 3, 4, 5, 6}, 6},
		{"after 3", EventFilter{After: 3}, []uint64{4, 5, 6}, 6},
		{"after 6", EventFilter{After: 6}, []uint64{}, 6},
		{"after beyond the end", EventFilter{After: 100}, []uint64{}, 100},
		{"after max uint64", EventFilter{After: math.MaxUint64}, []uint64{}, math.MaxUint64},
		{"limit 2", EventFilter{Limit: 2}, []uint64{1, 2}, 2},
		{"limit 2 after 2", EventFilter{Limit: 2, After: 2}, []uint64{3, 4}, 4},
		{"limit with filter stops at the last match", EventFilter{Type: EntityEmployee, Limit: 1}, []uint64{3}, 3},
		{"limit with filter, next page", EventFilter{Type: EntityEmployee, Limit: 1, After: 3}, []uint64{5}, 5},
		{"limit with filter, last page", EventFilter{Type: EntityEmployee, Limit: 1, After: 5}, []uint64{}, 6},
		{"limit larger than matches", EventFilter{Org: "beta", Limit: 10}, []uint64{4, 5}, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			page := events(t, s, tc.f)
			if diff := cmp.Diff(tc.wantIDs, eventIDs(page.Events)); diff != "" {
				t.Errorf("event IDs (-want +got):\n%s", diff)
			}
			if got, want := page.LastID, tc.wantLastID; got != want {
				t.Errorf("LastID = %d, want %d", got, want)
			}
			for _, ev := range page.Events {
				if (tc.f.Type != "" && ev.EntityType != tc.f.Type) || ((tc.f.OrgSet || tc.f.Org != "") && ev.Org != tc.f.Org) {
					t.Errorf("event %d (%s, org %q) does not match the filter", ev.ID, ev.EntityType, ev.Org)
				}
			}
		})
	}
}

// writeEvents writes one employee event per index in [from, to], with
// processed time at(i), in batches of at most per entries.
func writeEvents(t *testing.T, s *Store, from, to uint64, per int, at func(i uint64) time.Time) {
	t.Helper()
	for start := from; start <= to; start += uint64(per) {
		end := min(start+uint64(per)-1, to)
		apply(t, s, end, func(b *Batch) error {
			for i := start; i <= end; i++ {
				m := Meta{Index: i, ProcessedAt: at(i), OriginatedAt: at(i)}
				if _, _, err := b.PutEmployee(m, emp("e", "acme", ""), nil); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

func prune(t *testing.T, s *Store, idx uint64, cutoff time.Time) int {
	t.Helper()
	var n int
	apply(t, s, idx, func(b *Batch) error {
		var err error
		n, err = b.PruneEvents(cutoff)
		return err
	})
	return n
}

func TestPruneEvents(t *testing.T) {
	s := openStore(t)
	// Event 4 is stamped earlier than events 1–3 (a clock step between
	// leaders): pruning stops at event 3 and does not reach it.
	at := func(i uint64) time.Time {
		if i == 4 {
			return t0.Add(-time.Hour)
		}
		return meta(i).ProcessedAt
	}
	writeEvents(t, s, 1, 6, 6, at)

	tests := []struct {
		name          string
		cutoff        time.Time
		wantN         int
		wantIDs       []uint64
		wantPrunedThr uint64
	}{
		{"cutoff before everything", t0.Add(-2 * time.Hour), 0, []uint64{1, 2, 3, 4, 5, 6}, 0},
		{"cutoff equal to the first event keeps it", meta(1).ProcessedAt, 0, []uint64{1, 2, 3, 4, 5, 6}, 0},
		{"oldest first, stops at the first newer", meta(3).ProcessedAt, 2, []uint64{3, 4, 5, 6}, 2},
		{"same cutoff again prunes nothing", meta(3).ProcessedAt, 0, []uint64{3, 4, 5, 6}, 2},
		{"passes the out-of-order event once it is first", meta(5).ProcessedAt.Add(time.Nanosecond), 3, []uint64{6}, 5},
		{"everything", t0.Add(24 * time.Hour), 1, []uint64{}, 6},
		{"empty log", t0.Add(24 * time.Hour), 0, []uint64{}, 6},
	}
	idx := uint64(6)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			idx++
			if got, want := prune(t, s, idx, tc.cutoff), tc.wantN; got != want {
				t.Errorf("pruned %d, want %d", got, want)
			}
			page := events(t, s, EventFilter{})
			if diff := cmp.Diff(tc.wantIDs, eventIDs(page.Events)); diff != "" {
				t.Errorf("remaining events (-want +got):\n%s", diff)
			}
			if got, want := page.PrunedThrough, tc.wantPrunedThr; got != want {
				t.Errorf("PrunedThrough = %d, want %d", got, want)
			}
		})
	}
}

func TestPruneEventsBounded(t *testing.T) {
	s := openStore(t)
	s.db.NoSync = true // speed: durability is not under test here
	total := uint64(MaxPrunePerBatch + 50)
	start := time.Now()
	writeEvents(t, s, 1, total, 4000, func(i uint64) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) })
	before := digest(t, s)
	t.Logf("wrote %d events in %v", total, time.Since(start))
	pruneStart := time.Now()

	if got, want := prune(t, s, total+1, t0.Add(time.Hour)), MaxPrunePerBatch; got != want {
		t.Fatalf("first prune removed %d, want %d", got, want)
	}
	t.Logf("pruned %d events in %v", MaxPrunePerBatch, time.Since(pruneStart))
	page := events(t, s, EventFilter{})
	if got, want := len(page.Events), 50; got != want {
		t.Fatalf("%d events left, want %d", got, want)
	}
	if got, want := page.Events[0].ID, uint64(MaxPrunePerBatch+1); got != want {
		t.Errorf("first remaining event = %d, want %d", got, want)
	}
	if got, want := page.PrunedThrough, uint64(MaxPrunePerBatch); got != want {
		t.Errorf("PrunedThrough = %d, want %d", got, want)
	}
	if digest(t, s) == before {
		t.Error("digest unchanged after pruning")
	}
	if got, want := prune(t, s, total+2, t0.Add(time.Hour)), 50; got != want {
		t.Errorf("second prune removed %d, want %d", got, want)
	}
	if got, want := events(t, s, EventFilter{}).PrunedThrough, total; got != want {
		t.Errorf("PrunedThrough = %d, want %d", got, want)
	}
	t.Logf("wrote and pruned %d events in %v", total, time.Since(start))
}

func TestSubscribeNotifiesChanges(t *testing.T) {
	s := openStore(t)
	sub := s.SubscribeWithData()
	defer sub.Close()
	// A plain subscription gets the same changes without the policies'
	// states.
	lean := s.Subscribe()
	defer lean.Close()

	acme := policy.Scope{Org: "acme"}
	beta := policy.Scope{Org: "beta"}
	steps := []struct {
		name string
		last uint64
		fn   func(b *Batch) error
		want []EntityChange
	}{
		{"create policy", 1, func(b *Batch) error {
			_, _, err := b.PutPolicy(meta(1), pol("p", acme, "deny"), nil)
			return err
		}, []EntityChange{{Type: EntityPolicy, ID: "p", Action: ActionCreate, Index: 1, Scopes: []policy.Scope{acme}}}},
		{"update in place", 2, func(b *Batch) error {
			_, _, err := b.PutPolicy(meta(2), pol("p", acme, "audit"), nil)
			return err
		}, []EntityChange{{Type: EntityPolicy, ID: "p", Action: ActionUpdate, Index: 2, Scopes: []policy.Scope{acme}}}},
		{"move policy: new scope then old", 3, func(b *Batch) error {
			_, _, err := b.PutPolicy(meta(3), pol("p", beta, "audit"), nil)
			return err
		}, []EntityChange{{Type: EntityPolicy, ID: "p", Action: ActionUpdate, Index: 3, Scopes: []policy.Scope{beta, acme}}}},
		{"several entities in one batch", 6, func(b *Batch) error {
			if _, _, err := b.PutEmployee(meta(4), emp("alice", "acme", "platform"), nil); err != nil {
				return err
			}
			if _, _, err := b.PutEmployee(meta(5), emp("alice", "acme", "security"), nil); err != nil {
				return err
			}
			return b.DeletePolicy(meta(6), "p", nil)
		}, []EntityChange{
			{Type: EntityEmployee, ID: "alice", Action: ActionCreate, Index: 4, Scopes: []policy.Scope{{Org: "acme", Team: "platform", Employee: "alice"}}},
			{Type: EntityEmployee, ID: "alice", Action: ActionUpdate, Index: 5, Scopes: []policy.Scope{
				{Org: "acme", Team: "security", Employee: "alice"}, {Org: "acme", Team: "platform", Employee: "alice"}}},
			{Type: EntityPolicy, ID: "p", Action: ActionDelete, Index: 6, Scopes: []policy.Scope{beta}},
		}},
		{"delete employee", 7, func(b *Batch) error { return b.DeleteEmployee(meta(7), "alice", nil) },
			[]EntityChange{{Type: EntityEmployee, ID: "alice", Action: ActionDelete, Index: 7, Scopes: []policy.Scope{{Org: "acme", Team: "security", Employee: "alice"}}}}},
		{"register member", 8, func(b *Batch) error { return b.PutMember(meta(8), Member{ID: "n1", RaftAddr: "a:1"}) },
			[]EntityChange{{Type: EntityMember, ID: "n1", Action: ActionUpdate, Index: 8}}},
		{"re-register the same addresses", 9, func(b *Batch) error { return b.PutMember(meta(9), Member{ID: "n1", RaftAddr: "a:1"}) }, nil},
		{"remove unknown member", 10, func(b *Batch) error { return b.DeleteMember(meta(10), "n2") }, nil},
		{"remove member", 11, func(b *Batch) error { return b.DeleteMember(meta(11), "n1") },
			[]EntityChange{{Type: EntityMember, ID: "n1", Action: ActionDelete, Index: 11}}},
		{"prune", 12, func(b *Batch) error { _, err := b.PruneEvents(t0.Add(time.Hour)); return err }, nil},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			apply(t, s, st.last, st.fn)
			waitReady(t, sub)
			// A policy's change carries its stored state, which nothing
			// has changed since.
			for i, e := range st.want {
				if e.Type == EntityPolicy && e.Action != ActionDelete {
					stored, _, err := s.RawPolicies(e.ID)
					if err != nil {
						t.Fatal(err)
					}
					st.want[i].Data, st.want[i].Policy = stored[e.ID].Stored, stored[e.ID].Policy
				}
			}
			want := []Change{{Index: st.last, Entities: st.want}}
			if diff := cmp.Diff(want, sub.Next(), ignoreChangeTime); diff != "" {
				t.Errorf("Next (-want +got):\n%s", diff)
			}
			leanWant := []Change{{Index: st.last, Entities: slices.Clone(st.want)}}
			for i := range leanWant[0].Entities {
				leanWant[0].Entities[i].Data, leanWant[0].Entities[i].Policy = nil, nil
			}
			if diff := cmp.Diff(leanWant, lean.Next(), ignoreChangeTime); diff != "" {
				t.Errorf("plain subscription's Next (-want +got):\n%s", diff)
			}
			if got := sub.Next(); got != nil {
				t.Errorf("second Next = %+v, want nil", got)
			}
		})
	}

	// A closed subscription gets nothing more.
	sub.Close()
	apply(t, s, 13, func(b *Batch) error { return b.PutMember(meta(13), Member{ID: "n3"}) })
	if got := sub.Next(); got != nil {
		t.Errorf("Next after Subscription.Close = %+v, want nil", got)
	}
}

func TestSubscriberOverflowResyncs(t *testing.T) {
	s := openStore(t)
	s.db.NoSync = true    // speed: durability is not under test here
	slow := s.Subscribe() // never drained
	defer slow.Close()
	fast := s.Subscribe()
	defer fast.Close()

	var seen []uint64
	drain := func() {
		for _, c := range fast.Next() {
			if c.Resync {
				t.Fatalf("a drained subscriber got a Resync at %d", c.Index)
			}
			seen = append(seen, c.Index)
		}
	}
	n := uint64(maxPending + 1)
	for i := uint64(1); i <= n; i++ {
		// The writer never waits for the slow subscriber.
		apply(t, s, i, func(b *Batch) error { return b.PutMember(meta(i), Member{ID: "n", RaftAddr: fmt.Sprint(i)}) })
		drain()
	}
	if got, want := len(seen), int(n); got != want {
		t.Errorf("drained subscriber saw %d changes, want %d", got, want)
	}
	if diff := cmp.Diff([]Change{{Index: n, Resync: true}}, slow.Next(), ignoreChangeTime); diff != "" {
		t.Errorf("overflowed subscriber (-want +got):\n%s", diff)
	}

	// After the Resync it queues normally again, and stays bounded.
	for i := n + 1; i <= n+3; i++ {
		apply(t, s, i, func(b *Batch) error { return nil })
	}
	got := slow.Next()
	if diff := cmp.Diff([]Change{{Index: n + 1}, {Index: n + 2}, {Index: n + 3}}, got, ignoreChangeTime); diff != "" {
		t.Errorf("after the Resync (-want +got):\n%s", diff)
	}
}

// TestSubscriptionByteBound: the policies' states a queue holds are bounded
// too; past maxPendingBytes the queue becomes one Resync, and a drained
// queue starts counting again.
func TestSubscriptionByteBound(t *testing.T) {
	sub := &Subscription{ready: make(chan struct{}, 1)}
	big := make([]byte, 4<<20)
	change := func(i uint64) Change {
		return Change{Index: i, Entities: []EntityChange{{Type: EntityPolicy, ID: "p", Action: ActionUpdate, Index: i, Data: big}}}
	}
	n := uint64(maxPendingBytes / len(big))
	for i := uint64(1); i <= n; i++ {
		sub.push(change(i))
	}
	if got := sub.Next(); len(got) != int(n) || got[0].Resync {
		t.Fatalf("at the bound: %d changes (first Resync %v), want %d plain", len(got), len(got) > 0 && got[0].Resync, n)
	}
	for i := n + 1; i <= 2*n+1; i++ {
		sub.push(change(i))
	}
	if diff := cmp.Diff([]Change{{Index: 2*n + 1, Resync: true}}, sub.Next()); diff != "" {
		t.Errorf("past the bound (-want +got):\n%s", diff)
	}
	sub.push(change(2*n + 2))
	if got := sub.Next(); len(got) != 1 || got[0].Resync || sub.pendingBytes != 0 {
		t.Errorf("after the Resync: %+v, %d bytes pending", got, sub.pendingBytes)
	}
}

func TestCloseEndsSubscriptions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	sub := s.Subscribe()
	apply(t, s, 1, func(b *Batch) error { return nil }) // leaves a Ready signal pending
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for closed := false; !closed; {
		select {
		case _, ok := <-sub.Ready():
			closed = !ok
		case <-deadline:
			t.Fatal("Ready not closed 5s after Close")
		}
	}
	sub.Close() // safe after the store closed it
}

func TestWaitApplied(t *testing.T) {
	s := openStore(t)
	if err := s.WaitApplied(t.Context(), 0); err != nil {
		t.Errorf("WaitApplied(0) = %v, want nil", err)
	}

	type res struct {
		err     error
		applied uint64
	}
	done := make(chan res, 1)
	go func() {
		err := s.WaitApplied(t.Context(), 3)
		done <- res{err, s.AppliedIndex()}
	}()
	for i := uint64(1); i <= 3; i++ {
		apply(t, s, i, func(b *Batch) error { return nil })
	}
	select {
	case r := <-done:
		if r.err != nil || r.applied < 3 {
			t.Errorf("WaitApplied(3) = %v at applied %d, want nil at >= 3", r.err, r.applied)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitApplied(3) did not return 5s after index 3 was applied")
	}
	if err := s.WaitApplied(t.Context(), 2); err != nil {
		t.Errorf("WaitApplied(2) after 3 = %v, want nil", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := s.WaitApplied(ctx, 4); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitApplied(4) with a timeout = %v, want DeadlineExceeded", err)
	}
	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	if err := s.WaitApplied(ctx, 4); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitApplied(4) with a cancelled ctx = %v, want Canceled", err)
	}
}

func TestSnapshotRestore(t *testing.T) {
	a := openStore(t)
	putPolicy(t, a, 1, pol("global", policy.Scope{}, "deny"))
	putEmployee(t, a, 2, emp("alice", "acme", "platform"))
	apply(t, a, 3, func(b *Batch) error { return b.PutMember(meta(3), Member{ID: "n1", RaftAddr: "a:1"}) })
	wantDigest := digest(t, a)

	sn, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Release()
	if got, want := sn.Index(), uint64(3); got != want {
		t.Errorf("Snapshot.Index = %d, want %d", got, want)
	}
	// A write after the snapshot is not in it, even though the snapshot is
	// streamed afterwards.
	after := pol("after", policy.Scope{Org: "acme"}, "deny")
	putPolicy(t, a, 4, after)
	var buf bytes.Buffer
	if _, err := sn.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	sn.Release()

	// B has other data at the same applied index, and has computed its
	// digest (which the store caches).
	b := openStore(t)
	putPolicy(t, b, 1, pol("other", policy.Scope{Org: "zeta"}, "allow"))
	apply(t, b, 3, func(bt *Batch) error {
		_, _, err := bt.PutEmployee(meta(3), emp("zed", "zeta", ""), nil)
		return err
	})
	bDigest := digest(t, b)
	if bDigest == wantDigest {
		t.Fatal("test setup: B already equals A")
	}
	sub := b.Subscribe()
	defer sub.Close()

	if err := b.Restore(&buf); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got, want := b.AppliedIndex(), uint64(3); got != want {
		t.Errorf("AppliedIndex after Restore = %d, want %d", got, want)
	}
	if got := digest(t, b); got != wantDigest {
		t.Errorf("digest after Restore = %s, want A's %s (B's own was %s)", got, wantDigest, bDigest)
	}
	if _, err := b.GetPolicy("other"); !errors.Is(err, ErrNotFound) {
		t.Errorf("B's own policy survived Restore: %v", err)
	}
	if _, err := b.GetPolicy("after"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a write made after the snapshot is in B: %v", err)
	}
	if _, err := b.GetEmployee("alice"); err != nil {
		t.Errorf("GetEmployee(alice) after Restore: %v", err)
	}
	waitReady(t, sub)
	if diff := cmp.Diff([]Change{{Index: 3, Resync: true}}, sub.Next(), ignoreChangeTime); diff != "" {
		t.Errorf("subscriber after Restore (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(b.Path() + ".restore"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("restore temp file left behind: %v", err)
	}

	// B carries on from the snapshot: the same next write makes it equal A.
	putPolicy(t, b, 4, after)
	if da, db := digest(t, a), digest(t, b); da != db {
		t.Errorf("after the same write, digests differ: A %s, B %s", da, db)
	}
	// And it survives a reopen.
	path := b.Path()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := openAt(t, path)
	if got, want := digest(t, b2), digest(t, a); got != want {
		t.Errorf("digest after reopening the restored store = %s, want %s", got, want)
	}
}

func TestRestoreRejectsBadSnapshot(t *testing.T) {
	foreign := filepath.Join(t.TempDir(), "foreign.db")
	writeForeignDB(t, foreign)

	tests := []struct {
		name    string
		data    []byte
		wantErr error
	}{
		{"garbage", randomBytes(t, 8<<10), nil},
		{"empty", nil, nil},
		{"truncated header", []byte("not a db"), nil},
		{"foreign bbolt", readFile(t, foreign), ErrForeignDB},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := openStore(t)
			putPolicy(t, b, 1, pol("kept", policy.Scope{}, "deny"))
			before := digest(t, b)
			sub := b.Subscribe()
			defer sub.Close()

			err := b.Restore(bytes.NewReader(tc.data))
			if err == nil {
				t.Fatal("Restore succeeded, want an error")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Restore err = %v, want %v", err, tc.wantErr)
			}
			if got := digest(t, b); got != before {
				t.Error("digest changed after a failed Restore")
			}
			if got, want := b.AppliedIndex(), uint64(1); got != want {
				t.Errorf("AppliedIndex = %d, want %d", got, want)
			}
			if got := sub.Next(); got != nil {
				t.Errorf("a failed Restore notified %+v", got)
			}
			if _, err := os.Stat(b.Path() + ".restore"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("restore temp file left behind: %v", err)
			}
			// Still usable.
			putPolicy(t, b, 2, pol("next", policy.Scope{}, "deny"))
			if _, err := b.GetPolicy("kept"); err != nil {
				t.Errorf("GetPolicy(kept): %v", err)
			}
		})
	}
}

// failingReader returns some bytes and then an error.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	n := min(len(p), r.n)
	r.n -= n
	return n, nil
}

func TestRestoreReadError(t *testing.T) {
	b := openStore(t)
	putPolicy(t, b, 1, pol("kept", policy.Scope{}, "deny"))
	before := digest(t, b)
	if err := b.Restore(&failingReader{n: 4096}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Restore err = %v, want ErrUnexpectedEOF", err)
	}
	if got := digest(t, b); got != before {
		t.Error("digest changed after a failed Restore")
	}
	if _, err := os.Stat(b.Path() + ".restore"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("restore temp file left behind: %v", err)
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// writeForeignDB creates a valid bbolt file that policyd did not write.
func writeForeignDB(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("foreign"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesForeignFiles(t *testing.T) {
	tests := []struct {
		name    string
		write   func(t *testing.T, path string)
		wantErr error // nil: any error naming the path
	}{
		{"random garbage", func(t *testing.T, path string) {
			if err := os.WriteFile(path, randomBytes(t, 8<<10), 0o600); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"short garbage", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("hello"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"bbolt with a foreign bucket", writeForeignDB, ErrForeignDB},
		{"bbolt with a meta bucket of another schema", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket(bucketMeta)
				if err != nil {
					return err
				}
				return b.Put(keyMagic, []byte("policyd-state-v0"))
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
		}, ErrForeignDB},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			tc.write(t, path)
			before := readFile(t, path)
			s, err := Open(path, testLogger())
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded, want an error")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Open err = %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("Open err = %q, want it to name %q", err, path)
			}
			if !bytes.Equal(readFile(t, path), before) {
				t.Error("Open modified the file it refused")
			}
		})
	}
}

func TestOpenEmptyFileInitialises(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, testLogger())
	if err != nil {
		t.Fatalf("Open on an empty file: %v", err)
	}
	putPolicy(t, s, 1, pol("p", policy.Scope{}, "deny"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(readFile(t, path)) == 0 {
		t.Fatal("file still empty after Open")
	}
	s2 := openAt(t, path)
	if got, want := s2.AppliedIndex(), uint64(1); got != want {
		t.Errorf("AppliedIndex after reopen = %d, want %d", got, want)
	}
}

func TestDigest(t *testing.T) {
	a, b := openStore(t), openStore(t)
	if da, db := digest(t, a), digest(t, b); da != db {
		t.Fatalf("empty stores: digests differ: %s vs %s", da, db)
	}
	steps := []struct {
		name string
		fn   func(bt *Batch, m Meta) error
	}{
		{"put policy", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutPolicy(m, pol("p", policy.Scope{Org: "acme"}, "deny"), nil)
			return err
		}},
		{"update policy", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutPolicy(m, pol("p", policy.Scope{Org: "acme"}, "audit"), nil)
			return err
		}},
		{"put employee", func(bt *Batch, m Meta) error {
			_, _, err := bt.PutEmployee(m, emp("alice", "acme", ""), nil)
			return err
		}},
		{"put member", func(bt *Batch, m Meta) error { return bt.PutMember(m, Member{ID: "n1"}) }},
		{"change member", func(bt *Batch, m Meta) error { return bt.PutMember(m, Member{ID: "n1", RaftAddr: "x"}) }},
		{"delete member", func(bt *Batch, m Meta) error { return bt.DeleteMember(m, "n1") }},
		{"delete employee", func(bt *Batch, m Meta) error { return bt.DeleteEmployee(m, "alice", nil) }},
		{"delete policy", func(bt *Batch, m Meta) error { return bt.DeletePolicy(m, "p", nil) }},
		{"prune some events", func(bt *Batch, m Meta) error { _, err := bt.PruneEvents(meta(2).ProcessedAt); return err }},
		{"prune the rest", func(bt *Batch, m Meta) error { _, err := bt.PruneEvents(t0.Add(time.Hour)); return err }},
	}
	prev := digest(t, a)
	for i, st := range steps {
		idx := uint64(i + 1)
		for _, s := range []*Store{a, b} {
			apply(t, s, idx, func(bt *Batch) error { return st.fn(bt, meta(idx)) })
		}
		da, gotIdx, err := a.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if gotIdx != idx {
			t.Errorf("%s: Digest index = %d, want %d", st.name, gotIdx, idx)
		}
		if da == prev {
			t.Errorf("%s: digest unchanged", st.name)
		}
		prev = da
		if db := digest(t, b); da != db {
			t.Errorf("%s: equal content, different digests: %s vs %s", st.name, da, db)
		}
	}
	// A batch that changes nothing but the applied index keeps the digest.
	before := digest(t, a)
	apply(t, a, 100, func(bt *Batch) error { return nil })
	if got := digest(t, a); got != before {
		t.Error("digest changed after an empty batch")
	}
}

// TestConcurrentUse runs readers, a snapshot and subscribers against a
// writer, for the race detector.
func TestConcurrentUse(t *testing.T) {
	s := openStore(t)
	s.db.NoSync = true
	sub := s.Subscribe()
	defer sub.Close()
	const n = 50
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.PolicySet(policy.Identity{Org: "acme"}); err != nil {
					t.Error(err)
					return
				}
				if _, _, err := s.Digest(); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.ListEvents(EventFilter{Limit: 5}); err != nil {
					t.Error(err)
					return
				}
				sub.Next()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		sn, err := s.Snapshot()
		if err != nil {
			t.Error(err)
			return
		}
		defer sn.Release()
		if _, err := sn.WriteTo(io.Discard); err != nil {
			t.Error(err)
		}
	}()
	for i := uint64(1); i <= n; i++ {
		putPolicy(t, s, i, pol(fmt.Sprintf("p%d", i%7), policy.Scope{Org: "acme"}, "deny"))
	}
	close(stop)
	wg.Wait()
	if err := s.WaitApplied(t.Context(), n); err != nil {
		t.Fatal(err)
	}
}

// TestPolicyStoredAsGiven: the store keeps the spec bytes it is given (the
// proposer canonicalises them; see raftfsm's TestPutPolicyStoresCanonical),
// and the event carries exactly the stored bytes.
func TestPolicyStoredAsGiven(t *testing.T) {
	s := openStore(t)
	spec := `{"z":1,"a":{"y":[1.50,2],"b":12345678901234567890}}`
	putPolicy(t, s, 1, &policy.Policy{Name: "p", Kind: "RateLimit", Spec: json.RawMessage(spec)})
	got, err := s.GetPolicy("p")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Spec) != spec {
		t.Errorf("stored spec = %s, want %s", got.Spec, spec)
	}
	ev := events(t, s, EventFilter{}).Events
	raw, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 1 || !bytes.Equal(ev[0].Data, raw) {
		t.Errorf("events = %+v, want one with the stored policy", ev)
	}
}

// ignoreChangeTime drops Change.At, a local wall-clock stamp, from
// comparisons; TestChangeTime checks it.
var ignoreChangeTime = cmpopts.IgnoreFields(Change{}, "At")

func TestChangeTime(t *testing.T) {
	s := openStore(t)
	sub := s.Subscribe()
	defer sub.Close()
	before := time.Now()
	apply(t, s, 1, func(b *Batch) error { return nil })
	waitReady(t, sub)
	got := sub.Next()
	if len(got) != 1 || got[0].At.Before(before) || got[0].At.After(time.Now()) {
		t.Fatalf("Next = %+v, want one change stamped between %v and now", got, before)
	}
}

// TestNoSyncDirtyMark covers Options.NoSync: a store closed cleanly keeps
// its state, one left open (a crash) is discarded by the next Open in either
// mode, and a synced store never leaves a mark.
func TestNoSyncDirtyMark(t *testing.T) {
	tests := []struct {
		name      string
		noSync    bool
		crash     bool // copy the files while the store is open, as a crash leaves them
		reopenOpt Options
		wantMark  bool // while open
		wantState bool // after the reopen
	}{
		{"no sync, clean close", true, false, Options{NoSync: true}, true, true},
		{"no sync, crash, reopened without sync", true, true, Options{}, true, false},
		{"no sync, crash, reopened with no sync", true, true, Options{NoSync: true}, true, false},
		{"synced, crash", false, true, Options{}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s, err := OpenWithOptions(path, testLogger(), Options{NoSync: tc.noSync})
			if err != nil {
				t.Fatal(err)
			}
			putPolicy(t, s, 3, pol("g", policy.Scope{}, "deny"))
			if _, err := os.Stat(path + DirtySuffix); (err == nil) != tc.wantMark {
				t.Errorf("dirty mark while open: stat err %v, want mark %v", err, tc.wantMark)
			}
			reopen := path
			if tc.crash {
				// The files as the process left them; the running store
				// keeps its lock on the original.
				reopen = filepath.Join(t.TempDir(), "state.db")
				if err := os.WriteFile(reopen, readFile(t, path), 0o600); err != nil {
					t.Fatal(err)
				}
				if tc.noSync {
					if err := os.WriteFile(reopen+DirtySuffix, nil, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			closeWithin(t, s)
			if _, err := os.Stat(path + DirtySuffix); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("dirty mark after Close: stat err %v, want none", err)
			}
			s2, err := OpenWithOptions(reopen, testLogger(), tc.reopenOpt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeWithin(t, s2) })
			wantIndex := uint64(0)
			if tc.wantState {
				wantIndex = 3
			}
			if got := s2.AppliedIndex(); got != wantIndex {
				t.Errorf("AppliedIndex after reopen = %d, want %d", got, wantIndex)
			}
			if got := s2.Discarded(); got == tc.wantState {
				t.Errorf("Discarded = %v, want %v", got, !tc.wantState)
			}
			_, err = s2.GetPolicy("g")
			if found := err == nil; found != tc.wantState {
				t.Errorf("policy after reopen: err %v, want found %v", err, tc.wantState)
			}
			if _, err := os.Stat(reopen + DirtySuffix); (err == nil) != tc.reopenOpt.NoSync {
				t.Errorf("dirty mark after reopen: stat err %v, want mark %v", err, tc.reopenOpt.NoSync)
			}
		})
	}
}

func TestEventAppendJSONMatchesMarshal(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 600, time.UTC)
	tests := []struct {
		name string
		ev   Event
	}{
		{"zero", Event{}},
		{"policy", Event{ID: 7, EntityType: EntityPolicy, Org: "acme", Action: ActionUpdate, EntityID: "p<1>",
			Data: json.RawMessage(`{"name":"p\u003c1\u003e","spec":{"a":1}}`), OriginatedAt: at, ProcessedAt: at.Add(time.Second)}},
		{"escaping", Event{ID: 1, Org: `"&"`, EntityID: "\u2028", Data: json.RawMessage(`null`)}},
		{"audit", Event{ID: 9, Data: json.RawMessage(`{}`), Actor: "token:<ops>", RequestID: "r-1", RevertedTo: 4}},
		{"request id only", Event{ID: 9, Data: json.RawMessage(`{}`), RequestID: "r\u2028"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(&tc.ev)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tc.ev.appendJSON(nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("appendJSON =\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestStartHistory: a restored state moved ahead reads as a new history:
// its applied index and the events' pruned mark are the new start, the
// events it holds stay listed, pruning them later does not lower the mark,
// and a start at or below the applied index is refused.
func TestStartHistory(t *testing.T) {
	s := openStore(t)
	writeEvents(t, s, 1, 4, 4, func(i uint64) time.Time { return meta(i).ProcessedAt })
	const start = 1_000
	if err := s.StartHistory(4); err == nil {
		t.Fatal("StartHistory at the applied index: no error")
	}
	if err := s.StartHistory(start); err != nil {
		t.Fatal(err)
	}
	check := func(when string, applied uint64, wantIDs []uint64) {
		t.Helper()
		if got := s.AppliedIndex(); got != applied {
			t.Errorf("%s: applied index %d, want %d", when, got, applied)
		}
		page := events(t, s, EventFilter{})
		if diff := cmp.Diff(wantIDs, eventIDs(page.Events)); diff != "" {
			t.Errorf("%s: events (-want +got):\n%s", when, diff)
		}
		if page.PrunedThrough != start {
			t.Errorf("%s: PrunedThrough = %d, want %d", when, page.PrunedThrough, start)
		}
	}
	check("after the start", start, []uint64{1, 2, 3, 4})
	if n := prune(t, s, start+1, t0.Add(24*time.Hour)); n != 4 {
		t.Fatalf("pruned %d, want 4", n)
	}
	check("after pruning the old events", start+1, []uint64{})
}
