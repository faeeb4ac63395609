package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/poll"
)

// testFlush is the flush interval of the shipping tests: the least
// accepted, so that they take little time.
const testFlush = MinDecisionFlushInterval

// denyT denies calls whose input holds a string starting with "rm" (as
// evaluateN's do) and allows the rest.
func denyT() Policy { return tp("deny-rm", "*", "deny", "no rm", "^rm") }

// rm is the input of a denied call.
func rm() map[string]any { return map[string]any{"command": "rm"} }

// tools decodes records and returns their tools, in order.
func tools(t testing.TB, records [][]byte) []string {
	t.Helper()
	out := []string{}
	for _, b := range records {
		var r DecisionRecord
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("record %s: %v", b, err)
		}
		out = append(out, r.Request.Tool)
	}
	return out
}

// numbered is "t0", "t1", … up to n.
func numbered(from, n int) []string {
	out := []string{}
	for i := from; i < n; i++ {
		out = append(out, fmt.Sprintf("t%d", i))
	}
	return out
}

// evaluateN evaluates a call to tools t<from>…t<n-1>.
func evaluateN(c *Client, from, n int) {
	for i := from; i < n; i++ {
		c.Evaluate(context.Background(), Request{Tool: fmt.Sprintf("t%d", i), Input: rm()})
	}
}

// sumDrops adds the drop counts of batches.
func sumDrops(batches []*discoveryv1.DecisionBatch) decisionsv1.Drops {
	var d decisionsv1.Drops
	for _, b := range batches {
		d.SampledOut += b.GetDropped().GetSampledOut()
		d.BufferFull += b.GetDropped().GetBufferFull()
		d.RateLimited += b.GetDropped().GetRateLimited()
		d.MaskFailed += b.GetDropped().GetMaskFailed()
	}
	return d
}

// grpcRecords waits until the fake took n records and returns them in
// the order they came, checking every batch against the caps.
func grpcRecords(t *testing.T, f *fakeDiscovery, n int) ([][]byte, []*discoveryv1.DecisionBatch) {
	t.Helper()
	var records [][]byte
	var batches []*discoveryv1.DecisionBatch
	poll.Eventually(t, fmt.Sprintf("%d records shipped", n), func() error {
		batches, _ = f.decisionState()
		records = nil
		for _, b := range batches {
			records = append(records, b.GetRecords()...)
		}
		if len(records) < n {
			return fmt.Errorf("%d records in %d batches", len(records), len(batches))
		}
		return nil
	})
	for i, b := range batches {
		size := 0
		for _, r := range b.GetRecords() {
			size += len(r)
		}
		if len(b.GetRecords()) > decisionsv1.MaxBatchRecords || size > decisionsv1.MaxBatchBytes {
			t.Errorf("batch %d: %d records, %d bytes: over the caps", i, len(b.GetRecords()), size)
		}
		if b.GetClientAddress() != "sidecar-1" {
			t.Errorf("batch %d: client address %q", i, b.GetClientAddress())
		}
	}
	return records, batches
}

