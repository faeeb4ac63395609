// Package poll is the test suite's one way to wait for a condition: poll it
// with a deadline, backing off from 5 ms to 100 ms, and report the last
// reason it did not hold. Tests never sleep to wait.
package poll

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Defaults of Eventually and Until.
const (
	DefaultWithin = 10 * time.Second
	firstWait     = 5 * time.Millisecond
	maxWait       = 100 * time.Millisecond
)

type options struct{ within, every time.Duration }

// Option changes how long or how often Eventually polls.
type Option func(*options)

// Within sets the deadline (default DefaultWithin).
func Within(d time.Duration) Option { return func(o *options) { o.within = d } }

// Every polls at a fixed interval instead of backing off.
func Every(d time.Duration) Option { return func(o *options) { o.every = d } }

// Eventually polls cond until it returns nil, and fails t if the deadline
// passes first, naming what and cond's last error.
func Eventually(t testing.TB, what string, cond func() error, opts ...Option) {
	t.Helper()
	o := options{within: DefaultWithin}
	for _, opt := range opts {
		opt(&o)
	}
	if err := until(context.Background(), o, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Until polls cond until it returns nil, ctx ends or timeout passes; the
// error then names the timeout and wraps cond's last error. It is for
// helpers that return errors rather than fail a test.
func Until(ctx context.Context, timeout time.Duration, cond func() error) error {
	return until(ctx, options{within: timeout}, cond)
}

func until(ctx context.Context, o options, cond func() error) error {
	deadline := time.Now().Add(o.within)
	wait := firstWait
	if o.every > 0 {
		wait = o.every
	}
	for {
		err := cond()
		if err == nil {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("not within %v: %w", o.within, err)
		}
		timer := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w while waiting: %w", ctx.Err(), err)
		case <-timer.C:
		}
		if o.every == 0 {
			wait = min(2*wait, maxWait)
		}
	}
}

// Throughout polls cond for the whole of d, at the interval Every sets
// (default 50 ms), and fails t the first time it returns an error: the
// check that something does not happen within a window.
func Throughout(t testing.TB, what string, d time.Duration, cond func() error, opts ...Option) {
	t.Helper()
	o := options{every: 50 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	end := time.Now().Add(d)
	for {
		if err := cond(); err != nil {
			t.Fatalf("%s: %v", what, err)
			return
		}
		left := time.Until(end)
		if left <= 0 {
			return
		}
		timer := time.NewTimer(min(o.every, left))
		<-timer.C
	}
}

// errNotYet is what Holds reports while its condition is false.
var errNotYet = errors.New("the condition does not hold yet")

// Holds adapts a boolean condition to Eventually and Until.
func Holds(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}
}
