// Package raftlog is a node's data directory below Raft: the files it is
// made of (Layout), the Raft log and stable store (bbolt or raft-wal),
// opened only once read back whole, the leader's cache of recent entries,
// and what a damaged file or a failed write means for the operator
// (DataError, Faults). It runs no Raft: internal/server/raftnode builds
// raft over it. See docs/operations.md.
package raftlog
