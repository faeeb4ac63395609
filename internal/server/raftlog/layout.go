package raftlog

import "path/filepath"

// Layout is a node's data directory: the one place that names its files,
// for the running node and the offline commands alike.
type Layout struct{ Dir string }

// StatePath is the state database (store), the Raft log applied in order.
func (l Layout) StatePath() string { return filepath.Join(l.Dir, "state.db") }

// RaftDir holds the Raft log store and the snapshots.
func (l Layout) RaftDir() string { return filepath.Join(l.Dir, "raft") }

// NodeIDPath pins the node's Raft identity to the directory (raftnode's nodeid.go).
func (l Layout) NodeIDPath() string { return filepath.Join(l.Dir, "node-id") }

// ClusterIDPath keeps the cluster ID beside state.db (raftnode's clusterid.go).
func (l Layout) ClusterIDPath() string { return filepath.Join(l.Dir, "cluster-id") }

// LockFiles are the bbolt files a running node holds locked: state.db and
// the log store's, for either kind of log.
func (l Layout) LockFiles() []string {
	return append([]string{l.StatePath()}, lockFiles(l.RaftDir())...)
}
