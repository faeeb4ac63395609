package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReasonSeqRoundTrip(t *testing.T) {
	for _, seq := range []uint64{0, 1, 42, 999999999999} {
		name := policyName(3, 7)
		body := policyBody(nil, name, seq, 1024)
		var p struct {
			Spec struct {
				Reason string `json:"reason"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatal(err)
		}
		got, ok := reasonSeq(p.Spec.Reason)
		if !ok || got != seq {
			t.Errorf("reasonSeq(policyBody seq %d) = %d, %v", seq, got, ok)
		}
	}
	for _, bad := range []string{"", "bench write ", "bench write 12x", "other 000000000001 x", "bench write abcdefghijkl x"} {
		if got, ok := reasonSeq(bad); ok {
			t.Errorf("reasonSeq(%q) = %d, true; want false", bad, got)
		}
	}
}

func TestParseSeqs(t *testing.T) {
	a := policyBody(nil, "bench-w0-0", 5, 512)
	b := policyBody(nil, "bench-w1-3", 17, 512)
	body := `{"policies":[` + string(a) + `,` + string(b) +
		`,{"name":"other","spec":{"reason":"hand-written"}}],"applied_index":9}`
	got, err := parseSeqs([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"bench-w0-0": 5, "bench-w1-3": 17}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseSeqs (-want +got):\n%s", diff)
	}
	if _, err := parseSeqs([]byte(`{"policies":`)); err == nil {
		t.Error("parseSeqs(truncated) = nil error")
	}
}

func TestLostWrites(t *testing.T) {
	for _, tc := range []struct {
		name          string
		acked, stored map[string]uint64
		want          []string
	}{
		{"none acked", nil, map[string]uint64{"a": 1}, nil},
		{"all there", map[string]uint64{"a": 3, "b": 9}, map[string]uint64{"a": 3, "b": 9, "c": 1}, nil},
		// A later write whose answer was lost may have been applied.
		{"newer stored", map[string]uint64{"a": 3}, map[string]uint64{"a": 4}, nil},
		{"older stored", map[string]uint64{"a": 3}, map[string]uint64{"a": 2},
			[]string{"a: acknowledged seq 3, stored 2"}},
		{"missing", map[string]uint64{"b": 1, "a": 3}, map[string]uint64{},
			[]string{"a: acknowledged seq 3, missing", "b: acknowledged seq 1, missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, lostWrites(tc.acked, tc.stored)); diff != "" {
				t.Errorf("lostWrites (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummarizeFailover(t *testing.T) {
	cfg := failoverConfig{rounds: 3, writers: 20, grpc: 200, ws: 200}
	round := func(leader, writes, current float64, lost int) *failoverRoundFigure {
		return &failoverRoundFigure{NewLeaderMs: leader, WritesResumedMs: writes, AllCurrentMs: current,
			AllReconnectedMs: current / 2, Acked: 100, LostWrites: lost}
	}
	for _, tc := range []struct {
		name                         string
		rounds                       []*failoverRoundFigure
		wantLeaderMed, wantLeaderMax float64
		wantCurrentMax               float64
		wantMet                      bool
	}{
		{"met", []*failoverRoundFigure{round(1500, 1600, 2000, 0), round(900, 1000, 1500, 0), round(2500, 2600, 4000, 0)},
			1500, 2500, 4000, true},
		{"slow leader", []*failoverRoundFigure{round(1500, 1600, 2000, 0), round(3100, 3200, 3500, 0), round(900, 1000, 1500, 0)},
			1500, 3100, 3500, false},
		{"slow sidecars", []*failoverRoundFigure{round(1500, 1600, 2000, 0), round(900, 1000, 5001, 0), round(1000, 1100, 1500, 0)},
			1000, 1500, 5001, false},
		{"lost write", []*failoverRoundFigure{round(1500, 1600, 2000, 1), round(900, 1000, 1500, 0), round(1000, 1100, 1500, 0)},
			1000, 1500, 2000, false},
		{"missing round", []*failoverRoundFigure{round(1500, 1600, 2000, 0), round(900, 1000, 1500, 0)},
			900, 1500, 2000, false},
		{"no rounds", nil, 0, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := summarizeFailover(cfg, tc.rounds)
			if f.NewLeaderMedianMs != tc.wantLeaderMed || f.NewLeaderMaxMs != tc.wantLeaderMax {
				t.Errorf("new leader median/max = %v/%v, want %v/%v", f.NewLeaderMedianMs, f.NewLeaderMaxMs, tc.wantLeaderMed, tc.wantLeaderMax)
			}
			if f.AllCurrentMaxMs != tc.wantCurrentMax {
				t.Errorf("all current max = %v, want %v", f.AllCurrentMaxMs, tc.wantCurrentMax)
			}
			if f.TargetMet != tc.wantMet {
				t.Errorf("target met = %v, want %v", f.TargetMet, tc.wantMet)
			}
			if f.Rounds != len(tc.rounds) || f.Acked != 100*len(tc.rounds) {
				t.Errorf("rounds/acked = %d/%d", f.Rounds, f.Acked)
			}
			if len(f.row()) != len(f.columns()) {
				t.Errorf("row has %d cells, columns %d", len(f.row()), len(f.columns()))
			}
		})
	}
}

func TestServerHost(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:4000":                  "127.0.0.1:4000",
		"ws://127.0.0.1:4000/ws/policies": "127.0.0.1:4000",
		"http://127.0.0.1:40001":          "127.0.0.1:40001",
		"dns:///127.0.0.1:4000":           "dns:///127.0.0.1:4000",
		"":                                "",
	} {
		if got := serverHost(in); got != want {
			t.Errorf("serverHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFailoverValidate(t *testing.T) {
	ok := failoverConfig{rounds: 3, writers: 20, keys: 20, valueSize: 4096, grpc: 200, ws: 200,
		before: time.Second, after: time.Second, timeout: time.Second, connectTimeout: time.Second}
	if err := ok.validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mutate := range map[string]func(*failoverConfig){
		"no rounds":    func(c *failoverConfig) { c.rounds = 0 },
		"no writers":   func(c *failoverConfig) { c.writers = 0 },
		"tiny value":   func(c *failoverConfig) { c.valueSize = 10 },
		"huge value":   func(c *failoverConfig) { c.valueSize = maxBodySize + 1 },
		"negative ws":  func(c *failoverConfig) { c.ws = -1 },
		"zero timeout": func(c *failoverConfig) { c.timeout = 0 },
	} {
		c := ok
		mutate(&c)
		if err := c.validate(); err == nil {
			t.Errorf("%s: validate() = nil", name)
		} else if strings.Contains(err.Error(), "\n\n") {
			t.Errorf("%s: odd error %q", name, err)
		}
	}
}
