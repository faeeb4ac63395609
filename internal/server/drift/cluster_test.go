package drift_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// testCluster is a 3-node policyd cluster, each node serving the webhook on
// its own port.
type testCluster struct {
	t     *testing.T
	nodes []*server.Node
}

func newTestCluster(t *testing.T, callbacks []string) *testCluster {
	t.Helper()
	c := &testCluster{t: t}
	logger := servertest.Logger(t)
	for i := range 3 {
		id := fmt.Sprintf("node%d", i+1)
		cfg := env.nodeConfig(filepath.Join(t.TempDir(), id), id)
		cfg.Raft.Bootstrap = i == 0
		cfg.Drift.Callbacks = callbacks
		n, err := server.New(cfg, logger.With("node", id), nil)
		if err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		n.Start()
		t.Cleanup(func() { c.stop(n) })
		c.nodes = append(c.nodes, n)
		if i == 0 {
			poll.Eventually(t, "node1 to lead", func() error {
				if !n.IsLeader() {
					return errors.New("not leader")
				}
				return nil
			}, poll.Within(30*time.Second))

			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		_, err = c.nodes[0].Join(ctx, id, n.RaftAddr())
		cancel()
		if err != nil {
			t.Fatalf("join %s: %v", id, err)
		}
	}
	poll.Eventually(t, "every node to be ready", func() error {
		for _, n := range c.nodes {
			if err := n.Ready(t.Context()); err != nil {
				return fmt.Errorf("%s: %w", n.ID(), err)
			}
		}
		return nil
	}, poll.Within(30*time.Second))

	return c
}

func (c *testCluster) stop(n *server.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		c.t.Errorf("close %s: %v", n.ID(), err)
	}
}

func (c *testCluster) leader() *server.Node {
	c.t.Helper()
	var l *server.Node
	poll.Eventually(c.t, "a leader", func() error {
		for _, n := range c.nodes {
			if n.IsLeader() {
				l = n
				return nil
			}
		}
		return errors.New("no leader")
	}, poll.Within(30*time.Second))

	return l
}

// register points one webhook per node at the namespaces labelled label.
func (c *testCluster) register(label string) {
	c.t.Helper()
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "policyd-drift-" + label}}
	for i, n := range c.nodes {
		url := "https://" + n.DriftAddr() + admission.Path
		cfg.Webhooks = append(cfg.Webhooks, webhook(fmt.Sprintf("node%d.drift.policyd.io", i+1), label,
			admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: env.caData}))
	}
	if _, err := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(c.t.Context(), cfg, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("register webhooks: %v", err)
	}
	c.t.Cleanup(func() {
		_ = env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), cfg.Name, metav1.DeleteOptions{})
	})
}

// settledEverywhere waits for every node's webhook cache to hold the
// Deployment as the API server has it: any node's webhook may answer.
func settledEverywhere(t *testing.T, nodes []*server.Node, ns string, rv string) {
	t.Helper()
	poll.Eventually(t, "every node's cache to hold the settled deployment", func() error {
		for _, n := range nodes {
			u := n.DriftObjects().Cached(deploymentGVK, ns, "web")
			if u == nil || u.GetResourceVersion() != rv {
				return fmt.Errorf("%s's cache is behind", n.ID())
			}
		}
		return nil
	}, poll.Within(30*time.Second))

}

