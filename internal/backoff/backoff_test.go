package backoff

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestExp(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name   string
		n      uint32
		lo, hi time.Duration
		want   time.Duration
	}{
		{"nothing failed", 0, s, 30 * s, 0},
		{"first", 1, s, 30 * s, s},
		{"second", 2, s, 30 * s, 2 * s},
		{"fifth", 5, s, 30 * s, 16 * s},
		{"capped", 6, s, 30 * s, 30 * s},
		{"huge n", 1 << 31, s, 30 * s, 30 * s},
		{"lo above hi", 1, 2 * s, s, s},
		{"zero lo", 3, 0, s, 0},
		{"no overflow", 100, s, math.MaxInt64, math.MaxInt64},
		{"just under the cap", 3, s, 5 * s, 4 * s},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Exp(tt.n, tt.lo, tt.hi); got != tt.want {
				t.Errorf("Exp(%d, %v, %v) = %v, want %v", tt.n, tt.lo, tt.hi, got, tt.want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	for _, jitter := range []bool{false, true} {
		t.Run(map[bool]string{false: "exact", true: "jitter"}[jitter], func(t *testing.T) {
			b := New(time.Second, 30*time.Second, jitter)
			want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
			for i, w := range want {
				w *= time.Second
				d := b.Next()
				if d < w || d > w+w/5 || !jitter && d != w {
					t.Fatalf("try %d: %v, want %v (plus up to a fifth with jitter)", i, d, w)
				}
			}
			b.Reset()
			if d := b.Next(); d < time.Second || d > time.Second+time.Second/5 {
				t.Errorf("after Reset: %v, want about 1s", d)
			}
		})
	}
}

func TestBackoffHugeCap(t *testing.T) {
	b := New(time.Second, math.MaxInt64, true)
	for i := range 100 {
		if d := b.Next(); d <= 0 {
			t.Fatalf("try %d: %v, want a positive wait", i, d)
		}
	}
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep with a live context returned false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep with an ended context returned true")
	}
}
