package raftnode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/store"
)

// ClusterID is the cluster this node belongs to, "" until the first leader
// has named it.
func (n *Node) ClusterID() string {
	if id := n.clusterID.Load(); id != nil {
		return *id
	}
	return ""
}

// loadClusterID keeps the cluster ID beside state.db (raftlog.Layout.ClusterIDPath):
// a state.db discarded after an unclean stop (raft.state_fsync off) or lost
// is rebuilt from the log, and the node must still refuse other clusters'
// peers meanwhile. It reads the data dir's cluster ID and the replicated one, and
// refuses a state.db of another cluster than the data dir's.
func (n *Node) loadClusterID() error {
	path := n.layout.ClusterIDPath()
	var fileID string
	switch b, err := os.ReadFile(path); {
	case err == nil:
		fileID = strings.TrimSpace(string(b))
		if !command.ClusterIDPattern.MatchString(fileID) {
			return fmt.Errorf("%s: %q is not a cluster ID (%s); restore it from another member's data dir", path, fileID, command.ClusterIDPattern)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("read cluster ID: %w", err)
	}
	stateID, err := n.store.ClusterID()
	if err != nil {
		return err
	}
	switch {
	case fileID != "" && stateID != "" && fileID != stateID:
		return fmt.Errorf("%s belongs to cluster %s but %s names cluster %s: the state database comes from another cluster; "+
			"move it aside and restart to rebuild it from the Raft log, or wipe the data dir and join the cluster again",
			n.store.Path(), stateID, path, fileID)
	case stateID != "" && fileID == "":
		if err := writeClusterID(path, stateID); err != nil {
			return err
		}
	}
	id := stateID
	if id == "" {
		id = fileID
	}
	n.clusterID.Store(&id)
	return nil
}

func writeClusterID(path, id string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return fmt.Errorf("write cluster ID: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write cluster ID: %w", err)
	}
	return nil
}

// NoteChange keeps the node's cluster ID in step with the replicated one
// after a batch that named it, or replaced the state.
func (n *Node) NoteChange(c store.Change) {
	named := c.Resync
	for _, e := range c.Entities {
		named = named || e.Type == store.EntityCluster
	}
	if !named {
		return
	}
	id, err := n.store.ClusterID()
	if err != nil || id == "" || id == n.ClusterID() {
		return
	}
	if old := n.ClusterID(); old != "" {
		n.logger.Error("the replicated cluster ID differs from this data dir's", "data_dir_cluster", old, "cluster", id)
	}
	if err := writeClusterID(n.layout.ClusterIDPath(), id); err != nil {
		n.logger.Error("keep cluster ID in the data dir", "err", err)
	}
	n.clusterID.Store(&id)
	n.logger.Info("cluster ID", "cluster", id)
}

// ensureClusterID runs on the leader: a cluster whose state has no ID yet
// (a new cluster, or one made by an older release) gets one.
func (n *Node) ensureClusterID(ctx context.Context) {
	retry := backoff.New(100*time.Millisecond, 5*time.Second, true)
	for {
		id, err := n.store.ClusterID()
		if err == nil && id != "" {
			return
		}
		if id = n.ClusterID(); id == "" {
			var b [16]byte
			_, _ = rand.Read(b[:]) // never fails (Go 1.24)
			id = hex.EncodeToString(b[:])
		}
		cmd, err := command.SetClusterID(id)
		if err == nil {
			if _, err = n.applyLocal(ctx, cmd, false); err == nil {
				n.logger.Info("named the cluster", "cluster", id)
				return
			}
		}
		n.logger.Warn("name the cluster", "err", err)
		if !retry.Wait(ctx) {
			return
		}
	}
}
