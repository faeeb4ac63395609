package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/policyd/policyd/internal/poll"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testLogger(t testing.TB) *slog.Logger {
	t.Helper()
	level := slog.LevelInfo
	if os.Getenv("POLICYD_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// recorder keeps what the callbacks saw.
type recorder struct {
	mu      sync.Mutex
	changes []string // "from->to"
	updates []Update
}

func (r *recorder) onState(from, to State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, fmt.Sprintf("%s->%s", from, to))
}

func (r *recorder) onUpdate(u Update) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.updates = append(r.updates, u)
}

func (r *recorder) transitions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.changes...)
}

func (r *recorder) allUpdates() []Update {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Update(nil), r.updates...)
}

// running is a client whose Run is in progress.
type running struct {
	*Client
	rec    *recorder
	cancel context.CancelFunc
	done   chan error
}

// newClient builds a client with the recorder hooked in, without running it.
func newClient(t testing.TB, cfg Config) (*Client, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg.OnStateChange = rec.onState
	cfg.OnUpdate = rec.onUpdate
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = 5 * time.Millisecond
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = 50 * time.Millisecond
	}
	c, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

// start runs c until the test ends.
func start(t testing.TB, c *Client, rec *recorder) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Client: c, rec: rec, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			if err != nil && !errors.Is(err, ErrRevoked) {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of its context ending")
		}
	})
	return r
}

func runClient(t testing.TB, cfg Config) *running {
	t.Helper()
	c, rec := newClient(t, cfg)
	return start(t, c, rec)
}

// wait returns Run's error once it has returned.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

func (r *running) waitState(t testing.TB, want State) {
	t.Helper()
	poll.Eventually(t, "state "+string(want), func() error {
		if got := r.State(); got != want {
			return fmt.Errorf("state %s", got)
		}
		return nil
	})

}

// waitTransitions waits until OnStateChange has reported exactly want.
func (r *running) waitTransitions(t *testing.T, want ...string) {
	t.Helper()
	poll.Eventually(t, fmt.Sprintf("transitions %v", want), func() error {
		if got := r.rec.transitions(); !slices.Equal(got, want) {
			return fmt.Errorf("transitions %v", got)
		}
		return nil
	})

}

// fakeClock is a Clock the test advances by hand.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
	fired   bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.stopped || t.fired {
		return false
	}
	t.stopped = true
	return true
}

// armed counts timers that are neither stopped nor fired.
func (c *fakeClock) armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped && !t.fired {
			n++
		}
	}
	return n
}

// Advance moves time on and runs the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, t := range c.timers {
		if !t.stopped && !t.fired && !t.at.After(c.now) {
			t.fired = true
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

func mustRevoked(t *testing.T, err error, mention string) {
	t.Helper()
	if !errors.Is(err, ErrRevoked) || !strings.Contains(err.Error(), mention) {
		t.Fatalf("Run returned %v, want ErrRevoked mentioning %q", err, mention)
	}
}
