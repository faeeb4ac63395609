package decisionlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	t0    = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	alice = policy.Identity{Org: "acme", Team: "pay", Employee: "alice"}
)

// newLog opens a log in a fresh directory whose clock stands at t0.
func newLog(t testing.TB, cfg Config) (*Log, *prometheus.Registry) {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(t.TempDir(), "decisions")
	}
	if cfg.MaxRecordsPerSecond == 0 {
		cfg.MaxRecordsPerSecond = 1000
	}
	reg := prometheus.NewRegistry()
	l, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), "n1", reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	l.now = func() time.Time { return t0 }
	t.Cleanup(func() { l.Close() })
	return l, reg
}

// rec encodes a record of alice's at t0+i ms.
func rec(i int, allowed bool, tool string) []byte {
	b, _ := json.Marshal(decisionsv1.Record{
		Time: t0.Add(time.Duration(i) * time.Millisecond), Org: "acme", Team: "pay", Employee: "alice",
		Request: decisionsv1.Request{Tool: tool, Input: map[string]any{"i": i}}, Allowed: allowed, Policy: "p-" + tool, Version: "v1",
	})
	return b
}

func batch(recs ...[]byte) Batch {
	return Batch{Identity: alice, ClientAddress: "sc-1", Transport: "grpc", Records: recs, Resent: true}
}

