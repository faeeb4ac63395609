package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single p0", ms(7), 0, 7 * time.Millisecond},
		{"single p50", ms(7), 50, 7 * time.Millisecond},
		{"single p100", ms(7), 100, 7 * time.Millisecond},
		{"two p50 is the lower", ms(1, 2), 50, 1 * time.Millisecond},
		{"two p51 is the upper", ms(1, 2), 51, 2 * time.Millisecond},
		{"odd median", ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"even median", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p0 is the minimum", ms(3, 5, 9), 0, 3 * time.Millisecond},
		{"negative p is the minimum", ms(3, 5, 9), -10, 3 * time.Millisecond},
		{"p100 is the maximum", ms(3, 5, 9), 100, 9 * time.Millisecond},
		{"p above 100 is the maximum", ms(3, 5, 9), 150, 9 * time.Millisecond},
		{"1..100 p50", hundred, 50, 50 * time.Millisecond},
		{"1..100 p99", hundred, 99, 99 * time.Millisecond},
		{"1..100 p99.9", hundred, 99.9, 100 * time.Millisecond},
		{"1..100 p7 has no rounding error", hundred, 7, 7 * time.Millisecond},
		{"1..100 p1", hundred, 1, 1 * time.Millisecond},
		{"1..100 p0.5 rounds up to rank 1", hundred, 0.5, 1 * time.Millisecond},
		{"duplicates", ms(1, 1, 1, 10), 75, 1 * time.Millisecond},
		{"tail", ms(1, 1, 1, 10), 76, 10 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.sorted, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.sorted, tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	samples := []time.Duration{4 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	s := summarize(samples)
	want := latencySummary{count: 4, mean: 2500 * time.Microsecond, p50: 2 * time.Millisecond,
		p90: 4 * time.Millisecond, p99: 4 * time.Millisecond, max: 4 * time.Millisecond}
	if s != want {
		t.Errorf("summarize = %+v, want %+v", s, want)
	}
	if got := summarize(nil); got != (latencySummary{}) {
		t.Errorf("summarize(nil) = %+v, want zero", got)
	}
}
