package impact

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/testing/protocmp"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the time of the test records; each record is a second after it
// times its index.
var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// toolPolicy is a ToolPolicy denying Bash commands matching pattern.
func toolPolicy(name, pattern string) client.Policy {
	spec, _ := json.Marshal(map[string]any{"tool_name": "Bash", "action": "deny", "reason": name,
		"conditions": map[string]any{"patterns": []string{pattern}}})
	return client.Policy{Name: name, Kind: client.KindToolPolicy, Spec: spec}
}

// celPolicy is a ValidatingPolicy with one validation.
func celPolicy(name, expr string) client.Policy {
	spec, _ := json.Marshal(map[string]any{"validations": []any{map[string]any{"expression": expr, "message": name}}})
	return client.Policy{Name: name, Kind: client.KindValidatingPolicy, Spec: spec}
}

// The test sets: the change set replaces no-rm with no-sudo for org a,
// so rm flips deny → allow, sudo allow → deny and ls stays allowed.
// Team a/broken gets a candidate that does not compile, team a/cel one
// whose expression fails on a tool call without input.path.
var (
	baseline = []client.Policy{
		toolPolicy("no-rm", `rm -rf`),
		celPolicy("no-delete", `!has(request.method) || request.method != "DELETE"`),
	}
	candidate = []client.Policy{
		toolPolicy("no-sudo", `^sudo`),
		celPolicy("no-delete", `!has(request.method) || request.method != "DELETE"`),
		celPolicy("no-halt", `!has(input.command) || input.command != "halt"`),
	}
)

// testSets is the SetsFunc of the test sets; calls counts its calls.
type testSets struct{ calls int }

func (s *testSets) sets(org, team, employee string) (base, cand []client.Policy, affected bool) {
	s.calls++
	switch {
	case org != "a":
		return nil, nil, false
	case team == "broken":
		return baseline, []client.Policy{celPolicy("bad", `nope ==`)}, true
	case team == "cel":
		return baseline, []client.Policy{celPolicy("path", `input.path.startsWith("/tmp")`)}, true
	case team == "labels":
		// Changed, but not in what decides: the same compiled set.
		relabelled := slices.Clone(baseline)
		relabelled[0].Labels = map[string]string{"x": "y"}
		return baseline, relabelled, true
	}
	return baseline, candidate, true
}

// rec is a record of a Bash call, i seconds after t0.
type rec struct {
	org, team, employee, cmd string
	i                        int
	masked                   bool
	drops                    *decisionsv1.Drops
}

func (r rec) json() []byte {
	b, err := json.Marshal(decisionsv1.Record{
		Time: t0.Add(time.Duration(r.i) * time.Second), Org: r.org, Team: r.team, Employee: r.employee,
		ClientAddress: "10.0.0.1:5000", Request: decisionsv1.Request{Tool: "Bash", Input: map[string]any{"command": r.cmd}},
		Allowed: true, Version: "v1", Masked: r.masked, Unrecorded: r.drops,
	})
	if err != nil {
		panic(err)
	}
	return b
}

func scanOf(records ...[]byte) ScanFunc {
	return func(yield func([]byte) bool) error {
		for _, r := range records {
			if !yield(r) {
				return nil
			}
		}
		return nil
	}
}

