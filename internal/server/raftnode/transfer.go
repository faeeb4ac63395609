package raftnode

import (
	"fmt"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/store"
)

// TransferLeadership hands leadership to the voter id, or to the most
// up-to-date voter when id is "". It runs on the leader only (ErrNotLeader
// elsewhere) and returns once raft has finished the transfer.
func (n *Node) TransferLeadership(id string) error {
	if !n.IsLeader() {
		return ErrNotLeader
	}
	if id == "" {
		if n.otherVoters() == 0 {
			return fmt.Errorf("transfer leadership: %w: no other voter", store.ErrConflict)
		}
		return transferErr(n.raft.LeadershipTransfer().Error())
	}
	if id == n.id {
		return fmt.Errorf("transfer leadership: %w: %q already leads", store.ErrConflict, id)
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) != id {
			continue
		}
		if s.Suffrage != raft.Voter {
			return fmt.Errorf("transfer leadership: %w: %q is not a voter", store.ErrConflict, id)
		}
		return transferErr(n.raft.LeadershipTransferToServer(s.ID, s.Address).Error())
	}
	return fmt.Errorf("member %q: %w", id, store.ErrNotFound)
}

// transferErr maps a transfer future's error; raftErr wraps even nil.
func transferErr(err error) error {
	if err == nil {
		return nil
	}
	return raftErr("transfer leadership", err)
}
