// Package backoff holds the waits of policyd's retry loops: an exponential
// schedule capped at a maximum, optionally jittered, and a sleep that ends
// early when its context does. It has no sentinel errors.
package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Exp is the wait after the n-th failed attempt: lo, 2·lo, 4·lo, … capped
// at hi; 0 for n = 0 (nothing has failed yet).
func Exp(n uint32, lo, hi time.Duration) time.Duration {
	if n == 0 || lo <= 0 {
		return 0
	}
	d := lo
	for i := uint32(1); i < n && d < hi; i++ {
		if d > hi/2 {
			return hi // and doubling cannot overflow
		}
		d *= 2
	}
	return min(d, hi)
}

// Backoff is the state of one retry loop: each Next is the following step
// of Exp. Not safe for concurrent use.
type Backoff struct {
	lo, hi time.Duration
	jitter bool
	n      uint32
}

// New returns a Backoff from lo to hi. With jitter, each wait gets up to a
// fifth more, at random, so that many loops that failed together (every
// controller after an API server restart) do not retry together.
func New(lo, hi time.Duration, jitter bool) *Backoff {
	return &Backoff{lo: lo, hi: hi, jitter: jitter}
}

// Next returns the wait before the next try.
func (b *Backoff) Next() time.Duration {
	if b.n < 64 {
		b.n++
	}
	d := Exp(b.n, b.lo, b.hi)
	if b.jitter && d > 0 {
		d += min(rand.N(d/5+1), math.MaxInt64-d)
	}
	return d
}

// Reset starts the schedule over, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Wait sleeps Next(); false if ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Sleep waits d; false if ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