func TestReplay(t *testing.T) {
	rmA := rec{org: "a", team: "t", employee: "e1", cmd: "rm -rf /"}.json()
	sudoA := rec{org: "a", team: "t", employee: "e2", cmd: "sudo ls", i: 1, masked: true}.json()
	lsA := rec{org: "a", team: "t", employee: "e1", cmd: "ls", i: 2}.json()
	rmU := rec{org: "a", team: "u", employee: "e3", cmd: "rm -rf /", i: 3}.json()
	rmB := rec{org: "b", team: "t", employee: "e1", cmd: "rm -rf /", i: 4}.json()
	drops := rec{org: "a", team: "t", employee: "e1", i: 5, drops: &decisionsv1.Drops{SampledOut: 10, BufferFull: 1, RateLimited: 2, MaskFailed: 3}}.json()
	dropsB := rec{org: "b", team: "t", employee: "e1", i: 6, drops: &decisionsv1.Drops{SampledOut: 100}}.json()
	count := func(org, team string, c *clusterv1.ImpactCount) *clusterv1.ImpactCount {
		c.Org, c.Team = org, team
		return c
	}
	oldest := t0.UnixNano()
	tests := []struct {
		name    string
		opts    Options
		records [][]byte
		want    *clusterv1.LocalImpactResponse
	}{
		{
			name: "nothing logged",
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Teams: []*clusterv1.ImpactCount{}},
		},
		{
			name:    "flips counted per team with examples",
			records: [][]byte{rmA, sudoA, lsA, rmU, rmB},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 5, Masked: 1, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 3, AllowToDeny: 1, DenyToAllow: 1, Unchanged: 1,
					AllowToDenyExamples: [][]byte{sudoA}, DenyToAllowExamples: [][]byte{rmA}}),
				count("a", "u", &clusterv1.ImpactCount{Evaluated: 1, DenyToAllow: 1, DenyToAllowExamples: [][]byte{rmU}}),
			}},
		},
		{
			name:    "unrecorded counted for affected identities only",
			records: [][]byte{drops, dropsB, lsA},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 3, Unrecorded: 16, OldestUnixNano: t0.Add(2 * time.Second).UnixNano(), Teams: []*clusterv1.ImpactCount{
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 1, Unchanged: 1}),
			}},
		},
		{
			name:    "org filter",
			opts:    Options{Org: "b"},
			records: [][]byte{rmA, rmB},
			want:    &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 2, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{}},
		},
		{
			name:    "team filter",
			opts:    Options{Org: "a", Team: "u"},
			records: [][]byte{rmA, sudoA, rmU},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 3, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "u", &clusterv1.ImpactCount{Evaluated: 1, DenyToAllow: 1, DenyToAllowExamples: [][]byte{rmU}}),
			}},
		},
		{
			name:    "since skips older records but oldest is still the oldest held",
			opts:    Options{Since: t0.Add(2 * time.Second)},
			records: [][]byte{rmA, sudoA, lsA, rmU, drops},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 5, Unrecorded: 16, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 1, Unchanged: 1}),
				count("a", "u", &clusterv1.ImpactCount{Evaluated: 1, DenyToAllow: 1, DenyToAllowExamples: [][]byte{rmU}}),
			}},
		},
		{
			name: "examples capped",
			opts: Options{MaxExamples: 2},
			records: [][]byte{
				rec{org: "a", team: "t", cmd: "rm -rf 1", i: 1}.json(),
				rec{org: "a", team: "t", cmd: "rm -rf 2", i: 2}.json(),
				rec{org: "a", team: "t", cmd: "rm -rf 3", i: 3}.json(),
			},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 3, OldestUnixNano: t0.Add(time.Second).UnixNano(), Teams: []*clusterv1.ImpactCount{
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 3, DenyToAllow: 3, DenyToAllowExamples: [][]byte{
					rec{org: "a", team: "t", cmd: "rm -rf 1", i: 1}.json(), rec{org: "a", team: "t", cmd: "rm -rf 2", i: 2}.json()}}),
			}},
		},
		{
			name: "example bytes capped over all teams",
			opts: Options{MaxExampleBytes: len(rmA) + len(rmU)},
			// rmA and rmU fill the budget: sudoA is counted, not kept.
			records: [][]byte{rmA, rmU, sudoA},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 3, Masked: 1, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 2, AllowToDeny: 1, DenyToAllow: 1, DenyToAllowExamples: [][]byte{rmA}}),
				count("a", "u", &clusterv1.ImpactCount{Evaluated: 1, DenyToAllow: 1, DenyToAllowExamples: [][]byte{rmU}}),
			}},
		},
		{
			name:    "no examples",
			opts:    Options{MaxExamples: -1},
			records: [][]byte{rmA},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 1, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 1, DenyToAllow: 1}),
			}},
		},
		{
			name: "bad records are errors where they can be placed",
			opts: Options{Org: "a"},
			records: [][]byte{
				[]byte(`not json`),
				[]byte(`[1,2]`),
				[]byte(`{"org":"a","team":"t","time":"2026-12-01T10:00:00Z","request":"nope"}`),
				[]byte(`{"org":"b","team":"t","time":"2026-12-01T10:00:00Z","request":"nope"}`),
				[]byte(`{"org":"a","team":"t"}`),
				[]byte(`{"team":"t","time":"2026-12-01T10:00:00Z"}`),
				[]byte(`{"org":"a","team":"t","time":"2026-12-01T10:00:00Z","request":{"tool":"Bash","input":{"command":"x"}}}` + strings.Repeat(" ", decisionsv1.MaxRecordBytes)),
			},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 7, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("", "", &clusterv1.ImpactCount{Evaluated: 4, Errors: 4}),
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 2, Errors: 2}),
			}},
		},
		{
			name: "sets that do not compile or fail are errors",
			records: [][]byte{
				rec{org: "a", team: "broken", cmd: "ls"}.json(),
				rec{org: "a", team: "cel", cmd: "ls"}.json(),
			},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 2, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "broken", &clusterv1.ImpactCount{Evaluated: 1, Errors: 1}),
				count("a", "cel", &clusterv1.ImpactCount{Evaluated: 1, Errors: 1}),
			}},
		},
		{
			name:    "a change that does not decide changes nothing",
			records: [][]byte{rec{org: "a", team: "labels", cmd: "rm -rf /"}.json(), rec{org: "a", team: "labels", cmd: "ls"}.json()},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 2, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "labels", &clusterv1.ImpactCount{Evaluated: 2, Unchanged: 2}),
			}},
		},
		{
			name: "hostile input stays data",
			records: [][]byte{
				// A CEL expression and a pattern as input values: evaluated
				// as strings, never compiled.
				[]byte(`{"org":"a","team":"t","time":"2026-12-01T10:00:00Z","request":{"tool":"Bash","input":{"command":"ls","x":"request.method == \"GET\" || true","y":"(((["}}}`),
				// Invalid UTF-8 becomes U+FFFD.
				[]byte("{\"org\":\"a\",\"team\":\"t\",\"time\":\"2026-12-01T10:00:00Z\",\"request\":{\"tool\":\"Bash\",\"input\":{\"command\":\"sudo \xff\xfe\"}}}"),
				// Deeper than the SDK walks: matches every deny pattern.
				[]byte(`{"org":"a","team":"t","time":"2026-12-01T10:00:00Z","request":{"tool":"Bash","input":{"command":` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 100) + `}}}`),
			},
			want: &clusterv1.LocalImpactResponse{NodeId: "n1", Scanned: 3, OldestUnixNano: oldest, Teams: []*clusterv1.ImpactCount{
				count("a", "t", &clusterv1.ImpactCount{Evaluated: 3, AllowToDeny: 1, Unchanged: 2,
					AllowToDenyExamples: [][]byte{[]byte("{\"org\":\"a\",\"team\":\"t\",\"time\":\"2026-12-01T10:00:00Z\",\"request\":{\"tool\":\"Bash\",\"input\":{\"command\":\"sudo \xff\xfe\"}}}")}}),
			}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.NodeID = "n1"
			var s testSets
			got, err := Replay(t.Context(), opts, scanOf(tc.records...), s.sets)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Replay (-want +got):\n%s", diff)
			}
			checkSums(t, got)
		})
	}
}

// checkSums checks that every team's evaluated records are counted once.
func checkSums(t testing.TB, resp *clusterv1.LocalImpactResponse) {
	t.Helper()
	for _, c := range resp.Teams {
		if sum := c.AllowToDeny + c.DenyToAllow + c.Unchanged + c.Errors; sum != c.Evaluated {
			t.Errorf("%s/%s: evaluated %d, but the counts sum to %d", c.Org, c.Team, c.Evaluated, sum)
		}
	}
}

// TestReplayCachesPerIdentity: the sets of an identity are asked for once,
// however many records it has.
func TestReplayCachesPerIdentity(t *testing.T) {
	var records [][]byte
	for i := range 1000 {
		records = append(records, rec{org: "a", team: "t", employee: fmt.Sprintf("e%d", i%3), cmd: "ls", i: i}.json())
	}
	var s testSets
	got, err := Replay(t.Context(), Options{}, scanOf(records...), s.sets)
	if err != nil {
		t.Fatal(err)
	}
	if s.calls != 3 {
		t.Errorf("sets called %d times, want 3", s.calls)
	}
	if got.Teams[0].Unchanged != 1000 {
		t.Errorf("unchanged = %d, want 1000", got.Teams[0].Unchanged)
	}
}

func TestReplayCutOff(t *testing.T) {
	records := make([][]byte, 10)
	for i := range records {
		records[i] = rec{org: "a", team: "t", cmd: "rm -rf /", i: i}.json()
	}
	t.Run("deadline passed", func(t *testing.T) {
		var s testSets
		got, err := Replay(t.Context(), Options{Deadline: time.Now().Add(-time.Second)}, scanOf(records...), s.sets)
		if err != nil {
			t.Fatal(err)
		}
		want := &clusterv1.LocalImpactResponse{CutOff: true, Teams: []*clusterv1.ImpactCount{}}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("Replay (-want +got):\n%s", diff)
		}
	})
	t.Run("ctx ends midway: the counts so far", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		scan := func(yield func([]byte) bool) error {
			for i, r := range records {
				if i == 4 {
					cancel()
				}
				if !yield(r) {
					return nil
				}
			}
			return nil
		}
		var s testSets
		got, err := Replay(ctx, Options{MaxExamples: 1}, scan, s.sets)
		if err != nil {
			t.Fatal(err)
		}
		want := &clusterv1.LocalImpactResponse{CutOff: true, Scanned: 4, OldestUnixNano: t0.UnixNano(), Teams: []*clusterv1.ImpactCount{
			{Org: "a", Team: "t", Evaluated: 4, DenyToAllow: 4, DenyToAllowExamples: [][]byte{records[0]}},
		}}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("Replay (-want +got):\n%s", diff)
		}
	})
}

