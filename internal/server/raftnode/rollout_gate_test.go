package raftnode

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/command"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// TestRolloutGate: rollout commands are refused, as a conflict that
// crosses a forwarded write, while a registered member reads a command
// version below raftfsm.RolloutVersion (or none); other commands pass.
func TestRolloutGate(t *testing.T) {
	start, err := command.New(&commandv1.RolloutStart{})
	if err != nil {
		t.Fatal(err)
	}
	move, err := command.RolloutTransition(&commandv1.RolloutTransition{Id: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	put, err := command.DeletePolicy("acme.p", nil)
	if err != nil {
		t.Fatal(err)
	}
	pol := func(enforcement string) *command.Command {
		cmd, err := command.PutPolicy(&policy.Policy{Name: "acme.p", Kind: policy.KindToolPolicy, Spec: []byte(`{}`), Enforcement: enforcement}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	tests := []struct {
		name     string
		versions []uint32
		cmd      *command.Command
		refused  bool
	}{
		{"every member reads 4", []uint32{4, 4, 4}, start, false},
		{"one member reads 3", []uint32{4, 3, 4}, start, true},
		{"one member registered none", []uint32{4, 0, 4}, move, true},
		{"transition, every member reads 4", []uint32{4, 4}, move, false},
		{"not a rollout command", []uint32{3, 3}, put, false},
		{"shadow policy, one member reads 3", []uint32{4, 3, 4}, pol("shadow"), true},
		{"shadow policy, every member reads 4", []uint32{4, 4, 4}, pol("shadow"), false},
		{"enforced policy, members read 3", []uint32{3, 3}, pol("enforce"), false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(filepath.Join(t.TempDir(), "state.db"), servertest.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			err = st.ApplyBatch(uint64(i+1), func(b *store.Batch) error {
				for j, v := range tc.versions {
					if err := b.PutMember(store.Meta{Index: uint64(i + 1)}, store.Member{ID: "n" + string(rune('1'+j)), CommandVersion: v}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			n := &Node{store: st}
			_, res, err := n.forMembers(tc.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if got := res != nil; got != tc.refused {
				t.Fatalf("refused = %v (%v), want %v", got, res, tc.refused)
			}
			if tc.refused {
				if rerr := command.ResultErr(res); !strings.Contains(rerr.Error(), "cluster not upgraded") || !strings.Contains(rerr.Error(), "oldest reads") {
					t.Errorf("refusal %v", rerr)
				}
				if rerr := command.ResultErr(res); !isConflict(rerr) {
					t.Errorf("refusal %v is not a conflict", rerr)
				}
			}
		})
	}
}

func isConflict(err error) bool { return errors.Is(err, store.ErrConflict) }