// TestShipGRPC: records reach the node in order, in batches within the
// caps, on the stream's connection with its token and client address;
// the drop counts go once, with the batch that follows them.
func TestShipGRPC(t *testing.T) {
	f := newFakeDiscovery("v1", denyT())
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1", Token: "jwt-1",
		DecisionLog: &DecisionLog{RatePerSecond: unlimited, AllowSampleRate: new(0.0), FlushInterval: testFlush}})
	c.waitState(t, StateReady)
	if got := f.reqs()[0].GetCapabilities(); !slices.Contains(got, feedv1.CapabilityDecisionLog) {
		t.Errorf("capabilities %v: no decision_log", got)
	}

	const count = 2*decisionsv1.MaxBatchRecords + 500
	evaluateN(c.Client, 0, count)
	for range 7 {
		c.Evaluate(context.Background(), Request{Tool: "allowed"}) // sampled out
	}
	records, batches := grpcRecords(t, f, count)
	if diff := cmp.Diff(numbered(0, count), tools(t, records)); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
	if len(batches) < 3 {
		t.Errorf("%d records in %d batches", count, len(batches))
	}
	// More sampled out after the records went: a batch of counts alone.
	for range 3 {
		c.Evaluate(context.Background(), Request{Tool: "allowed"})
	}
	poll.Eventually(t, "sampled-out counts shipped", func() error {
		batches, _ := f.decisionState()
		if got := sumDrops(batches); got != (decisionsv1.Drops{SampledOut: 10}) {
			return fmt.Errorf("drops %+v, want 10 sampled out", got)
		}
		return nil
	})
	s := total(t, c.Client)
	if s.Shipped != count || s.BufferedRecords != 0 || s.ShipFailures != 0 {
		t.Errorf("stats %+v", s)
	}
	f.mu.Lock()
	auth := slices.Compact(slices.Clone(f.decisionAuth))
	f.mu.Unlock()
	if !slices.Equal(auth, []string{"Bearer jwt-1"}) {
		t.Errorf("authorization of the batches %q", auth)
	}
}

// TestShipGRPCRefused: while the node refuses (ResourceExhausted), records
// stay buffered and their drop counts are kept; once it takes them, they
// arrive in order with the newer ones, and the counts go once.
func TestShipGRPCRefused(t *testing.T) {
	f := newFakeDiscovery("v1", denyT())
	f.refuseDecisions(codes.ResourceExhausted)
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1",
		DecisionLog: &DecisionLog{RatePerSecond: unlimited, AllowSampleRate: new(0.0), FlushInterval: testFlush}})
	c.waitState(t, StateReady)
	evaluateN(c.Client, 0, 10)
	c.Evaluate(context.Background(), Request{Tool: "allowed"})
	poll.Eventually(t, "two refused batches", func() error {
		if _, calls := f.decisionState(); calls < 2 {
			return fmt.Errorf("%d calls", calls)
		}
		return nil
	})
	if s := total(t, c.Client); s.BufferedRecords != 10 || s.Shipped != 0 || s.ShipFailures < 2 {
		t.Errorf("stats while refused %+v: want the 10 records buffered", s)
	}
	evaluateN(c.Client, 10, 15)
	f.refuseDecisions(codes.OK)
	records, batches := grpcRecords(t, f, 15)
	if diff := cmp.Diff(numbered(0, 15), tools(t, records)); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
	if got := sumDrops(batches); got != (decisionsv1.Drops{SampledOut: 1}) {
		t.Errorf("drops %+v, want the one sampled out once", got)
	}
	if s := total(t, c.Client); s.Shipped != 15 || s.BufferedRecords != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestShipGRPCOldNode: a node without ReportDecisions (Unimplemented) is
// asked once per connection; records stay buffered.
func TestShipGRPCOldNode(t *testing.T) {
	f := newFakeDiscovery("v1", denyT())
	f.refuseDecisions(codes.Unimplemented)
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1", HealthInterval: testFlush / 2,
		DecisionLog: &DecisionLog{RatePerSecond: unlimited, FlushInterval: testFlush}})
	c.waitState(t, StateReady)
	evaluateN(c.Client, 0, 3)
	poll.Eventually(t, "one call", func() error {
		if _, calls := f.decisionState(); calls != 1 {
			return fmt.Errorf("%d calls", calls)
		}
		return nil
	})
	// Health checks go every half flush interval: after ten, five flushes
	// would have asked again.
	_, health0 := f.counts()
	evaluateN(c.Client, 3, 5)
	poll.Eventually(t, "ten more health checks", func() error {
		if _, h := f.counts(); h < health0+10 {
			return fmt.Errorf("%d health checks", h-health0)
		}
		return nil
	})
	if _, calls := f.decisionState(); calls != 1 {
		t.Errorf("%d calls to a node without ReportDecisions, want 1", calls)
	}
	if s := total(t, c.Client); s.BufferedRecords != 5 {
		t.Errorf("stats %+v, want the 5 records buffered", s)
	}
}

