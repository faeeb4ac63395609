package kubetest

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestStartWithoutAssets(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", "")
	env, err := Start(Options{})
	if !errors.Is(err, ErrNoAssets) || env != nil {
		t.Fatalf("Start() = %v, %v; want nil, ErrNoAssets", env, err)
	}
}

func TestPoll(t *testing.T) {
	t.Run("until cond holds", func(t *testing.T) {
		calls := 0
		err := Poll(time.Minute, func() error {
			if calls++; calls < 3 {
				return fmt.Errorf("call %d", calls)
			}
			return nil
		})
		if err != nil || calls != 3 {
			t.Fatalf("Poll = %v after %d calls; want nil after 3", err, calls)
		}
	})
	t.Run("last error after the timeout", func(t *testing.T) {
		calls := 0
		err := Poll(50*time.Millisecond, func() error {
			calls++
			return fmt.Errorf("call %d", calls)
		})
		if want := fmt.Sprintf("call %d", calls); err == nil || err.Error() != want || calls < 2 {
			t.Fatalf("Poll = %v after %d calls; want %q and more than one call", err, calls, want)
		}
	})
}

func TestWarnings(t *testing.T) {
	var w Warnings
	w.HandleWarningHeader(299, "", "one")
	w.HandleWarningHeader(299, "", "two")
	if got := w.Take(); len(got) != 2 || got[0] != "one" || got[1] != "two" {
		t.Fatalf("Take() = %q, want [one two]", got)
	}
	if got := w.Take(); len(got) != 0 {
		t.Fatalf("second Take() = %q, want none", got)
	}
}
