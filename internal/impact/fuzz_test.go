package impact

import (
	"bytes"
	"context"
	"testing"
)

// FuzzReplayRecord replays one arbitrary record twice under the test sets:
// whatever the bytes, Replay must not panic or fail, must count both
// copies alike and every evaluated record once, and may keep only the
// record itself as an example. The seeds in testdata/fuzz run as tests.
func FuzzReplayRecord(f *testing.F) {
	f.Add(rec{org: "a", team: "t", employee: "e", cmd: "rm -rf /"}.json())
	f.Add([]byte(`{"org":"a","team":"t","time":"2026-12-01T10:00:00Z","request":{"http":{"method":"DELETE"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s testSets
		resp, err := Replay(context.Background(), Options{}, scanOf(data, data), s.sets)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Scanned != 2 || resp.CutOff {
			t.Fatalf("scanned %d, cut off %v: want 2, false", resp.Scanned, resp.CutOff)
		}
		if resp.Masked%2 != 0 || resp.Unrecorded%2 != 0 {
			t.Fatalf("the two copies counted differently: masked %d, unrecorded %d", resp.Masked, resp.Unrecorded)
		}
		checkSums(t, resp)
		var evaluated uint64
		for _, c := range resp.Teams {
			evaluated += c.Evaluated
			for _, n := range []uint64{c.Evaluated, c.AllowToDeny, c.DenyToAllow, c.Unchanged, c.Errors} {
				if n%2 != 0 {
					t.Fatalf("%s/%s: the two copies counted differently: %v", c.Org, c.Team, c)
				}
			}
			for _, ex := range append(c.AllowToDenyExamples, c.DenyToAllowExamples...) {
				if !bytes.Equal(ex, data) {
					t.Fatalf("example %q is not the record", ex)
				}
			}
		}
		if evaluated > 2 {
			t.Fatalf("evaluated %d of 2 records", evaluated)
		}
	})
}