// TestShipWS: decision_log is declared; batches go as decision_log frames
// once init says the server takes them, and on a resume answered by a
// replay, by what that server's last init said.
func TestShipWS(t *testing.T) {
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Token: "jwt-1",
		DecisionLog: &DecisionLog{RatePerSecond: unlimited, AllowSampleRate: new(0.0), FlushInterval: testFlush}})
	fc := ff.next(t)
	if got := fc.query.Get(feedv1.QueryCapabilities); got != "rollouts,shadow,decision_log" {
		t.Errorf("capabilities %q", got)
	}
	fc.send(t, map[string]any{"type": "init", "version": 10, "digest": "d10", "decision_log": true,
		"policies": []any{feedPolicy("deny-rm", "*", "deny", "no rm", "^rm")}})
	r.waitState(t, StateReady)
	evaluateN(r.Client, 0, 5)
	r.Evaluate(context.Background(), Request{Tool: "allowed"})
	got, drops := readBatches(t, fc, 5)
	if diff := cmp.Diff(numbered(0, 5), got); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
	if drops != (decisionsv1.Drops{SampledOut: 1}) {
		t.Errorf("drops %+v", drops)
	}

	// A resume answered with nothing (no init): the server's last init
	// holds.
	_ = fc.c.Close(websocket.StatusGoingAway, "bye")
	fc2 := ff.next(t)
	if got := fc2.query.Get("since"); got != "10" {
		t.Fatalf("since = %q", got)
	}
	evaluateN(r.Client, 5, 8)
	got, drops = readBatches(t, fc2, 3)
	if diff := cmp.Diff(numbered(5, 8), got); diff != "" {
		t.Fatalf("records after the resume (-want +got):\n%s", diff)
	}
	if drops != (decisionsv1.Drops{}) {
		t.Errorf("drops %+v sent twice", drops)
	}
	// Shipped counts a write once it returned, which may be after the
	// server read it.
	poll.Eventually(t, "8 shipped", func() error {
		if s := total(t, r.Client); s.Shipped != 8 || s.BufferedRecords != 0 {
			return fmt.Errorf("stats %+v", s)
		}
		return nil
	})
}

// TestShipWSNotTaken: a server whose init does not say decision_log gets
// no frame; the records stay buffered.
func TestShipWSNotTaken(t *testing.T) {
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Token: "jwt-1",
		DecisionLog: &DecisionLog{RatePerSecond: unlimited, FlushInterval: testFlush}})
	fc := ff.next(t)
	fc.send(t, map[string]any{"type": "init", "version": 10, "digest": "d10",
		"policies": []any{feedPolicy("deny-rm", "*", "deny", "no rm", "^rm")}})
	r.waitState(t, StateReady)
	evaluateN(r.Client, 0, 5)
	// Five flush intervals pass with nothing sent: the read ends at its
	// deadline, not with a frame.
	ctx, cancel := context.WithTimeout(context.Background(), 5*testFlush)
	defer cancel()
	if _, b, err := fc.c.Read(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read %q, %v: want nothing sent", b, err)
	}
	if s := total(t, r.Client); s.BufferedRecords != 5 || s.Shipped != 0 {
		t.Errorf("stats %+v, want the 5 records buffered", s)
	}
}

// readBatches reads decision_log frames until n records came, and returns
// their tools and the sum of their drop counts.
func readBatches(t *testing.T, fc *feedConn, n int) ([]string, decisionsv1.Drops) {
	t.Helper()
	var got []string
	var drops decisionsv1.Drops
	for len(got) < n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, b, err := fc.c.Read(ctx)
		cancel()
		if err != nil {
			t.Fatalf("read after %d records: %v", len(got), err)
		}
		var batch decisionsv1.Batch
		if err := json.Unmarshal(b, &batch); err != nil || batch.Type != decisionsv1.TypeDecisionLog {
			t.Fatalf("frame %s (%v): not a decision_log", b, err)
		}
		records := make([][]byte, len(batch.Records))
		for i, r := range batch.Records {
			records[i] = r
		}
		got = append(got, tools(t, records)...)
		drops.SampledOut += batch.Dropped.SampledOut
		drops.BufferFull += batch.Dropped.BufferFull
		drops.RateLimited += batch.Dropped.RateLimited
		drops.MaskFailed += batch.Dropped.MaskFailed
	}
	return got, drops
}

// TestTakeBatchCaps: a batch holds at most MaxBatchRecords records and
// shipBatchBytes bytes; a record over MaxRecordBytes is dropped, counted
// buffer_full and reported as such.
func TestTakeBatchCaps(t *testing.T) {
	for _, tc := range []struct {
		name      string
		inputSize int // bytes of each record's input
		n         int
		oversize  int   // index of a record over MaxRecordBytes; -1: none
		wantSizes []int // nil: not checked (every batch but the last is full)
	}{
		{"by records", 0, decisionsv1.MaxBatchRecords + 10, -1, []int{decisionsv1.MaxBatchRecords, 10}},
		{"by bytes", 60 << 10, 150, -1, nil},
		{"a record over the cap", 100, 5, 2, []int{4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := recordingClient(t, DecisionLog{RatePerSecond: unlimited, MaxBufferBytes: 64 << 20}, nil, []Policy{denyT()})
			for i := range tc.n {
				size := tc.inputSize
				if i == tc.oversize {
					size = decisionsv1.MaxRecordBytes
				}
				c.Evaluate(context.Background(), Request{Tool: fmt.Sprintf("t%d", i), Input: map[string]any{"command": "rm", "pad": strings.Repeat("x", size)}})
			}
			var sizes []int
			var got []string
			var batches [][][]byte
			for {
				batch, drops, more := c.dlog.takeBatch()
				if len(batch) == 0 {
					if more {
						t.Fatal("an empty batch with more to come")
					}
					break
				}
				bytes := 0
				for _, b := range batch {
					bytes += len(b)
				}
				if bytes > shipBatchBytes {
					t.Errorf("batch of %d bytes, over %d", bytes, shipBatchBytes)
				}
				if want := tc.oversize >= 0; (drops.BufferFull == 1) != want || drops.BufferFull > 1 {
					t.Errorf("drops %+v", drops)
				}
				sizes = append(sizes, len(batch))
				got = append(got, tools(t, batch)...)
				batches = append(batches, batch)
			}
			if tc.wantSizes != nil {
				if diff := cmp.Diff(tc.wantSizes, sizes); diff != "" {
					t.Errorf("batch sizes (-want +got):\n%s", diff)
				}
			}
			// A batch ends at a cap: the next record would not have fit.
			for i := 0; i+1 < len(batches); i++ {
				bytes := len(batches[i+1][0])
				for _, b := range batches[i] {
					bytes += len(b)
				}
				if len(batches[i]) < decisionsv1.MaxBatchRecords && bytes <= shipBatchBytes {
					t.Errorf("batch %d of %d records ended before a cap", i, len(batches[i]))
				}
			}
			if len(batches) < 2 && tc.oversize < 0 {
				t.Errorf("%d batches", len(batches))
			}
			want := numbered(0, tc.n)
			if tc.oversize >= 0 {
				want = slices.Delete(want, tc.oversize, tc.oversize+1)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			total(t, c)
		})
	}
}

func TestDecisionFlushIntervalConfig(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     time.Duration
		wantErr  string
	}{
		{"default", 0, DefaultDecisionFlushInterval, ""},
		{"least", MinDecisionFlushInterval, MinDecisionFlushInterval, ""},
		{"longer", time.Minute, time.Minute, ""},
		{"below the least", MinDecisionFlushInterval - 1, 0, "flush interval: 99.999999ms is below 100ms"},
		{"negative", -time.Second, 0, "flush interval: -1s is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Config{Servers: []string{"127.0.0.1:1"}, DecisionLog: &DecisionLog{FlushInterval: tc.interval}}, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.dlog.flush != tc.want {
				t.Errorf("flush interval %v, want %v", c.dlog.flush, tc.want)
			}
		})
	}
}

// floodRate is the rate cap of the flood test and benchmark.
const floodRate = 100

// floodClient is a ready client on a node that refuses every batch, with
// a small buffer and a rate cap on a fake clock.
func floodClient(t testing.TB, capBytes int) (*running, *fakeClock) {
	t.Helper()
	f := newFakeDiscovery("v1", denyT())
	f.refuseDecisions(codes.ResourceExhausted)
	n := serveDiscovery(t, f, "")
	clock := newFakeClock()
	r := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1", Clock: clock,
		DecisionLog: &DecisionLog{RatePerSecond: floodRate, MaxBufferBytes: capBytes, FlushInterval: testFlush}})
	r.waitState(t, StateReady)
	return r, clock
}

// flood evaluates n denied calls, a hundred times as many a (fake) second
// as the rate cap keeps, checking the buffer's cap on the way.
func flood(t testing.TB, r *running, clock *fakeClock, n, capBytes int) {
	step := time.Second / (100 * floodRate)
	req := Request{Tool: "t-flood", Input: map[string]any{"command": "rm -rf /", "n": 1}}
	for i := range n {
		r.Evaluate(context.Background(), req)
		clock.Advance(step)
		if i%1000 == 0 {
			if s := r.DecisionLogStats(); s.BufferedBytes > capBytes {
				t.Fatalf("after %d: %d bytes buffered, over the %d cap", i, s.BufferedBytes, capBytes)
			}
		}
	}
}

// TestDecisionFlood: at a hundred times the rate cap, with a node that
// refuses every batch, the buffer stays within its cap and every record
// is accounted for.
func TestDecisionFlood(t *testing.T) {
	const capBytes = 16 << 10
	r, clock := floodClient(t, capBytes)
	const n = 100 * floodRate * 10 // ten (fake) seconds
	flood(t, r, clock, n, capBytes)
	s := total(t, r.Client)
	if s.BufferedBytes > capBytes || s.Shipped != 0 {
		t.Errorf("stats %+v", s)
	}
	if kept := s.Recorded - s.Dropped.RateLimited; kept > floodRate*11+1 {
		t.Errorf("%d records past the rate cap of %d/s over 10s", kept, floodRate)
	}
	if s.Dropped.BufferFull == 0 {
		t.Errorf("stats %+v: the buffer never filled", s)
	}
}

// BenchmarkDecisionFlood evaluates at a hundred times the rate cap with a
// node refusing every batch, and reports the heap in use it leaves
// (heap-inuse-delta-B) and the bytes buffered, which stay within the
// default 16 MiB cap; -benchtime=12000000x fills it.
func BenchmarkDecisionFlood(b *testing.B) {
	const capBytes = DefaultDecisionBufferBytes
	r, clock := floodClient(b, capBytes)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	flood(b, r, clock, b.N, capBytes)
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	s := r.DecisionLogStats()
	if s.BufferedBytes > capBytes {
		b.Fatalf("%d bytes buffered, over the %d cap", s.BufferedBytes, capBytes)
	}
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse)), "heap-inuse-delta-B")
	b.ReportMetric(float64(s.BufferedBytes), "buffered-B")
	b.ReportMetric(math.Round(float64(s.Dropped.RateLimited)/float64(max(1, s.Recorded))*100), "rate-limited-%")
}

// memSource is a DecisionSource in memory: what the client's buffer gave
// it, in order, until shipped.
type memSource struct {
	mu      sync.Mutex
	records [][]byte
	peeked  int
}

