package raftfsm

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/third_party/raft"
)

// TestStoreFault: a batch or snapshot the store cannot take goes to the
// fault handler with the error, which names the state file; a handler that
// returns leaves the old behaviour (a panic, an error).
func TestStoreFault(t *testing.T) {
	tests := []struct {
		name string
		run  func(f *FSM) (panicked any, err error)
	}{
		{"apply", func(f *FSM) (any, error) {
			return applyRecover(f, []*raft.Log{entry(t, 1, putPolicy(t, "acme.p", "acme", nil))}), nil
		}},
		{"restore", func(f *FSM) (any, error) {
			return nil, f.Restore(readCloser{bytes.NewReader([]byte("not a state db"))})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, st := newFSM(t)
			var got []error
			f.SetStoreFault(func(err error) error {
				got = append(got, err)
				return fmt.Errorf("handled: %w", err)
			})
			if tc.name == "apply" {
				closeWithin(t, st) // every write now fails
			}
			panicked, err := tc.run(f)
			if len(got) != 1 {
				t.Fatalf("fault handler called %d times, want once", len(got))
			}
			switch {
			case tc.name == "apply" && (panicked == nil || !strings.Contains(fmt.Sprint(panicked), "handled:")):
				t.Errorf("apply panicked with %v, want the handler's error", panicked)
			case tc.name == "restore" && (err == nil || !strings.Contains(err.Error(), "handled:")):
				t.Errorf("restore = %v, want the handler's error", err)
			}
		})
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }
