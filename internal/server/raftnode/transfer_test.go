package raftnode

import (
	"errors"
	"testing"

	"github.com/policyd/policyd/internal/store"
)

// TestTransferLeadershipRefusals: a lone leader has no one to hand over
// to, and a target that is itself or no member is refused with the error
// the admin API maps to 409 or 404. (The transfer itself is tested end to
// end by the CLI against three processes.)
func TestTransferLeadershipRefusals(t *testing.T) {
	n, _ := singleNode(t, nil)
	tests := []struct {
		target string
		want   error
	}{
		{"", store.ErrConflict},
		{"node1", store.ErrConflict},
		{"no-such-node", store.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.target, func(t *testing.T) {
			if err := n.TransferLeadership(tc.target); !errors.Is(err, tc.want) {
				t.Fatalf("TransferLeadership(%q) = %v, want %v", tc.target, err, tc.want)
			}
			if !n.IsLeader() {
				t.Fatal("a refused transfer lost leadership")
			}
		})
	}
}
