package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// unlimited is a rate cap no test reaches.
const unlimited = 1e12

// recordingClient is a ready client holding set (unless it is nil: then it
// is still connecting) with the decision log dl.
func recordingClient(t testing.TB, dl DecisionLog, clock Clock, set []Policy) *Client {
	t.Helper()
	if clock == nil {
		clock = newFakeClock()
	}
	c, err := New(Config{
		Servers:       []string{"127.0.0.1:1"},
		Scope:         Scope{Org: "acme", Team: "eng", Employee: "alice"},
		ClientAddress: "sidecar-1",
		Clock:         clock,
		DecisionLog:   &dl,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		if err := c.install(sortByName(set), "v1", 0, true, "test"); err != nil {
			t.Fatal(err)
		}
		c.synced()
	}
	return c
}

// takeAll decodes every buffered record, oldest first.
func takeAll(t testing.TB, c *Client) []DecisionRecord {
	t.Helper()
	var out []DecisionRecord
	for _, b := range c.TakeDecisions(math.MaxInt) {
		var r DecisionRecord
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("record %s: %v", b, err)
		}
		out = append(out, r)
	}
	return out
}

// total checks that the counters add up and returns them.
func total(t testing.TB, c *Client) DecisionLogStats {
	t.Helper()
	s := c.DecisionLogStats()
	d := s.Dropped
	if got := uint64(s.BufferedRecords) + s.Taken + d.BufferFull + d.RateLimited + d.MaskFailed; got != s.Recorded {
		t.Errorf("buffered %d + taken %d + dropped %d/%d/%d = %d, want recorded %d",
			s.BufferedRecords, s.Taken, d.BufferFull, d.RateLimited, d.MaskFailed, got, s.Recorded)
	}
	return s
}

func TestDecisionRecordFields(t *testing.T) {
	clock := newFakeClock()
	set := []Policy{
		tp("deny-rm", "Bash", "deny", "no rm", "rm "),
		vp("only-get", val{`!has(request.method) || request.method == "GET"`, "GET only", "MethodNotAllowed"}),
		shadow(tp("shadow-deny-ls", "Bash", "deny", "", "^ls")),
		shadow(tp("shadow-allow-rm", "Bash", "deny", "", "^never")),
		shadow(vp("shadow-no-get", val{`!has(request.method) || request.method != "GET"`, "no GET", ""})),
	}
	c := recordingClient(t, DecisionLog{AllowSampleRate: new(1.0), Mask: DecisionMask{DropPaths: []string{"input.token"}}}, clock, set)
	ctx := context.Background()
	c.Evaluate(ctx, Request{Tool: "Bash", Input: map[string]any{"command": "rm -rf /", "token": "s1"}})
	c.Evaluate(ctx, Request{Tool: "Bash", Input: map[string]any{"command": "ls"}})
	c.Evaluate(ctx, Request{Request: map[string]any{"method": "POST", "headers": map[string]any{"Authorization": "Bearer s2"}}})
	c.Evaluate(ctx, Request{Request: map[string]any{"method": "GET"}})
	base := DecisionRecord{Time: clock.Now(), Org: "acme", Team: "eng", Employee: "alice", ClientAddress: "sidecar-1", Version: "v1"}
	with := func(f func(*DecisionRecord)) DecisionRecord { r := base; f(&r); return r }
	want := []DecisionRecord{
		with(func(r *DecisionRecord) {
			r.Request = DecisionRequest{Tool: "Bash", Input: map[string]any{"command": "rm -rf /"}}
			r.Policy, r.Message, r.Masked = "deny-rm", "no rm", true
			r.ShadowDisagreements = []string{"shadow-allow-rm", "shadow-deny-ls", "shadow-no-get"}
		}),
		with(func(r *DecisionRecord) {
			r.Request = DecisionRequest{Tool: "Bash", Input: map[string]any{"command": "ls"}}
			r.Allowed = true
			r.ShadowDisagreements = []string{"shadow-deny-ls"}
		}),
		with(func(r *DecisionRecord) {
			r.Request = DecisionRequest{HTTP: map[string]any{"method": "POST", "headers": map[string]any{}}}
			r.Policy, r.Message, r.Reason, r.Masked = "only-get", "GET only", "MethodNotAllowed", true
			r.ShadowDisagreements = []string{"shadow-no-get"}
		}),
		with(func(r *DecisionRecord) {
			r.Request = DecisionRequest{HTTP: map[string]any{"method": "GET"}}
			r.Allowed = true
			r.ShadowDisagreements = []string{"shadow-no-get"}
		}),
	}
	got := takeAll(t, c)
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(DecisionRecord{}, "LatencyUS")); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	for _, r := range got {
		if r.LatencyUS < 0 || r.LatencyUS > int64(time.Minute/time.Microsecond) {
			t.Errorf("latency_us %d", r.LatencyUS)
		}
	}
	if s := total(t, c); s.Recorded != 4 || s.Taken != 4 {
		t.Errorf("stats %+v, want 4 recorded and taken", s)
	}
	// The shadow counts are what they are without the log.
	if s := c.Stats(); s.ShadowWouldBlock != 2 || s.ShadowWouldAllow != 4 {
		t.Errorf("shadow counts %d/%d, want 2/4", s.ShadowWouldBlock, s.ShadowWouldAllow)
	}
}

