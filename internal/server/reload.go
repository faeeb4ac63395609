package server

import (
	"context"
	"fmt"
	"time"

	"github.com/policyd/policyd/internal/command"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/store"
)

// setupReload builds the ConfigMap reload controller when reload.enabled
// and registers it as a leader task. Nothing contacts the API server until
// this node leads.
func (n *Node) setupReload() error {
	if !n.cfg.Reload.Enabled {
		return nil
	}
	rc, err := kubeConfig(n.cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return err
	}
	rc.UserAgent = "policyd-reload/" + n.id
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	c, err := reload.New(n.cfg.Reload, n.logger.With("component", "reload"), reload.Deps{
		Kube: kube, State: reloadState{n}, Registry: n.reg,
	})
	if err != nil {
		return err
	}
	n.reload = c
	n.AddLeaderTask(raftnode.LeaderTask{Name: "reload", Run: func(ctx context.Context) {
		c.Run(ctx, n.leaderlessFor())
	}})
	return nil
}

// kubeConfig loads a kubeconfig file, or the in-cluster configuration when
// path is empty.
func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes in-cluster config (set kubernetes.kubeconfig outside a cluster): %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes.kubeconfig %q: %w", path, err)
	}
	return rc, nil
}

// leaderlessFor is how long this node went without a leader before leading:
// from the last contact with the previous leader until now. Zero for a node
// that never followed one (bootstrap).
func (n *Node) leaderlessFor() time.Duration {
	last := n.LastContact()
	if last.IsZero() {
		return 0
	}
	return time.Since(last)
}

// ReloadStatus is the reload controller's status; disabled when
// reload.enabled is false.
func (n *Node) ReloadStatus() reload.Status {
	if n.reload == nil {
		return reload.Status{State: reload.StateDisabled}
	}
	return n.reload.Status()
}

// reloadState is the reload controller's view of the node: local reads, and
// writes that go through Raft from this node only while it leads. Never
// forwarding is deliberate: a controller whose term has just ended must not
// record outcomes through the next leader, which runs its own.
type reloadState struct{ n *Node }

func (s reloadState) ReloadState() (*store.ReloadState, error) { return s.n.store.ReloadState() }

func (s reloadState) Apply(ctx context.Context, cmd *command.Command) error {
	if err := ctx.Err(); err != nil {
		// The term is over: nothing more may enter the log from it.
		return err
	}
	if !s.n.IsLeader() {
		return raftnode.ErrNotLeader
	}
	if cmd.OriginatedAtUnixNano == 0 {
		cmd.OriginatedAtUnixNano = time.Now().UnixNano()
	}
	cmd.Actor = command.ActorReload
	res, err := s.n.ProposeLocal(ctx, cmd)
	if err != nil {
		return err
	}
	if err := command.ResultErr(res); err != nil {
		return err
	}
	return s.n.store.WaitApplied(ctx, res.GetIndex())
}