// stored decodes every record the log keeps, in arrival order.
func stored(t testing.TB, l *Log) []decisionsv1.Record {
	t.Helper()
	var out []decisionsv1.Record
	if err := l.Scan(context.Background(), time.Time{}, func(d []byte) bool {
		var r decisionsv1.Record
		if err := json.Unmarshal(d, &r); err != nil {
			t.Fatalf("stored record %q: %v", d, err)
		}
		out = append(out, r)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func dropped(reg *prometheus.Registry, reason string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "policyd_decisions_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestIngest(t *testing.T) {
	for _, tc := range []struct {
		name     string
		records  [][]byte
		want     Result
		reason   string // the dropped_total reason of the refused
		wantKept int
	}{
		{"valid", [][]byte{rec(0, true, "ls"), rec(1, false, "rm")}, Result{Accepted: 2}, "", 2},
		{"identity left empty is filled", [][]byte{[]byte(`{"time":"2026-12-04T10:00:00Z","allowed":true}`)}, Result{Accepted: 1}, "", 1},
		{"another employee", [][]byte{[]byte(`{"time":"2026-12-04T10:00:00Z","employee":"mallory"}`), rec(0, true, "ls")}, Result{Accepted: 1, Refused: 1}, "identity", 1},
		{"another team", [][]byte{[]byte(`{"time":"2026-12-04T10:00:00Z","team":"ops"}`)}, Result{Refused: 1}, "identity", 0},
		{"malformed JSON", [][]byte{[]byte(`{"time":`), []byte(`[]`), []byte(`{} {}`)}, Result{Refused: 3}, "invalid", 0},
		{"no time", [][]byte{[]byte(`{"allowed":true}`)}, Result{Refused: 1}, "invalid", 0},
		{"record over the cap", [][]byte{bytes.Repeat([]byte(" "), decisionsv1.MaxRecordBytes+1)}, Result{Refused: 1}, "too_large", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, reg := newLog(t, Config{})
			got, err := l.Ingest(batch(tc.records...))
			if err != nil {
				t.Fatalf("Ingest: %v", err)
			}
			if got != tc.want {
				t.Errorf("Ingest = %+v, want %+v", got, tc.want)
			}
			if tc.reason != "" && dropped(reg, tc.reason) != float64(tc.want.Refused) {
				t.Errorf("dropped{%s} = %v, want %d", tc.reason, dropped(reg, tc.reason), tc.want.Refused)
			}
			kept := stored(t, l)
			if len(kept) != tc.wantKept {
				t.Fatalf("kept %d records, want %d", len(kept), tc.wantKept)
			}
			for _, r := range kept {
				want := decisionsv1.Record{Org: "acme", Team: "pay", Employee: "alice", ClientAddress: "sc-1", Node: "n1", Transport: "grpc"}
				got := decisionsv1.Record{Org: r.Org, Team: r.Team, Employee: r.Employee, ClientAddress: r.ClientAddress, Node: r.Node, Transport: r.Transport}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("kept identity (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestIngestRefusesWholeBatch(t *testing.T) {
	huge := make([][]byte, decisionsv1.MaxBatchRecords+1)
	for i := range huge {
		huge[i] = rec(i, true, "ls")
	}
	for _, tc := range []struct {
		name string
		b    Batch
		is   error
	}{
		{"too many records", batch(huge...), ErrTooLarge},
		{"too many bytes", batch(slicesRepeat(bytes.Repeat([]byte("x"), decisionsv1.MaxRecordBytes), decisionsv1.MaxBatchBytes/decisionsv1.MaxRecordBytes+1)...), ErrTooLarge},
		{"absurd drop count", Batch{Identity: alice, Transport: "ws", Dropped: decisionsv1.Drops{BufferFull: 1 << 40}}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := newLog(t, Config{})
			if _, err := l.Ingest(tc.b); !errors.Is(err, tc.is) {
				t.Fatalf("Ingest = %v, want %v", err, tc.is)
			}
			if n := len(stored(t, l)); n != 0 {
				t.Errorf("kept %d records of a refused batch", n)
			}
		})
	}
}

func slicesRepeat(b []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func TestIngestRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name        string
		resent      bool
		wantDropped float64
	}{
		{"gRPC: the sidecar keeps the batch", true, 0},
		{"feed: the batch is lost and counted", false, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, reg := newLog(t, Config{MaxRecordsPerSecond: 10}) // a burst of 20
			b := batch()
			b.Resent = tc.resent
			for i := range 20 {
				b.Records = append(b.Records, rec(i, true, "ls"))
			}
			if _, err := l.Ingest(b); err != nil {
				t.Fatalf("first batch: %v", err)
			}
			b.Records = b.Records[:0]
			for i := range 30 {
				b.Records = append(b.Records, rec(100+i, true, "ls"))
			}
			if _, err := l.Ingest(b); !errors.Is(err, ErrRateLimited) {
				t.Fatalf("second batch = %v, want ErrRateLimited", err)
			}
			if got := dropped(reg, "rate_limited"); got != tc.wantDropped {
				t.Errorf("dropped{rate_limited} = %v, want %v", got, tc.wantDropped)
			}
			other := b
			other.ClientAddress = "sc-2"
			if _, err := l.Ingest(other); err == nil {
				t.Errorf("30 records from a fresh sidecar over a burst of 20 were taken")
			}
			other.Records = other.Records[:5]
			if _, err := l.Ingest(other); err != nil {
				t.Errorf("another sidecar's batch: %v (buckets are per sidecar)", err)
			}
		})
	}
}

func TestIngestDrops(t *testing.T) {
	l, reg := newLog(t, Config{})
	b := batch(rec(0, false, "rm"))
	b.Dropped = decisionsv1.Drops{SampledOut: 7, BufferFull: 3, RateLimited: 2, MaskFailed: 1}
	if _, err := l.Ingest(b); err != nil {
		t.Fatal(err)
	}
	kept := stored(t, l)
	if len(kept) != 2 || kept[1].Unrecorded == nil {
		t.Fatalf("kept %+v, want the record and an Unrecorded entry", kept)
	}
	if diff := cmp.Diff(b.Dropped, *kept[1].Unrecorded); diff != "" {
		t.Errorf("Unrecorded (-want +got):\n%s", diff)
	}
	for reason, want := range map[string]float64{"sdk_buffer_full": 3, "sdk_rate_limited": 2, "sdk_mask_failed": 1, "sampled_out": 0} {
		if got := dropped(reg, reason); got != want {
			t.Errorf("dropped{%s} = %v, want %v", reason, got, want)
		}
	}
	page, err := l.LocalDecisions(context.Background(), &clusterv1.LocalDecisionsRequest{})
	if err != nil || len(page.GetRecords()) != 1 {
		t.Errorf("LocalDecisions = %d records, %v; want the decision alone", len(page.GetRecords()), err)
	}
	if got := testutil.ToFloat64(l.received.WithLabelValues("grpc")); got != 1 {
		t.Errorf("received{grpc} = %v, want 1", got)
	}
}

func TestIngestKeepsHostileInputInert(t *testing.T) {
	l, _ := newLog(t, Config{})
	bad := []byte("{\"time\":\"2026-12-04T10:00:00Z\",\"request\":{\"tool\":\"rm\xff\xfe\",\"input\":{\"cmd\":\"<script>alert(1)</script>\",\"n\":12345678901234567890123,\"k\xc3\":\"\\ud800\"}},\"reason\":\"a\\u0000b\"}")
	if res, err := l.Ingest(batch(bad)); err != nil || res.Accepted != 1 {
		t.Fatalf("Ingest = %+v, %v", res, err)
	}
	var raw []byte
	if err := l.Scan(context.Background(), time.Time{}, func(d []byte) bool { raw = bytes.Clone(d); return true }); err != nil {
		t.Fatal(err)
	}
	if !json.Valid(raw) || !strings.Contains(string(raw), "12345678901234567890123") {
		t.Errorf("stored %s: want valid JSON keeping the number as written", raw)
	}
	if !bytes.Contains(raw, []byte("rm\ufffd\ufffd")) {
		t.Errorf("stored %s: want invalid UTF-8 replaced", raw)
	}
}

func TestLocalDecisionsFiltersAndPages(t *testing.T) {
	l, _ := newLog(t, Config{})
	var recs [][]byte
	for i := range 50 {
		recs = append(recs, rec(i, i%5 != 0, []string{"ls", "rm"}[i%2]))
	}
	if _, err := l.Ingest(batch(recs...)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	count := func(req *clusterv1.LocalDecisionsRequest) int {
		t.Helper()
		resp, err := l.LocalDecisions(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.GetRecords())
	}
	for _, tc := range []struct {
		name string
		req  *clusterv1.LocalDecisionsRequest
		want int
	}{
		{"all", &clusterv1.LocalDecisionsRequest{}, 50},
		{"denials", &clusterv1.LocalDecisionsRequest{Result: decisionsv1.ResultDeny}, 10},
		{"allows", &clusterv1.LocalDecisionsRequest{Result: decisionsv1.ResultAllow}, 40},
		{"policy", &clusterv1.LocalDecisionsRequest{Policy: "p-rm"}, 25},
		{"employee", &clusterv1.LocalDecisionsRequest{Employee: "alice"}, 50},
		{"someone else", &clusterv1.LocalDecisionsRequest{Employee: "bob"}, 0},
		{"org and team", &clusterv1.LocalDecisionsRequest{Org: "acme", Team: "pay"}, 50},
		{"since", &clusterv1.LocalDecisionsRequest{SinceUnixNano: t0.Add(40 * time.Millisecond).UnixNano()}, 10},
		{"until", &clusterv1.LocalDecisionsRequest{UntilUnixNano: t0.Add(5 * time.Millisecond).UnixNano()}, 5},
		{"limit", &clusterv1.LocalDecisionsRequest{Limit: 7}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := count(tc.req); got != tc.want {
				t.Errorf("%d records, want %d", got, tc.want)
			}
		})
	}

	// Paging newest first, page by page, sees each record once.
	var seen []string
	var before *clusterv1.DecisionKey
	for range 20 {
		resp, err := l.LocalDecisions(ctx, &clusterv1.LocalDecisionsRequest{Limit: 7, Before: before})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetRecords()) == 0 {
			break
		}
		for i, d := range resp.GetRecords() {
			var r decisionsv1.Record
			if err := json.Unmarshal(d, &r); err != nil {
				t.Fatal(err)
			}
			seen = append(seen, fmt.Sprint(r.Request.Input["i"]))
			before = resp.GetKeys()[i]
		}
	}
	var want []string
	for i := 49; i >= 0; i-- {
		want = append(want, fmt.Sprint(i))
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("paged newest first (-want +got):\n%s", diff)
	}
}

func TestExportRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "decisions.jsonl")
	l, _ := newLog(t, Config{ExportFile: path, ExportMaxBytes: 2000})
	for i := range 20 {
		if _, err := l.Ingest(batch(rec(i, true, "ls"))); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	lines := 0
	for _, f := range []string{path + ".1", path} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 2000 {
			t.Errorf("%s has %d bytes, over 2000", f, len(b))
		}
		for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			if !json.Valid(line) {
				t.Errorf("%s: line %q is not JSON", f, line)
			}
			lines++
		}
	}
	if lines < 5 || lines > 20 {
		t.Errorf("%d lines in the export and its rotation, want the newest of 20", lines)
	}
}

func TestMaskerHidesIdentity(t *testing.T) {
	m := NewMasker()
	r := decisionsv1.Record{Employee: "alice", ClientAddress: "10.0.0.7:5000"}
	m.Mask(&r)
	if strings.Contains(r.Employee, "alice") || strings.Contains(r.ClientAddress, "10.0.0.7") || !strings.HasPrefix(r.Employee, "masked:") {
		t.Errorf("masked record %+v still names its identity", r)
	}
	again := decisionsv1.Record{Employee: "alice"}
	m.Mask(&again)
	if again.Employee != r.Employee {
		t.Errorf("one masker hashed alice as %q and %q", r.Employee, again.Employee)
	}
}
