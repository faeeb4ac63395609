package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records Fatalf instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestEventually(t *testing.T) {
	for _, tc := range []struct {
		name     string
		holdsAt  int // the call at which cond first returns nil; 0: never
		opts     []Option
		wantFail string
	}{
		{"holds at once", 1, nil, ""},
		{"holds after a few tries", 4, []Option{Every(time.Millisecond)}, ""},
		{"never holds: the last error is reported", 0, []Option{Within(30 * time.Millisecond)}, "the thing: not within 30ms: try"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			calls := 0
			Eventually(r, "the thing", func() error {
				calls++
				if calls == tc.holdsAt {
					return nil
				}
				return fmt.Errorf("try %d", calls)
			}, tc.opts...)
			switch {
			case tc.wantFail == "" && r.failed != "":
				t.Fatalf("failed: %s", r.failed)
			case tc.wantFail != "" && !strings.HasPrefix(r.failed, tc.wantFail):
				t.Fatalf("failure %q, want it to start %q", r.failed, tc.wantFail)
			case tc.wantFail != "" && !strings.HasSuffix(r.failed, fmt.Sprintf("try %d", calls)):
				t.Fatalf("failure %q does not end with the last error (call %d)", r.failed, calls)
			case tc.holdsAt > 0 && calls != tc.holdsAt:
				t.Fatalf("cond called %d times, want %d", calls, tc.holdsAt)
			}
		})
	}
}

func TestUntil(t *testing.T) {
	last := errors.New("not yet")
	if err := Until(context.Background(), 20*time.Millisecond, func() error { return last }); !errors.Is(err, last) {
		t.Fatalf("Until = %v, want it to wrap the last error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Until(ctx, time.Hour, func() error { return last }); !errors.Is(err, context.Canceled) || !errors.Is(err, last) {
		t.Fatalf("Until with a canceled context = %v", err)
	}
	if err := Until(context.Background(), time.Hour, func() error { return nil }); err != nil {
		t.Fatalf("Until of a holding cond = %v", err)
	}
}

func TestThroughout(t *testing.T) {
	tests := []struct {
		name     string
		failAt   int // the call that returns an error; 0 for none
		wantFail bool
	}{
		{"holds the whole window", 0, false},
		{"fails on the third look", 3, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			calls := 0
			Throughout(r, "quiet", 30*time.Millisecond, func() error {
				calls++
				if calls == tc.failAt {
					return errors.New("it happened")
				}
				return nil
			}, Every(5*time.Millisecond))
			if got := r.failed != ""; got != tc.wantFail {
				t.Fatalf("failed = %q, want failure %v", r.failed, tc.wantFail)
			}
			if tc.wantFail && (calls != tc.failAt || !strings.HasPrefix(r.failed, "quiet: it happened")) {
				t.Fatalf("failure %q after %d calls", r.failed, calls)
			}
			if !tc.wantFail && calls < 3 {
				t.Fatalf("cond called %d times over the window, want at least 3", calls)
			}
		})
	}
}