func (m *memSource) add(records [][]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records = append(m.records, records...)
}

func (m *memSource) Peek(maxRecords, maxBytes int) ([][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, size := 0, 0
	for n < len(m.records) && n < maxRecords && size+len(m.records[n]) <= maxBytes {
		size += len(m.records[n])
		n++
	}
	m.peeked = n
	return slices.Clone(m.records[:n]), nil
}

func (m *memSource) Shipped(n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n > m.peeked {
		return fmt.Errorf("shipped %d of a peek of %d", n, m.peeked)
	}
	m.records, m.peeked = m.records[n:], 0
	return nil
}

func (m *memSource) held() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.records)
}

// TestShipFromSource: with a DecisionLog.Source, records ship from it, in
// its order; while the node refuses they stay in the source, and the
// client's own buffer is left to the program.
func TestShipFromSource(t *testing.T) {
	f := newFakeDiscovery("v1", denyT())
	f.refuseDecisions(codes.ResourceExhausted)
	n := serveDiscovery(t, f, "")
	src := &memSource{}
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1",
		DecisionLog: &DecisionLog{RatePerSecond: unlimited, AllowSampleRate: new(0.0), FlushInterval: testFlush, Source: src}})
	c.waitState(t, StateReady)
	evaluateN(c.Client, 0, decisionsv1.MaxBatchRecords+5)
	c.Evaluate(context.Background(), Request{Tool: "allowed"})
	src.add(c.TakeDecisions(math.MaxInt))
	evaluateN(c.Client, decisionsv1.MaxBatchRecords+5, decisionsv1.MaxBatchRecords+8) // left in the buffer
	poll.Eventually(t, "a refused batch", func() error {
		if _, calls := f.decisionState(); calls < 1 {
			return fmt.Errorf("%d calls", calls)
		}
		return nil
	})
	if got := src.held(); got != decisionsv1.MaxBatchRecords+5 {
		t.Errorf("source holds %d records after a refusal", got)
	}
	f.refuseDecisions(codes.OK)
	records, batches := grpcRecords(t, f, decisionsv1.MaxBatchRecords+5)
	if diff := cmp.Diff(numbered(0, decisionsv1.MaxBatchRecords+5), tools(t, records)); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
	if got := sumDrops(batches); got != (decisionsv1.Drops{SampledOut: 1}) {
		t.Errorf("drops %+v", got)
	}
	poll.Eventually(t, "the source emptied", func() error {
		if got := src.held(); got != 0 {
			return fmt.Errorf("%d held", got)
		}
		return nil
	})
	if s := total(t, c.Client); s.BufferedRecords != 3 || s.Shipped != decisionsv1.MaxBatchRecords+5 {
		t.Errorf("stats %+v", s)
	}
}

// TestShipFullBatchAtOnce: a full batch buffered ships without waiting for
// the flush interval.
func TestShipFullBatchAtOnce(t *testing.T) {
	f := newFakeDiscovery("v1", denyT())
	n := serveDiscovery(t, f, "")
	c := runClient(t, Config{Servers: []string{n.addr}, ClientAddress: "sidecar-1",
		DecisionLog: &DecisionLog{RatePerSecond: unlimited, FlushInterval: time.Hour}})
	c.waitState(t, StateReady)
	evaluateN(c.Client, 0, decisionsv1.MaxBatchRecords-1)
	if batches, _ := f.decisionState(); len(batches) != 0 {
		t.Fatalf("%d batches before a full one was buffered", len(batches))
	}
	evaluateN(c.Client, decisionsv1.MaxBatchRecords-1, decisionsv1.MaxBatchRecords)
	records, _ := grpcRecords(t, f, decisionsv1.MaxBatchRecords)
	if diff := cmp.Diff(numbered(0, decisionsv1.MaxBatchRecords), tools(t, records)); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
}