// TestDecisionRecordJSONNames: the encoding carries the contract's names.
func TestDecisionRecordJSONNames(t *testing.T) {
	c := recordingClient(t, DecisionLog{}, nil, nil) // connecting: denies
	c.Evaluate(context.Background(), Request{Tool: "Bash", Input: map[string]any{"k": "v"}, Request: map[string]any{"m": "x"}})
	b := c.TakeDecisions(math.MaxInt)
	if len(b) != 1 {
		t.Fatalf("%d records, want 1", len(b))
	}
	var m map[string]any
	if err := json.Unmarshal(b[0], &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	want := []string{"allowed", "client_address", "employee", "latency_us", "masked", "message", "org", "request", "team", "time", "version"}
	if diff := cmp.Diff(want, keys, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"tool": "Bash", "input": map[string]any{"k": "v"}, "http": map[string]any{"m": "x"}}, m["request"]); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
	if m["message"] != ReasonConnecting || m["version"] != "" {
		t.Errorf("a denial by state: message %v, version %v", m["message"], m["version"])
	}
}

func TestDecisionIdentity(t *testing.T) {
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"bob","org":"initech","team":"ops"}`))
	token := "eyJhbGciOiJIUzI1NiJ9." + payload + ".sig"
	for _, tc := range []struct {
		name string
		cfg  Config
		want decisionIdentity
	}{
		{"scope", Config{Scope: Scope{Org: "o", Team: "t", Employee: "e"}}, decisionIdentity{"o", "t", "e"}},
		{"token claims win", Config{Scope: Scope{Org: "o", Employee: "e"}, Token: token}, decisionIdentity{"initech", "ops", "bob"}},
		{"not a JWT", Config{Scope: Scope{Org: "o"}, Token: "opaque"}, decisionIdentity{org: "o"}},
		{"feed employee", Config{Transport: TransportWS, Employee: "carol"}, decisionIdentity{employee: "carol"}},
		{"token source", Config{TokenSource: func(context.Context) (string, error) { return token, nil }}, decisionIdentity{"initech", "ops", "bob"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Servers = []string{"127.0.0.1:1"}
			tc.cfg.DecisionLog = &DecisionLog{}
			c, err := New(tc.cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.token(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := *c.dlog.identity.Load(); got != tc.want {
				t.Errorf("identity %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecisionSampling(t *testing.T) {
	const allows, denials = 20_000, 200
	for _, tc := range []struct {
		name string
		rate *float64
		want float64 // expected share of allows kept
	}{
		{"default", nil, DefaultAllowSampleRate},
		{"zero", new(0.0), 0},
		{"one", new(1.0), 1},
		{"a tenth", new(0.1), 0.1},
		{"half", new(0.5), 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := recordingClient(t, DecisionLog{AllowSampleRate: tc.rate, RatePerSecond: unlimited}, nil,
				[]Policy{tp("deny-rm", "Bash", "deny", "no", "rm")})
			ctx := context.Background()
			for i := range allows + denials {
				cmd := "ls"
				if i%(allows/denials+1) == 0 {
					cmd = "rm"
				}
				c.Evaluate(ctx, Request{Tool: "Bash", Input: map[string]any{"command": cmd}})
			}
			recs := takeAll(t, c)
			kept := 0
			denied := 0
			for _, r := range recs {
				if r.Allowed {
					kept++
				} else {
					denied++
				}
			}
			if denied != denials {
				t.Errorf("%d denials recorded, want all %d", denied, denials)
			}
			// Six standard deviations of the binomial: never off by chance.
			mean := tc.want * allows
			bound := 6 * math.Sqrt(allows*tc.want*(1-tc.want))
			if math.Abs(float64(kept)-mean) > bound {
				t.Errorf("%d allows kept of %d, want %v ± %.0f", kept, allows, mean, bound)
			}
			s := total(t, c)
			if s.Recorded != uint64(len(recs)) || s.SampledOut != uint64(allows-kept) {
				t.Errorf("stats %+v: want recorded %d, sampled out %d", s, len(recs), allows-kept)
			}
		})
	}
}

func TestDecisionRateCap(t *testing.T) {
	clock := newFakeClock()
	c := recordingClient(t, DecisionLog{RatePerSecond: 10, Burst: 5}, clock, []Policy{tp("deny-all", "*", "deny", "no")})
	deny := func(n int) {
		for range n {
			c.Evaluate(context.Background(), Request{Tool: "Bash"})
		}
	}
	steps := []struct {
		advance               time.Duration
		evaluate              int
		wantKept, wantLimited uint64 // cumulative
	}{
		{0, 20, 5, 15},                     // the burst
		{300 * time.Millisecond, 5, 8, 17}, // 3 tokens
		{time.Hour, 20, 13, 32},            // refilled to the burst, no more
		{50 * time.Millisecond, 1, 13, 33}, // half a token
		{50 * time.Millisecond, 1, 14, 33}, // the other half
	}
	for i, st := range steps {
		clock.Advance(st.advance)
		deny(st.evaluate)
		s := total(t, c)
		if kept := uint64(s.BufferedRecords); kept != st.wantKept || s.Dropped.RateLimited != st.wantLimited {
			t.Errorf("step %d: kept %d, rate limited %d; want %d, %d", i, kept, s.Dropped.RateLimited, st.wantKept, st.wantLimited)
		}
	}
}

// TestDecisionBufferCap floods the log with a hundred times the records
// its buffer holds, from several goroutines: the byte cap holds at every
// step, the oldest go, and the counters add up.
func TestDecisionBufferCap(t *testing.T) {
	const maxBytes = 32 << 10
	c := recordingClient(t, DecisionLog{MaxBufferBytes: maxBytes, RatePerSecond: unlimited}, nil, []Policy{tp("deny-all", "*", "deny", "no")})
	req := func(w, i int) Request {
		return Request{Tool: "Bash", Input: map[string]any{"command": fmt.Sprintf("w%d-%06d %s", w, i, strings.Repeat("x", 200))}}
	}
	c.Evaluate(context.Background(), req(0, 0))
	size := c.DecisionLogStats().BufferedBytes
	fit := maxBytes / size
	const workers = 4
	perWorker := 100 * fit / workers
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				c.Evaluate(context.Background(), req(w, i))
				if i%64 == 0 {
					if s := c.DecisionLogStats(); s.BufferedBytes > maxBytes {
						errs <- fmt.Sprintf("buffered %d bytes, over the cap %d", s.BufferedBytes, maxBytes)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	s := total(t, c)
	// Records differ by a few bytes (latency_us), so about fit are held.
	if s.BufferedBytes > maxBytes || s.BufferedRecords < fit*9/10 {
		t.Errorf("buffered %d records, %d bytes: want about %d within %d", s.BufferedRecords, s.BufferedBytes, fit, maxBytes)
	}
	if want := uint64(1 + workers*perWorker - s.BufferedRecords); s.Dropped.BufferFull != want {
		t.Errorf("buffer_full %d, want %d", s.Dropped.BufferFull, want)
	}
	// What is left is the newest, in order.
	const last = 9
	n := 3 * fit
	for i := range n {
		c.Evaluate(context.Background(), req(last, i))
	}
	s = total(t, c)
	batch := c.TakeDecisions(math.MaxInt)
	if got := len(bytes.Join(batch, nil)); got != s.BufferedBytes || len(batch) != s.BufferedRecords {
		t.Fatalf("took %d records, %d bytes; stats said %d, %d", len(batch), got, s.BufferedRecords, s.BufferedBytes)
	}
	var recs []DecisionRecord
	for _, b := range batch {
		var r DecisionRecord
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	for i, r := range recs {
		want := fmt.Sprintf("w%d-%06d", last, n-len(recs)+i)
		if got, _ := r.Request.Input["command"].(string); !strings.HasPrefix(got, want) {
			t.Fatalf("record %d of %d is %.10s, want %s: not the newest in order", i, len(recs), got, want)
		}
	}
	if st := c.DecisionLogStats(); st.BufferedBytes != 0 || st.BufferedRecords != 0 {
		t.Errorf("after taking all: %+v", st)
	}
	// A record larger than the whole buffer is dropped itself.
	c.Evaluate(context.Background(), Request{Tool: "Bash", Input: map[string]any{"big": strings.Repeat("y", maxBytes)}})
	if s2 := total(t, c); s2.Dropped.BufferFull != s.Dropped.BufferFull+1 || s2.BufferedRecords != 0 {
		t.Errorf("after a record over the cap: %+v", s2)
	}
}

// TestDecisionNeverBlocks: with the buffer full and nobody taking,
// Evaluate goes on deciding, while a shipper takes and returns batches.
func TestDecisionNeverBlocks(t *testing.T) {
	c := recordingClient(t, DecisionLog{MaxBufferBytes: 4 << 10, RatePerSecond: unlimited}, nil, []Policy{tp("deny-all", "*", "deny", "no")})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			c.ReturnDecisions(c.TakeDecisions(1 << 10))
		}
	})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for range 20_000 {
			if d := c.Evaluate(context.Background(), Request{Tool: "Bash", Input: map[string]any{"c": "x"}}); d.Allowed {
				t.Error("allowed")
				return
			}
		}
	}()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("Evaluate blocked with the decision buffer full")
	}
	close(done)
	wg.Wait()
	if s := total(t, c); s.Dropped.BufferFull == 0 || s.BufferedBytes > 4<<10 {
		t.Errorf("stats %+v: want drops, and the cap held", s)
	}
}

// TestDecisionRequestNotModified: recording masks a copy; the caller's
// request is not changed, and changing it afterwards does not change the
// record.
func TestDecisionRequestNotModified(t *testing.T) {
	mk := func() Request {
		return Request{
			Tool:  "Fetch",
			Input: map[string]any{"password": "s1", "items": []any{map[string]any{"secret": "s2", "id": "a"}}, "h": "x"},
			Request: map[string]any{"headers": map[string]any{"Authorization": "Bearer s3", "X-Token": "s4", "Accept": "*/*"},
				"list": []string{"a"}},
		}
	}
	c := recordingClient(t, DecisionLog{AllowSampleRate: new(1.0), Mask: DecisionMask{
		DropPaths: []string{"input.password", "input.items[*].secret"},
		HashPaths: []string{"request.headers.x-token", "input.h"},
	}}, nil, []Policy{})
	req := mk()
	c.Evaluate(context.Background(), req)
	if diff := cmp.Diff(mk(), req); diff != "" {
		t.Fatalf("the request changed (-before +after):\n%s", diff)
	}
	req.Input["items"].([]any)[0].(map[string]any)["id"] = "changed"
	req.Request["headers"].(map[string]any)["Accept"] = "changed"
	req.Request["list"].([]string)[0] = "changed"
	b := c.TakeDecisions(math.MaxInt)
	if len(b) != 1 {
		t.Fatalf("%d records", len(b))
	}
	for _, s := range []string{"changed", "s1", "s2", "s3", "s4"} {
		if bytes.Contains(b[0], []byte(s)) {
			t.Errorf("the record holds %q: %s", s, b[0])
		}
	}
}

func TestDecisionTakeReturn(t *testing.T) {
	c := recordingClient(t, DecisionLog{RatePerSecond: unlimited}, nil, []Policy{tp("deny-all", "*", "deny", "no")})
	for i := range 5 {
		c.Evaluate(context.Background(), Request{Tool: fmt.Sprintf("t%d", i)})
	}
	tools := func(batch [][]byte) (out []string) {
		for _, b := range batch {
			var r DecisionRecord
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			out = append(out, r.Request.Tool)
		}
		return out
	}
	size := c.DecisionLogStats().BufferedBytes / 5
	if got := tools(c.TakeDecisions(1)); !cmp.Equal(got, []string{"t0"}) {
		t.Errorf("Take(1) = %v, want one record however large", got)
	}
	b := c.TakeDecisions(2*size + size/2)
	if got := tools(b); !cmp.Equal(got, []string{"t1", "t2"}) {
		t.Errorf("Take(2 records' bytes) = %v", got)
	}
	c.Evaluate(context.Background(), Request{Tool: "t5"})
	c.ReturnDecisions(b)
	if s := total(t, c); s.Taken != 1 || s.BufferedRecords != 5 {
		t.Errorf("after a return: %+v", s)
	}
	if got := tools(c.TakeDecisions(math.MaxInt)); !cmp.Equal(got, []string{"t1", "t2", "t3", "t4", "t5"}) {
		t.Errorf("after a return, Take = %v: want the returned first, in order", got)
	}
	if c.TakeDecisions(math.MaxInt) != nil {
		t.Error("an empty buffer gave records")
	}

	// No room for a returned batch: its oldest are dropped.
	c2 := recordingClient(t, DecisionLog{RatePerSecond: unlimited, MaxBufferBytes: 3*size + size/2}, nil, []Policy{tp("deny-all", "*", "deny", "no")})
	for i := range 3 {
		c2.Evaluate(context.Background(), Request{Tool: fmt.Sprintf("t%d", i)})
	}
	b = c2.TakeDecisions(math.MaxInt)
	c2.Evaluate(context.Background(), Request{Tool: "t3"})
	c2.ReturnDecisions(b)
	if got := tools(c2.TakeDecisions(math.MaxInt)); !cmp.Equal(got, []string{"t1", "t2", "t3"}) {
		t.Errorf("Take = %v, want the oldest returned dropped", got)
	}
	if s := total(t, c2); s.Dropped.BufferFull != 1 {
		t.Errorf("stats %+v, want one dropped", s)
	}
}

func TestDecisionLogOff(t *testing.T) {
	c := readyClient(t, tp("deny-all", "*", "deny", "no"))
	c.Evaluate(context.Background(), Request{Tool: "Bash"})
	if s := c.DecisionLogStats(); s != (DecisionLogStats{}) {
		t.Errorf("stats %+v with the log off", s)
	}
	if b := c.TakeDecisions(math.MaxInt); b != nil {
		t.Errorf("records %q with the log off", b)
	}
	c.ReturnDecisions([][]byte{[]byte("{}")}) // does nothing
}

func TestDecisionLogConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dl      DecisionLog
		wantErr string
	}{
		{"defaults", DecisionLog{}, ""},
		{"rate below 0", DecisionLog{AllowSampleRate: new(-0.1)}, "allow sample rate"},
		{"rate above 1", DecisionLog{AllowSampleRate: new(1.5)}, "allow sample rate"},
		{"rate NaN", DecisionLog{AllowSampleRate: new(math.NaN())}, "allow sample rate"},
		{"negative buffer", DecisionLog{MaxBufferBytes: -1}, "max buffer bytes"},
		{"negative rate cap", DecisionLog{RatePerSecond: -1}, "rate per second"},
		{"infinite rate cap", DecisionLog{RatePerSecond: math.Inf(1)}, "rate per second"},
		{"negative burst", DecisionLog{Burst: -1}, "burst"},
		{"bad path", DecisionLog{Mask: DecisionMask{HashPaths: []string{"object.x"}}}, "hash paths[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Config{Servers: []string{"127.0.0.1:1"}, DecisionLog: &tc.dl}, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New = %v, want an error about %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			d := c.dlog
			if d.allowRate != DefaultAllowSampleRate || d.maxBytes != DefaultDecisionBufferBytes || d.rate != DefaultDecisionRate || d.burst != DefaultDecisionRate {
				t.Errorf("defaults: rate %v, bytes %d, cap %v/s burst %v", d.allowRate, d.maxBytes, d.rate, d.burst)
			}
			if len(d.mask.headers) != len(DefaultDropHeaders()) {
				t.Errorf("drop headers %v", d.mask.headers)
			}
		})
	}
}