// TestClusterReportsEachDriftOnce has the API server call the webhooks of
// all three nodes for every request: each node observes the drift, and
// exactly one DriftReport leaves the cluster, after the receiver's first
// failures, for an approved drift, and also when the leader changes before
// delivery.
func TestClusterReportsEachDriftOnce(t *testing.T) {
	recv := newReceiver()
	t.Cleanup(recv.Close)
	c := newTestCluster(t, []string{recv.URL})
	c.register("cluster")
	// Log mode: every webhook allows, so the API server calls all three.
	ns := env.newNamespace(t, "cluster", admission.ModeLog)
	ch := newChain(t, ns, c.leader())
	settledEverywhere(t, c.nodes, ns, ch.dep.ResourceVersion)

	// 1. The receiver fails twice first.
	recv.setFail(2)
	if _, err := ch.scaleRS(ch.ctrl, "web-1", 3); err != nil {
		t.Fatalf("drift in log mode: %v", err)
	}
	var id string
	poll.Eventually(t, "the report, after retries", func() error {
		reps := recv.reports(ns)
		if len(reps) == 0 {
			return errors.New("none accepted yet")
		}
		id = reps[0].Spec.ID
		return nil
	}, poll.Within(60*time.Second))

	if got := recv.attemptsFor(id); got < 3 {
		t.Errorf("%d POSTs of the report, want at least 3 (two refused, then accepted)", got)
	}
	var rec *store.DriftReport
	poll.Eventually(t, "all three observations and the delivery, on every node", func() error {
		for _, n := range c.nodes {
			r, err := n.Store().DriftReport(id)
			if err != nil {
				return err
			}
			if r.Observations != 3 || r.Delivery != store.DeliveryDelivered {
				return fmt.Errorf("%s: %d observations, delivery %s", n.ID(), r.Observations, r.Delivery)
			}
			rec = r
		}
		return nil
	}, poll.Within(30*time.Second))

	if len(rec.Deliveries) != 1 || rec.Deliveries[0].URL != recv.URL {
		t.Errorf("deliveries = %+v", rec.Deliveries)
	}
	if n := len(recv.reports(ns)); n != 1 {
		t.Fatalf("%d reports accepted for one drift seen by 3 nodes, want exactly 1", n)
	}

	// 2. An approved drift: each node's webhook sees it (each call with its
	// own uid), and one Resolved report leaves the cluster.
	ch.annotateDeployment(map[string]string{prefix + "/approvals": `[{"apiVersion":"*","kind":"ReplicaSet","name":"*","mode":"always"}]`})
	settledEverywhere(t, c.nodes, ns, ch.dep.ResourceVersion)
	if _, err := ch.scaleRS(ch.ctrl, "web-1", 5); err != nil {
		t.Fatalf("approved drift: %v", err)
	}
	var resolved admission.DriftReport
	poll.Eventually(t, "the Resolved report of the approved drift", func() error {
		for _, rep := range recv.reports(ns) {
			if rep.Spec.Phase == admission.ReportResolved {
				resolved = rep
				return nil
			}
		}
		return errors.New("none accepted yet")
	}, poll.Within(60*time.Second))

	poll.Eventually(t, "all three observations of the approval, on every node", func() error {
		for _, n := range c.nodes {
			rs, err := n.Store().DriftReports(store.DriftFilter{Phase: store.PhaseResolved})
			if err != nil {
				return err
			}
			if len(rs) != 1 || rs[0].Observations != 3 || rs[0].Delivery != store.DeliveryDelivered {
				return fmt.Errorf("%s: Resolved reports %+v, want one delivered, observed 3 times", n.ID(), rs)
			}
		}
		return nil
	}, poll.Within(30*time.Second))

	if n := len(recv.reports(ns)); n != 2 || resolved.Spec.Request.User != controllerUser {
		t.Fatalf("%d reports accepted after one drift and one approved drift seen by 3 nodes, want 2; Resolved %+v", n, resolved.Spec)
	}
	ch.annotateDeployment(map[string]string{prefix + "/approvals": "[]"})
	settledEverywhere(t, c.nodes, ns, ch.dep.ResourceVersion)

	// 3. The receiver refuses until the leader has changed.
	recv.setFail(-1)
	if _, err := ch.scaleRS(ch.ctrl, "web-1", 4); err != nil {
		t.Fatalf("second drift: %v", err)
	}
	var id2 string
	poll.Eventually(t, "the second report to be attempted", func() error {
		rs, err := c.nodes[0].Store().DriftReports(store.DriftFilter{Delivery: store.DeliveryRetrying})
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.ID != id {
				id2 = r.ID
				return nil
			}
		}
		return errors.New("no retrying report")
	}, poll.Within(60*time.Second))

	old := c.leader()
	for i, n := range c.nodes {
		if n == old {
			c.nodes = append(c.nodes[:i], c.nodes[i+1:]...)
			break
		}
	}
	c.stop(old)
	newLeader := c.leader()
	recv.setFail(0)
	poll.Eventually(t, "the new leader to deliver the second report", func() error {
		r, err := newLeader.Store().DriftReport(id2)
		if err != nil {
			return err
		}
		if r.Delivery != store.DeliveryDelivered {
			return fmt.Errorf("delivery %s", r.Delivery)
		}
		return nil
	}, poll.Within(90*time.Second))

	count := 0
	for _, rep := range recv.reports(ns) {
		if rep.Spec.ID == id2 {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d accepted copies of the second report across the failover, want 1", count)
	}
	if n := len(recv.reports(ns)); n != 3 {
		t.Errorf("%d reports accepted in all, want 3", n)
	}
}
