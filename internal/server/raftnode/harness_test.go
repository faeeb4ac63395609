package raftnode

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// singleNode starts a bootstrapped one-node cluster on loopback, without
// the listeners of a whole policyd node, waits until it leads, and closes
// it when the test ends.
func singleNode(t *testing.T, mutate func(*config.Config)) (*Node, config.Config) {
	t.Helper()
	cfg := servertest.Config(filepath.Join(t.TempDir(), "node1"), "node1")
	cfg.Raft.Bootstrap = true
	if mutate != nil {
		mutate(&cfg)
	}
	logger := servertest.Logger(t)
	n, err := New(cfg, logger, cfg.NodeID)
	if err != nil {
		t.Fatalf("open node: %v", err)
	}
	if err := n.Setup(Deps{}); err != nil {
		_ = n.Release()
		t.Fatalf("set up raft: %v", err)
	}
	n.Start()
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	poll.Eventually(t, "the node to lead", func() error {
		if !n.IsLeader() {
			return errors.New("not leader yet")
		}
		return nil
	}, poll.Within(10*time.Second))

	return n, cfg
}
