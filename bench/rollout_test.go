package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/server/policyset"
)

func TestParsePercents(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "10,100", want: []int{10, 100}},
		{in: "5%, 25%, 100%", want: []int{5, 25, 100}},
		{in: "100", want: []int{100}},
		{in: "", wantErr: true},
		{in: "10,50", wantErr: true},
		{in: "50,50,100", wantErr: true},
		{in: "0,100", wantErr: true},
		{in: "10,101", wantErr: true},
		{in: "ten,100", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parsePercents(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parsePercents(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parsePercents(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestRolloutConfigValidate(t *testing.T) {
	good := func() rolloutConfig {
		return rolloutConfig{grpc: 10, ws: 10, nodes: 3, rounds: 1, stages: "10,100", bake: time.Hour,
			maxNack: 0.01, timeout: time.Second, connectTimeout: time.Second, startConcurrency: 1}
	}
	tests := []struct {
		name    string
		change  func(*rolloutConfig)
		wantErr bool
	}{
		{name: "defaults", change: func(*rolloutConfig) {}},
		{name: "no ws", change: func(c *rolloutConfig) { c.ws = 0 }},
		{name: "no grpc", change: func(c *rolloutConfig) { c.grpc = 0 }, wantErr: true},
		{name: "no rounds", change: func(c *rolloutConfig) { c.rounds = 0 }, wantErr: true},
		{name: "bad stages", change: func(c *rolloutConfig) { c.stages = "10,50" }, wantErr: true},
		{name: "bake under 1s", change: func(c *rolloutConfig) { c.bake = time.Millisecond }, wantErr: true},
		{name: "bake over a day", change: func(c *rolloutConfig) { c.bake = 25 * time.Hour }, wantErr: true},
		{name: "nack ratio 1", change: func(c *rolloutConfig) { c.maxNack = 1 }, wantErr: true},
		{name: "no timeout", change: func(c *rolloutConfig) { c.timeout = 0 }, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.change(&c)
			if err := c.validate(); (err != nil) != tt.wantErr {
				t.Fatalf("validate() = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

func TestHoldsBad(t *testing.T) {
	policy := func(reason string) client.Policy {
		var p struct {
			Spec json.RawMessage `json:"spec"`
		}
		if err := json.Unmarshal(rolloutPolicyBody("o", reason), &p); err != nil {
			t.Fatal(err)
		}
		return client.Policy{Name: rolloutPolicyName, Spec: p.Spec}
	}
	tests := []struct {
		name string
		set  []client.Policy
		want bool
	}{
		{name: "empty", want: false},
		{name: "stable", set: []client.Policy{policy(stableReason)}, want: false},
		{name: "bad", set: []client.Policy{policy(stableReason), policy(badReason)}, want: true},
		{name: "reason containing bad", set: []client.Policy{policy("not bad")}, want: false},
		{name: "undecodable spec", set: []client.Policy{{Spec: json.RawMessage(`[`)}}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := holdsBad(tt.set); got != tt.want {
				t.Errorf("holdsBad = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRollbackProbe: a rejection is recorded once per round and only for
// the marked candidate; a WebSocket sidecar is back when an update of the
// stable version follows its rejection; a gRPC sidecar waits until its
// Stats count a response after the rejection.
func TestRollbackProbe(t *testing.T) {
	newSDK := func(cfg client.Config) *client.Client {
		sdk, err := client.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return sdk
	}
	g := &sidecar{idx: 0, kind: kindGRPC, id: "g"}
	w := &sidecar{idx: 1, kind: kindWS, id: "w"}
	sf := &sdkFleet{fleet: &fleet{base: time.Now().Add(-time.Second), cars: []*sidecar{g, w}}, clients: []*client.Client{
		newSDK(client.Config{Servers: []string{"127.0.0.1:1"}, ClientAddress: "g"}),
		newSDK(client.Config{Servers: []string{"127.0.0.1:1"}, Transport: client.TransportWS, Employee: "w"}),
	}}
	p := newRollbackProbe("stable-version", 2)
	p.fleet.Store(sf)
	body := func(reason string) []client.Policy {
		spec, _ := json.Marshal(map[string]string{"reason": reason})
		return []client.Policy{{Name: rolloutPolicyName, Spec: spec}}
	}

	if err := p.apply(g, body(stableReason)); err != nil {
		t.Fatalf("apply(stable) = %v", err)
	}
	p.onUpdate(w, client.Update{Version: "stable-version", Policies: body(stableReason)}, time.Second)
	if got := p.cars[1].stableAt.Load(); got != notHeld {
		t.Errorf("a ws update before any rejection counted as stable again at %v", time.Duration(got))
	}
	if n := p.pollGRPC(); n != 0 {
		t.Errorf("pollGRPC before any rejection = %d waiting, want 0", n)
	}

	for _, c := range []*sidecar{g, w} {
		if err := p.apply(c, body(badReason)); err == nil {
			t.Fatalf("apply(bad) on %s = nil, want a rejection", c.id)
		}
	}
	first := p.cars[0].rejectedAt.Load()
	if first == notHeld {
		t.Fatal("the gRPC rejection was not recorded")
	}
	if err := p.apply(g, body(badReason)); err == nil {
		t.Fatal("second apply(bad) = nil")
	}
	if got := p.cars[0].rejectedAt.Load(); got != first {
		t.Errorf("a second rejection moved rejectedAt from %v to %v", time.Duration(first), time.Duration(got))
	}

	// The gRPC sidecar has had no response since: still waiting, as is
	// the ws one until its stable update.
	if n := p.pollGRPC(); n != 2 {
		t.Errorf("pollGRPC after the rejections = %d waiting, want 2", n)
	}
	p.onUpdate(w, client.Update{Version: "other-version", Policies: body(stableReason)}, 2*time.Second)
	p.onUpdate(w, client.Update{Version: "stable-version", Policies: body(stableReason)}, 3*time.Second)
	if got := time.Duration(p.cars[1].stableAt.Load()); got != 3*time.Second {
		t.Errorf("ws stable again at %v, want 3s (the stable version's update)", got)
	}
	if n := p.pollGRPC(); n != 1 {
		t.Errorf("pollGRPC after the ws update = %d waiting, want 1 (the gRPC sidecar)", n)
	}

	p.reset()
	for i := range p.cars {
		if p.cars[i].rejectedAt.Load() != notHeld || p.cars[i].stableAt.Load() != notHeld {
			t.Errorf("car %d not reset", i)
		}
	}
}

func TestRolloutFigureFor(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	cfg := rolloutConfig{grpc: 10, ws: 10, nodes: 3, stages: "10,100", maxNack: 0.01}
	rounds := []*roundResult{
		{Cohort: [2]int{3, 2}, Rejected: [2]int{3, 2}, Stable: [2]int{3, 2}, NackToHaltMs: 50,
			fromNack: [2][]time.Duration{ms(100, 200, 300), ms(150, 250)}, fromHalt: [2][]time.Duration{ms(50, 150, 250), ms(100, 200)}},
		{Cohort: [2]int{2, 1}, Rejected: [2]int{2, 1}, Stable: [2]int{2, 1}, NackToHaltMs: 80,
			fromNack: [2][]time.Duration{ms(400, 500), ms(900)}, fromHalt: [2][]time.Duration{ms(320, 420), ms(820)}},
	}
	tests := []struct {
		transport         string
		cohort            int
		p50, max, haltMax float64
	}{
		{transport: "grpc", cohort: 5, p50: 300, max: 500, haltMax: 420},
		{transport: "ws", cohort: 3, p50: 250, max: 900, haltMax: 820},
		{transport: "all", cohort: 8, p50: 250, max: 900, haltMax: 820},
	}
	for _, tt := range tests {
		t.Run(tt.transport, func(t *testing.T) {
			f := rolloutFigureFor(cfg, tt.transport, rounds)
			if f.Cohort != tt.cohort || f.Rejected != tt.cohort || f.Stable != tt.cohort || f.Missing != 0 {
				t.Errorf("cohort/rejected/stable/missing = %d/%d/%d/%d, want %d/%d/%d/0", f.Cohort, f.Rejected, f.Stable, f.Missing, tt.cohort, tt.cohort, tt.cohort)
			}
			if f.P50Ms != tt.p50 || f.MaxMs != tt.max || f.P99Ms != tt.max || f.HaltMaxMs != tt.haltMax {
				t.Errorf("p50/p99/max/halt max = %g/%g/%g/%g, want %g/%g/%g/%g", f.P50Ms, f.P99Ms, f.MaxMs, f.HaltMaxMs, tt.p50, tt.max, tt.max, tt.haltMax)
			}
			if diff := cmp.Diff([]float64{50, 80}, f.NackToHaltMs); diff != "" {
				t.Errorf("NackToHaltMs (-want +got):\n%s", diff)
			}
			if !f.TargetMet {
				t.Error("target not met with every p99 under 1 s")
			}
		})
	}

	slow := []*roundResult{{Cohort: [2]int{1, 0}, Rejected: [2]int{1, 0}, Stable: [2]int{1, 0}, fromNack: [2][]time.Duration{ms(1001)}}}
	if f := rolloutFigureFor(cfg, "grpc", slow); f.TargetMet {
		t.Error("target met with p99 1001 ms")
	}
	missing := []*roundResult{{Cohort: [2]int{2, 0}, Rejected: [2]int{2, 0}, Stable: [2]int{1, 0}, fromNack: [2][]time.Duration{ms(10)}}}
	if f := rolloutFigureFor(cfg, "grpc", missing); f.TargetMet || f.Missing != 1 {
		t.Errorf("a rejecting sidecar never back: met %v, missing %d; want not met, 1 missing", f.TargetMet, f.Missing)
	}
}

// TestRoundMeasure: the cohort is the hash's, the halt condition the first
// gRPC rejection in it, and each returning cohort sidecar's latencies are
// counted from it and from the halt decision.
func TestRoundMeasure(t *testing.T) {
	const id, percent = "r42", 50
	sf := &sdkFleet{fleet: &fleet{base: time.Now()}}
	// Two gRPC sidecars and a ws one in the cohort, and one outside it.
	var in, out []*sidecar
	for i := 0; len(in) < 3 || len(out) < 1; i++ {
		k := kindGRPC
		if len(in) == 2 {
			k = kindWS
		}
		c := &sidecar{kind: k, id: sidecarID(k, i)}
		switch inCohort := policyset.InCohort(id, c.id, percent); {
		case inCohort && len(in) < 3:
			in = append(in, c)
		case !inCohort && len(out) < 1:
			out = append(out, c)
		default:
			continue
		}
		c.idx = len(sf.cars)
		sf.cars = append(sf.cars, c)
	}
	p := newRollbackProbe("v", len(sf.cars))
	set := func(c *sidecar, rejected, stable time.Duration, rejections int64) {
		p.cars[c.idx].rejectedAt.Store(int64(rejected))
		p.cars[c.idx].stableAt.Store(int64(stable))
		p.cars[c.idx].rejections.Store(rejections)
	}
	set(in[0], 110*time.Millisecond, 400*time.Millisecond, 1)
	set(in[1], 105*time.Millisecond, 350*time.Millisecond, 1)
	set(in[2], 120*time.Millisecond, 380*time.Millisecond, 1)
	set(out[0], 130*time.Millisecond, notHeld, 1)

	r := &roundResult{ID: id}
	r.measure(sf, p, percent, 100*time.Millisecond, 300*time.Millisecond)
	firstNack, lastNack := 105*time.Millisecond, 110*time.Millisecond // the two gRPC ones
	if r.OutsideRejections != 1 || r.RepeatRejections != 0 {
		t.Errorf("outside/repeat rejections = %d/%d, want 1/0", r.OutsideRejections, r.RepeatRejections)
	}
	if got := r.Cohort[kindGRPC] + r.Cohort[kindWS]; got != 3 || r.Rejected != r.Cohort || r.Stable != r.Cohort {
		t.Errorf("cohort %v, rejected %v, stable %v; want 3 in all, every one rejected and back", r.Cohort, r.Rejected, r.Stable)
	}
	if want := ms(firstNack - 100*time.Millisecond); r.PostToNackMs != want {
		t.Errorf("PostToNackMs = %g, want %g", r.PostToNackMs, want)
	}
	if want := ms(300*time.Millisecond - firstNack); r.NackToHaltMs != want {
		t.Errorf("NackToHaltMs = %g, want %g", r.NackToHaltMs, want)
	}
	if want := ms(lastNack - firstNack); r.NackSpreadMs != want {
		t.Errorf("NackSpreadMs = %g, want %g", r.NackSpreadMs, want)
	}
	var got []time.Duration
	for _, k := range []sidecarKind{kindGRPC, kindWS} {
		got = append(got, r.fromNack[k]...)
		for i, d := range r.fromHalt[k] {
			if d+300*time.Millisecond != r.fromNack[k][i]+firstNack {
				t.Errorf("%s sample %d: from halt %v and from the first NACK %v disagree", k, i, d, r.fromNack[k][i])
			}
		}
	}
	if len(got) != 3 {
		t.Errorf("%d samples, want 3", len(got))
	}
}
