package store

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func rkey(scope, cm string) ReloadKey { return ReloadKey{Scope: scope, ConfigMap: cm} }

func reloadState(t *testing.T, s *Store) *ReloadState {
	t.Helper()
	st, err := s.ReloadState()
	if err != nil {
		t.Fatalf("ReloadState: %v", err)
	}
	return st
}

func TestReloadObserveSeedsAndSchedules(t *testing.T) {
	s := openStore(t)
	due := t0.Add(time.Minute)
	apply(t, s, 1, func(b *Batch) error {
		return b.ObserveReload(meta(1), []ReloadObservation{
			{ReloadKey: rkey("test", "app"), Hash: "h1"},
			{ReloadKey: rkey("prod", "app"), Hash: "p1"},
		})
	})
	apply(t, s, 2, func(b *Batch) error {
		return b.ObserveReload(meta(2), []ReloadObservation{
			{ReloadKey: rkey("test", "app"), Hash: "h2", Schedule: true, DueAt: due, Reason: "change"},
		})
	})
	st := reloadState(t, s)
	wantHashes := []ReloadHash{
		{ReloadKey: rkey("prod", "app"), Hash: "p1", Index: 1, UpdatedAt: meta(1).ProcessedAt},
		{ReloadKey: rkey("test", "app"), Hash: "h2", Index: 2, UpdatedAt: meta(2).ProcessedAt},
	}
	if d := cmp.Diff(wantHashes, st.Hashes); d != "" {
		t.Errorf("hashes (-want +got):\n%s", d)
	}
	wantPending := []ReloadPending{{
		ReloadKey: rkey("test", "app"), Hash: "h2", DueAt: due, Reason: "change", Index: 2, ScheduledAt: meta(2).ProcessedAt,
	}}
	if d := cmp.Diff(wantPending, st.Pending); d != "" {
		t.Errorf("pending (-want +got):\n%s", d)
	}
	if got := len(events(t, s, EventFilter{Type: EntityReload}).Events); got != 0 {
		t.Errorf("%d reload events after observing only, want 0", got)
	}

	// A further change replaces the entry: new hash, later due time, attempts
	// reset (coalescing, and a fresh change superseding a stale retry).
	apply(t, s, 3, func(b *Batch) error {
		return b.RecordReloadError(meta(3), 2, ReloadError{ReloadKey: rkey("test", "app"), Hash: "h2", Attempts: 1, Error: "boom", RetryAt: due.Add(time.Second)})
	})
	if p := reloadState(t, s).Pending[0]; p.Attempts != 1 || p.LastError != "boom" || !p.DueAt.Equal(due.Add(time.Second)) {
		t.Fatalf("after a failure: %+v", p)
	}
	apply(t, s, 4, func(b *Batch) error {
		return b.ObserveReload(meta(4), []ReloadObservation{
			{ReloadKey: rkey("test", "app"), Hash: "h3", Schedule: true, DueAt: due.Add(time.Hour), Reason: "change"},
		})
	})
	p := reloadState(t, s).Pending[0]
	if p.Hash != "h3" || p.Attempts != 0 || p.LastError != "" || p.Index != 4 || !p.DueAt.Equal(due.Add(time.Hour)) {
		t.Errorf("after a fresh change: %+v", p)
	}
}

