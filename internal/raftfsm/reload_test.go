package raftfsm

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

// Run longer with:
//
//	go test ./internal/raftfsm/ -run '^$' -fuzz '^FuzzReloadDecoders$' -fuzztime 60s

func reloadKey(scope, cm string) store.ReloadKey {
	return store.ReloadKey{Scope: scope, ConfigMap: cm}
}

// reloadSeeds are valid reload commands of every type, in an order that
// exercises them against each other.
func reloadSeeds(t testing.TB) []*commandv1.Command {
	t.Helper()
	m := mustCmd(t)
	k := reloadKey("test", "app")
	due := t0.Add(time.Minute)
	return []*commandv1.Command{
		m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: k, Hash: "h1"}, {ReloadKey: reloadKey("", "other"), Hash: "o"}})),
		m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: k, Hash: "h2", Schedule: true, DueAt: due, Reason: "change"}})),
		m(command.ReloadRestartFailed(2, store.ReloadError{ReloadKey: k, Hash: "h2", Attempts: 1, Error: "patch: forbidden", RetryAt: due.Add(time.Second), FailedAt: due})),
		m(command.ReloadRestarted(2, store.ReloadRestart{ReloadKey: k, Hash: "h2", Patched: []string{"web"}, Skipped: []string{"api"}, Attempts: 1, Reason: "change", RestartedAt: due.Add(time.Second)})),
	}
}

func TestReloadCommandsApply(t *testing.T) {
	st := openStoreAt(t, filepath.Join(t.TempDir(), "state.db"))
	f := New(st, testLogger())
	for i, c := range reloadSeeds(t) {
		if err := command.ResultErr(asResult(t, f.Apply(entry(t, uint64(i+1), c)))); err != nil {
			t.Fatalf("entry %d: %v", i+1, err)
		}
	}
	got, err := st.ReloadState()
	if err != nil {
		t.Fatal(err)
	}
	k := reloadKey("test", "app")
	want := &store.ReloadState{
		Index: 4,
		Hashes: []store.ReloadHash{
			{ReloadKey: reloadKey("", "other"), Hash: "o", Index: 1, UpdatedAt: processedAt(1)},
			{ReloadKey: k, Hash: "h2", Index: 2, UpdatedAt: processedAt(2)},
		},
		Pending: []store.ReloadPending{},
		Restarts: []store.ReloadRestart{{
			ReloadKey: k, Hash: "h2", Patched: []string{"web"}, Skipped: []string{"api"}, Attempts: 1, Reason: "change",
			RestartedAt: t0.Add(time.Minute + time.Second), Index: 4,
		}},
		Errors: []store.ReloadError{{
			ReloadKey: k, Hash: "h2", Attempts: 1, Error: "patch: forbidden",
			RetryAt: t0.Add(time.Minute + time.Second), FailedAt: t0.Add(time.Minute), Index: 3,
		}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("reload state (-want +got):\n%s", d)
	}
}

func TestReloadCommandsCarryIgnoreUnknown(t *testing.T) {
	for _, typ := range []command.Type{command.TypeReloadObserve, command.TypeReloadRestarted, command.TypeReloadRestartFailed} {
		if typ&command.IgnoreUnknown == 0 {
			t.Errorf("type 0x%02x lacks command.IgnoreUnknown", uint8(typ))
		}
		if _, ok := knownTypes[typ]; !ok {
			t.Errorf("type 0x%02x has no decoder", uint8(typ))
		}
	}
}

func TestReloadErrorTextIsCut(t *testing.T) {
	long := strings.Repeat("é", command.MaxReloadError) // two bytes each: the cut falls mid-rune
	c := mustCmd(t)(command.ReloadRestartFailed(1, store.ReloadError{ReloadKey: reloadKey("s", "cm"), Hash: "h", Error: long}))
	e, err := DecodeEntry(1, stamp(t, 1, c))
	if err != nil {
		t.Fatalf("a cut error text does not decode: %v", err)
	}
	if e.Apply == nil {
		t.Fatal("no Apply")
	}
}

func TestReloadDecodeRejects(t *testing.T) {
	m := mustCmd(t)
	k := reloadKey("test", "app")
	big := strings.Repeat("x", command.MaxKeyLen+1)
	many := make([]store.ReloadObservation, command.MaxReloadObservations+1)
	for i := range many {
		many[i] = store.ReloadObservation{ReloadKey: k, Hash: "h"}
	}
	tests := []struct {
		name string
		cmd  *commandv1.Command
	}{
		{"no observations", m(command.ReloadObserve(nil))},
		{"too many observations", m(command.ReloadObserve(many))},
		{"empty configmap", m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: reloadKey("s", ""), Hash: "h"}}))},
		{"empty hash", m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: k}}))},
		{"NUL in scope", m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: reloadKey("a\x00b", "c"), Hash: "h"}}))},
		{"oversize scope", m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: reloadKey(big, "c"), Hash: "h"}}))},
		{"oversize configmap", m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: reloadKey("s", big), Hash: "h"}}))},
		{"scheduled without a due time", m(command.ReloadObserve([]store.ReloadObservation{{ReloadKey: k, Hash: "h", Schedule: true}}))},
		{"restart with an empty deployment name", m(command.ReloadRestarted(1, store.ReloadRestart{ReloadKey: k, Hash: "h", Patched: []string{""}}))},
		{"restart of an empty key", m(command.ReloadRestarted(1, store.ReloadRestart{Hash: "h"}))},
		{"failure with an oversize error", m(command.New(&commandv1.ReloadRestartFailed{Scope: "s", Configmap: "c", Hash: "h", Error: strings.Repeat("e", command.MaxReloadError+1)}))},
		{"garbage payload", &commandv1.Command{Type: uint32(command.TypeReloadObserve), Payload: []byte{0xff}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if e, err := DecodeEntry(1, stamp(t, 1, tc.cmd)); err == nil {
				t.Fatalf("DecodeEntry accepted it: %+v", e)
			}
		})
	}
}

func FuzzReloadDecoders(f *testing.F) {
	for i, c := range reloadSeeds(f) {
		f.Add(stamp(f, uint64(i+1), c))
	}
	f.Add([]byte{0x08, byte(command.TypeReloadObserve), 0x01, 0x12, 0x02, 0x0a, 0x00})
	f.Add([]byte{0x08, byte(command.TypeReloadRestarted), 0x01})
	st := fuzzStore(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkApply(t, st, data)
	})
}