func TestReplayScanError(t *testing.T) {
	boom := errors.New("segment damaged")
	scan := func(yield func([]byte) bool) error {
		yield(rec{org: "a", team: "t", cmd: "ls"}.json())
		return boom
	}
	var s testSets
	got, err := Replay(t.Context(), Options{}, scan, s.sets)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	if got.GetScanned() != 1 || len(got.GetTeams()) != 1 {
		t.Errorf("partial answer %v, want the record scanned before the error", got)
	}
}

// TestReplayKeepsExamplesPastTheScan: a scan may reuse its buffer once
// yield returns; the examples are copies.
func TestReplayKeepsExamplesPastTheScan(t *testing.T) {
	want := rec{org: "a", team: "t", cmd: "rm -rf /"}.json()
	scan := func(yield func([]byte) bool) error {
		buf := append([]byte(nil), want...)
		yield(buf)
		clear(buf)
		return nil
	}
	var s testSets
	got, err := Replay(t.Context(), Options{}, scan, s.sets)
	if err != nil {
		t.Fatal(err)
	}
	if ex := got.Teams[0].DenyToAllowExamples; len(ex) != 1 || string(ex[0]) != string(want) {
		t.Errorf("examples %q, want %q", ex, want)
	}
}

func TestOptionsFrom(t *testing.T) {
	req := &clusterv1.LocalImpactRequest{SinceUnixNano: t0.UnixNano(), Org: "a", Team: "t", MaxExamples: 5}
	got := OptionsFrom("n1", req)
	want := Options{NodeID: "n1", Org: "a", Team: "t", Since: time.Unix(0, t0.UnixNano()), MaxExamples: 5}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("OptionsFrom (-want +got):\n%s", diff)
	}
	if got := OptionsFrom("n1", &clusterv1.LocalImpactRequest{}); !got.Since.IsZero() {
		t.Errorf("Since = %v without since_unix_nano, want zero", got.Since)
	}
}