func TestReloadRestartCompletesOnlyItsOwnPending(t *testing.T) {
	tests := []struct {
		name         string
		pendingIndex uint64
		wantPending  int
	}{
		{"completes the attempted entry", 1, 0},
		{"a stale attempt leaves a newer change queued", 99, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			k := rkey("test", "app")
			apply(t, s, 1, func(b *Batch) error {
				return b.ObserveReload(meta(1), []ReloadObservation{{ReloadKey: k, Hash: "h", Schedule: true, DueAt: t0, Reason: "change"}})
			})
			r := ReloadRestart{ReloadKey: k, Hash: "h", Patched: []string{"web"}, Skipped: []string{"api"}, Reason: "change", RestartedAt: t0}
			apply(t, s, 2, func(b *Batch) error { return b.RecordReloadRestart(meta(2), tc.pendingIndex, r) })
			st := reloadState(t, s)
			if got := len(st.Pending); got != tc.wantPending {
				t.Errorf("%d pending, want %d", got, tc.wantPending)
			}
			r.Index = 2
			if d := cmp.Diff([]ReloadRestart{r}, st.Restarts); d != "" {
				t.Errorf("restarts (-want +got):\n%s", d)
			}
			// Every restart is an event of type reload, global (no org).
			evs := events(t, s, EventFilter{Type: EntityReload}).Events
			if len(evs) != 1 {
				t.Fatalf("%d reload events, want 1", len(evs))
			}
			ev := evs[0]
			if ev.ID != 2 || ev.EntityID != "test/app" || ev.Action != ActionUpdate || ev.Org != "" || !ev.ProcessedAt.Equal(meta(2).ProcessedAt) {
				t.Errorf("event = %+v", ev)
			}
			var got ReloadRestart
			if err := json.Unmarshal(ev.Data, &got); err != nil || got.Hash != "h" {
				t.Errorf("event data %s: %v", ev.Data, err)
			}
		})
	}
}

func TestReloadErrorOnStaleAttemptOnlyLogs(t *testing.T) {
	s := openStore(t)
	k := rkey("test", "app")
	apply(t, s, 1, func(b *Batch) error {
		return b.ObserveReload(meta(1), []ReloadObservation{{ReloadKey: k, Hash: "h", Schedule: true, DueAt: t0, Reason: "change"}})
	})
	apply(t, s, 2, func(b *Batch) error {
		return b.RecordReloadError(meta(2), 7, ReloadError{ReloadKey: k, Hash: "old", Attempts: 3, Error: "e", RetryAt: t0.Add(time.Hour)})
	})
	st := reloadState(t, s)
	if p := st.Pending[0]; p.Attempts != 0 || !p.DueAt.Equal(t0) {
		t.Errorf("a stale attempt changed the pending entry: %+v", p)
	}
	if len(st.Errors) != 1 || st.Errors[0].Error != "e" || st.Errors[0].Index != 2 {
		t.Errorf("errors = %+v", st.Errors)
	}
}

func TestReloadLogsAreBoundedNewestFirst(t *testing.T) {
	s := openStore(t)
	k := rkey("s", "cm")
	const n = MaxReloadLog + 25
	apply(t, s, n, func(b *Batch) error {
		for i := uint64(1); i <= n; i++ {
			if err := b.RecordReloadRestart(meta(i), 0, ReloadRestart{ReloadKey: k, Hash: fmt.Sprint(i)}); err != nil {
				return err
			}
			if err := b.RecordReloadError(meta(i), 0, ReloadError{ReloadKey: k, Hash: fmt.Sprint(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	st := reloadState(t, s)
	for name, idx := range map[string][]uint64{"restarts": indexes(st.Restarts, func(r ReloadRestart) uint64 { return r.Index }), "errors": indexes(st.Errors, func(e ReloadError) uint64 { return e.Index })} {
		if len(idx) != MaxReloadLog {
			t.Errorf("%s: %d kept, want %d", name, len(idx), MaxReloadLog)
			continue
		}
		if idx[0] != n || idx[len(idx)-1] != n-MaxReloadLog+1 {
			t.Errorf("%s: kept %d..%d, want the newest %d..%d first", name, idx[0], idx[len(idx)-1], n, n-MaxReloadLog+1)
		}
	}
}

func indexes[T any](xs []T, f func(T) uint64) []uint64 {
	out := make([]uint64, 0, len(xs))
	for _, x := range xs {
		out = append(out, f(x))
	}
	return out
}

func TestReloadStateInDigestAndSnapshot(t *testing.T) {
	s := openStore(t)
	before := digest(t, s)
	apply(t, s, 1, func(b *Batch) error {
		return b.ObserveReload(meta(1), []ReloadObservation{{ReloadKey: rkey("", "cm"), Hash: "h"}})
	})
	if digest(t, s) == before {
		t.Error("the reload hash cache is not part of the replicated digest")
	}
	if st := reloadState(t, s); len(st.Hashes) != 1 || st.Hashes[0].Scope != "" || st.Index != 1 {
		t.Errorf("state = %+v", st)
	}
}
