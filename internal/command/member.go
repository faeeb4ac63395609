package command

import (
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/store"
)

// RegisterMember builds the command that records a node's addresses and
// command version.
func RegisterMember(m store.Member) (*Command, error) {
	return New(&commandv1.RegisterMember{
		Id: m.ID, RaftAddr: m.RaftAddr, HttpAddr: m.HTTPAddr, GrpcAddr: m.GRPCAddr,
		CommandVersion: m.CommandVersion,
	})
}

// RegisterMemberAfresh is RegisterMember for a node's first registration
// after an upgrade: every other member's recorded command version is
// cleared, so that each registers again (commandv1.RegisterMember's
// reset_versions).
func RegisterMemberAfresh(m store.Member) (*Command, error) {
	return New(&commandv1.RegisterMember{
		Id: m.ID, RaftAddr: m.RaftAddr, HttpAddr: m.HTTPAddr, GrpcAddr: m.GRPCAddr,
		CommandVersion: m.CommandVersion, ResetVersions: true,
	})
}

// RemoveMember builds the command that forgets a node's addresses.
func RemoveMember(id string) (*Command, error) {
	return New(&commandv1.RemoveMember{Id: id})
}

// SetClusterID builds the command that names the cluster.
func SetClusterID(id string) (*Command, error) {
	return New(&commandv1.SetClusterID{Id: id})
}

// PruneEvents builds the command that deletes events processed before cutoff.
func PruneEvents(cutoff time.Time) (*Command, error) {
	return New(&commandv1.PruneEvents{CutoffUnixNano: cutoff.UnixNano()})
}
