package drift_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

func TestDriftEnforceAndLog(t *testing.T) {
	t.Run("enforce blocks the controller's drift", func(t *testing.T) {
		c := newChain(t, env.newNamespace(t, "single", admission.ModeEnforce), env.node)
		_, err := c.scaleRS(c.ctrl, "web-1", 3)
		if err := isForbidden(err, "drift"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("log allows it with a warning and reports it", func(t *testing.T) {
		ns := env.newNamespace(t, "single", admission.ModeLog)
		c := newChain(t, ns, env.node)
		c.ctrl.Take()
		rs, err := c.scaleRS(c.ctrl, "web-1", 3)
		if err != nil {
			t.Fatalf("drift in log mode: %v, want allowed", err)
		}
		if *rs.Spec.Replicas != 3 {
			t.Errorf("replicas = %d, want 3", *rs.Spec.Replicas)
		}
		if w := c.ctrl.Take(); !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, "drift") }) {
			t.Errorf("warnings %q, want a drift warning", w)
		}
		var rep admission.DriftReport
		poll.Eventually(t, "the Detected callback", func() error {
			reps := env.recv.reports(ns)
			if len(reps) != 1 {
				return fmt.Errorf("%d reports", len(reps))
			}
			rep = reps[0]
			return nil
		}, poll.Within(30*time.Second))

		s := rep.Spec
		if s.Phase != admission.ReportDetected || s.Parent.Kind != "Deployment" || s.Child.Name != "web-1" ||
			s.Request.User != controllerUser || s.Request.Operation != "UPDATE" || len(s.ID) != 16 {
			t.Errorf("report spec = %+v", s)
		}
		// GET /v1/drift lists it, delivered.
		poll.Eventually(t, "GET /v1/drift to list the delivered report", func() error {
			reports := listDrift(t, "?phase=Detected")
			for _, r := range reports {
				if r.ID == s.ID && r.Delivery == store.DeliveryDelivered {
					return nil
				}
			}
			return fmt.Errorf("report %s not delivered in %d listed", s.ID, len(reports))
		}, poll.Within(30*time.Second))

	})
}

// listDrift calls GET /v1/drift on the single node.
func listDrift(t *testing.T, query string) []store.DriftReport {
	t.Helper()
	resp, err := http.Get("http://" + env.node.HTTPAddr() + "/v1/drift" + query)
	if err != nil {
		t.Fatalf("GET /v1/drift: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/drift%s: %d %s", query, resp.StatusCode, body)
	}
	var out struct {
		Reports []store.DriftReport `json:"reports"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("decode /v1/drift: %v", err)
	}
	return out.Reports
}

func TestListDriftRejectsBadFilters(t *testing.T) {
	for _, q := range []string{"?phase=Maybe", "?delivery=lost", "?limit=-1", "?limit=100000"} {
		resp, err := http.Get("http://" + env.node.HTTPAddr() + "/v1/drift" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/drift%s = %d, want 400", q, resp.StatusCode)
		}
	}
}

func TestIntentionalChangeAndOtherActors(t *testing.T) {
	ns := env.newNamespace(t, "single", admission.ModeEnforce)
	c := newChain(t, ns, env.node)
	human := env.newActor(t, humanUser)

	t.Run("a kubectl-like user is a new origin, allowed", func(t *testing.T) {
		if _, err := c.scaleRS(human, "web-1", 2); err != nil {
			t.Fatalf("human scaling the ReplicaSet: %v, want allowed", err)
		}
	})
	t.Run("metadata-only change by the controller is allowed", func(t *testing.T) {
		body := []byte(`{"metadata":{"labels":{"touched":"yes"}}}`)
		if _, err := c.ctrl.kube.AppsV1().ReplicaSets(ns).Patch(t.Context(), "web-1", "application/merge-patch+json", body, metav1.PatchOptions{}); err != nil {
			t.Fatalf("metadata-only change: %v, want allowed", err)
		}
	})
	t.Run("the controller's change after a spec change (generation bumped) is allowed", func(t *testing.T) {
		c.changeDeploymentSpec("example.com/app:2")
		if _, err := c.scaleRS(c.ctrl, "web-1", 4); err != nil {
			t.Fatalf("controller reconciling: %v, want allowed", err)
		}
	})
	t.Run("a CREATE copying the parent's annotations gets fresh ones", func(t *testing.T) {
		d := c.deployment()
		copied := map[string]string{}
		for k, v := range d.Annotations {
			copied[k] = v
		}
		copied[prefix+"/approvals"] = `[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"*","mode":"always"}]`
		copied[prefix+"/updaters"] = "zzzzz"
		copied["unrelated"] = "kept"
		rs := c.createRS("web-2", copied)
		for _, k := range []string{"/approvals", "/controllers", "/phase"} {
			if v, ok := rs.Annotations[prefix+k]; ok {
				t.Errorf("copied %s%s = %q survived the CREATE", prefix, k, v)
			}
		}
		if got, want := rs.Annotations[prefix+"/updaters"], admission.UserHash(controllerUser); got != want {
			t.Errorf("updaters = %q, want %q (fresh)", got, want)
		}
		if rs.Annotations["unrelated"] != "kept" {
			t.Errorf("foreign annotation lost: %v", rs.Annotations)
		}
	})
	t.Run("status update records the controller hash", func(t *testing.T) {
		d := c.settle()
		if got := d.Annotations[prefix+"/controllers"]; !slices.Contains(admission.ParseHashes(got), admission.UserHash(controllerUser)) {
			t.Errorf("controllers = %q, want it to hold %s", got, admission.UserHash(controllerUser))
		}
		if got := d.Annotations[prefix+"/controllers"]; slices.Contains(admission.ParseHashes(got), admission.UserHash(humanUser)) {
			t.Errorf("controllers = %q holds the human, who never updated status", got)
		}
	})
}

func TestApprovalsAndRejections(t *testing.T) {
	rsApproval := func(mode string, gen int64) string {
		a := admission.Approval{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", Mode: mode, Generation: gen}
		b, _ := json.Marshal([]admission.Approval{a})
		return string(b)
	}
	for _, tc := range []struct{ name, rejection, reason string }{
		{"rejection overrides approval", `{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-1","reason":"frozen by change board"}`, "frozen by change board"},
		{"rejection with wildcards for apiVersion and kind", `{"apiVersion":"*","kind":"*","name":"web-1","reason":"no drift of web-1 of any kind"}`, "no drift of web-1 of any kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChain(t, env.newNamespace(t, "single", admission.ModeEnforce), env.node)
			c.annotateDeployment(map[string]string{
				prefix + "/approvals":  rsApproval(admission.ApprovalAlways, 0),
				prefix + "/rejections": "[" + tc.rejection + "]",
			})
			_, err := c.scaleRS(c.ctrl, "web-1", 3)
			if err := isForbidden(err, tc.reason); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("once approval is consumed after one use; the approved drift is reported Resolved", func(t *testing.T) {
		ns := env.newNamespace(t, "single", admission.ModeEnforce)
		c := newChain(t, ns, env.node)
		// Writing the annotation bumps the Deployment's generation.
		c.annotateDeployment(map[string]string{prefix + "/approvals": rsApproval(admission.ApprovalOnce, c.dep.Generation+1)})
		if _, err := c.scaleRS(c.ctrl, "web-1", 3); err != nil {
			t.Fatalf("approved drift: %v, want allowed", err)
		}
		// Approved before the controller acted, so no Detected report came
		// first: the Resolved report is sent all the same.
		poll.Eventually(t, "the Resolved report of the approved drift", func() error {
			reps := env.recv.reports(ns)
			if len(reps) != 1 || reps[0].Spec.Phase != admission.ReportResolved || reps[0].Spec.Request.User != controllerUser {
				return fmt.Errorf("reports %+v, want one Resolved for the controller's change", reps)
			}
			return nil
		}, poll.Within(30*time.Second))

		poll.Eventually(t, "the leader to consume the approval", c.noApprovals, poll.Within(30*time.Second))
		c.settle()
		_, err := c.scaleRS(c.ctrl, "web-1", 4)
		if err := isForbidden(err, "drift"); err != nil {
			t.Fatalf("second drift after the once approval was used: %v", err)
		}
	})
	t.Run("generation approval is pruned after a spec change", func(t *testing.T) {
		c := newChain(t, env.newNamespace(t, "single", admission.ModeEnforce), env.node)
		c.annotateDeployment(map[string]string{prefix + "/approvals": rsApproval(admission.ApprovalGeneration, c.dep.Generation+1)})
		if _, err := c.scaleRS(c.ctrl, "web-1", 3); err != nil {
			t.Fatalf("approved drift: %v, want allowed", err)
		}
		if _, err := c.scaleRS(c.ctrl, "web-1", 4); err != nil {
			t.Fatalf("generation approval is not used up: %v, want allowed", err)
		}
		c.changeDeploymentSpec("example.com/app:3")
		if _, err := c.scaleRS(c.ctrl, "web-1", 5); err != nil {
			t.Fatalf("controller reconciling: %v, want allowed", err)
		}
		poll.Eventually(t, "the leader to prune the stale approval", c.noApprovals, poll.Within(30*time.Second))
	})
}

func TestFreeze(t *testing.T) {
	c := newChain(t, env.newNamespace(t, "single", admission.ModeLog), env.node)
	// A finalizer keeps the Deployment around, deleting, later on.
	fin := []byte(`{"metadata":{"finalizers":["policyd.io/test"]}}`)
	if _, err := env.Kube.AppsV1().Deployments(c.ns).Patch(t.Context(), "web", "application/merge-patch+json", fin, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.annotateDeployment(map[string]string{prefix + "/freeze": `{"user":"bob","message":"incident 42","at":"2025-01-02T03:04:05Z"}`})
	human := env.newActor(t, humanUser)
	for _, a := range []*actor{c.ctrl, human} {
		_, err := c.scaleRS(a, "web-1", 3)
		if ferr := isForbidden(err, "incident 42"); ferr != nil {
			t.Errorf("%s while frozen: %v", a.user, ferr)
		} else if !strings.Contains(err.Error(), "bob") {
			t.Errorf("%s while frozen: %q does not name the freezing user", a.user, err)
		}
	}
	if err := env.Kube.AppsV1().Deployments(c.ns).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = env.Kube.AppsV1().Deployments(c.ns).Patch(t.Context(), "web", "application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	poll.Eventually(t, "the webhook cache to see the deletion", func() error {
		u := c.node.DriftObjects().Cached(deploymentGVK, c.ns, "web")
		if u == nil || u.GetDeletionTimestamp() == nil {
			return errors.New("no deletionTimestamp yet")
		}
		return nil
	}, poll.Within(30*time.Second))

	if _, err := c.scaleRS(c.ctrl, "web-1", 0); err != nil {
		t.Errorf("controller during the parent's deletion: %v, want allowed despite the freeze", err)
	}
}

func TestSnoozeSuppressesCallbacksThenExpires(t *testing.T) {
	ns := env.newNamespace(t, "single", admission.ModeLog)
	c := newChain(t, ns, env.node)
	expiry := time.Now().Add(20 * time.Second).UTC().Truncate(time.Second)
	c.annotateDeployment(map[string]string{prefix + "/snooze": fmt.Sprintf(`{"expiry":%q,"user":"alice","message":"maintenance"}`, expiry.Format(time.RFC3339))})
	if time.Now().After(expiry) {
		t.Fatal("settling took longer than the snooze; the machine is too slow for this test")
	}
	if _, err := c.scaleRS(c.ctrl, "web-1", 2); err != nil {
		t.Fatalf("snoozed drift in log mode: %v, want allowed", err)
	}
	poll.Eventually(t, "the snooze to expire", func() error {
		if time.Now().Before(expiry.Add(time.Second)) {
			return errors.New("still snoozed")
		}
		return nil
	}, poll.Within(60*time.Second))

	if _, err := c.scaleRS(c.ctrl, "web-1", 3); err != nil {
		t.Fatalf("drift after the snooze in log mode: %v, want allowed", err)
	}
	// Effects of one node are proposed in order, so once the second drift's
	// report arrived, a report of the first would have too.
	poll.Eventually(t, "the report of the drift after the snooze", func() error {
		if n := len(env.recv.reports(ns)); n == 0 {
			return errors.New("no report yet")
		}
		return nil
	}, poll.Within(30*time.Second))

	reps := env.recv.reports(ns)
	if len(reps) != 1 {
		t.Fatalf("%d reports, want 1 (the snoozed drift must not be reported)", len(reps))
	}
	var spec struct {
		Spec struct {
			Replicas int `json:"replicas"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(reps[0].Spec.NewObject, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Spec.Replicas != 3 {
		t.Errorf("reported drift has replicas %d, want 3 (the one after the snooze)", spec.Spec.Replicas)
	}
}

// TestAddedLatency measures what the webhook adds to a client's update
// through the real API server: the same update in a namespace the webhook
// matches and in one it does not. It logs the figures; speed is measured,
// not asserted.
func TestAddedLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	human := env.newActor(t, humanUser)
	p50 := func(label string) time.Duration {
		ns := env.newNamespace(t, label, admission.ModeEnforce)
		if label == "single" {
			newChain(t, ns, env.node)
		} else {
			c := &chain{t: t, ns: ns, ctrl: env.newActor(t, controllerUser), dep: newDeploymentNoWebhook(t, ns)}
			c.createRS("web-1", nil)
		}
		const warm, n = 20, 200
		var ds []time.Duration
		for i := range warm + n {
			body := fmt.Sprintf(`{"spec":{"minReadySeconds":%d}}`, i+1)
			start := time.Now()
			if _, err := human.kube.AppsV1().ReplicaSets(ns).Patch(t.Context(), "web-1", "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
				t.Fatalf("update %d: %v", i, err)
			}
			if i >= warm {
				ds = append(ds, time.Since(start))
			}
		}
		slices.Sort(ds)
		t.Logf("namespace labelled %q: p50 %v p99 %v over %d updates", label, ds[len(ds)/2], ds[len(ds)*99/100], len(ds))
		return ds[len(ds)/2]
	}
	without := p50("")
	with := p50("single")
	t.Logf("added latency through the API server (p50): %v (with webhook %v, without %v)", with-without, with, without)
}

// newDeploymentNoWebhook creates the Deployment in a namespace no webhook
// matches.
func newDeploymentNoWebhook(t *testing.T, ns string) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": "web"}
	d, err := env.Kube.AppsV1().Deployments(ns).Create(t.Context(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec:       appsv1.DeploymentSpec{Replicas: int32p(1), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: podTemplate(labels)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestInitializationRules: env's node has two rules for Deployments, the
// built-in one and the default order ("any of"), so a Deployment
// whose controller reports Ready=True but never Available is initialized,
// and its controller's drift is caught. A rule that names an unknown
// signal stops the node at start.
func TestInitializationRules(t *testing.T) {
	t.Run("Ready=True initializes through the default rule", func(t *testing.T) {
		c := newChainReporting(t, env.newNamespace(t, "single", admission.ModeEnforce), env.node, "Ready")
		if got := c.deployment().Annotations[prefix+"/phase"]; got != admission.PhaseInitialized {
			t.Fatalf("phase %q, want initialized", got)
		}
		_, err := c.scaleRS(c.ctrl, "web-1", 3)
		if err := isForbidden(err, "drift"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a parent that meets no rule is initializing: its children change freely", func(t *testing.T) {
		ns := env.newNamespace(t, "single", admission.ModeEnforce)
		c := &chain{t: t, ns: ns, ctrl: env.newActor(t, controllerUser)}
		c.dep = newDeploymentNoWebhook(t, ns) // no status at all
		c.createRS("web-1", nil)
		if _, err := c.scaleRS(c.ctrl, "web-1", 3); err != nil {
			t.Fatalf("controller's change while the parent is initializing: %v, want allowed", err)
		}
	})
	t.Run("an unknown signal is a configuration error", func(t *testing.T) {
		cfg := env.nodeConfig(t.TempDir(), "bad")
		cfg.Drift.Initialization = []string{"apps/Deployment=default", "apps/Deployment=ready+observedGeneration"}
		n, err := server.New(cfg, servertest.Logger(t), nil)
		if err == nil {
			_ = n.Close(t.Context())
			t.Fatal("a node started with an unknown initialization signal")
		}
		if want := `drift.initialization: [1] initialization rule "apps/Deployment=ready+observedGeneration": unknown signal "ready"`; !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	})
}

// TestObjectModeOverridesNamespace: a child's own <prefix>/mode annotation
// decides over its namespace's (and its parent's).
func TestObjectModeOverridesNamespace(t *testing.T) {
	human := env.newActor(t, humanUser)
	markRS := func(c *chain, mode string) {
		t.Helper()
		body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, prefix+"/mode", mode)
		if _, err := human.kube.AppsV1().ReplicaSets(c.ns).Patch(t.Context(), "web-1", "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatalf("mark the ReplicaSet %s: %v", mode, err)
		}
	}
	t.Run("a child marked log in an enforce namespace is allowed with a warning and reported", func(t *testing.T) {
		ns := env.newNamespace(t, "single", admission.ModeEnforce)
		c := newChain(t, ns, env.node)
		markRS(c, admission.ModeLog)
		c.ctrl.Take()
		if _, err := c.scaleRS(c.ctrl, "web-1", 3); err != nil {
			t.Fatalf("drift of a child marked log: %v, want allowed", err)
		}
		if w := c.ctrl.Take(); !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, "drift") }) {
			t.Errorf("warnings %q, want a drift warning", w)
		}
		poll.Eventually(t, "the Detected report", func() error {
			if n := len(env.recv.reports(ns)); n != 1 {
				return fmt.Errorf("%d reports", n)
			}
			return nil
		}, poll.Within(30*time.Second))

	})
	t.Run("a child marked enforce in a log namespace, under a parent marked log, is denied", func(t *testing.T) {
		c := newChain(t, env.newNamespace(t, "single", admission.ModeLog), env.node)
		c.annotateDeployment(map[string]string{prefix + "/mode": admission.ModeLog})
		markRS(c, admission.ModeEnforce)
		_, err := c.scaleRS(c.ctrl, "web-1", 3)
		if err := isForbidden(err, "drift"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestTraceLabelsThroughTheAPIServer: a human's trace-<key> annotations
// label the hop of their change; a key that is no label key and a value
// over 1 KiB are left out, and the client is told why in warnings, not
// refused.
func TestTraceLabelsThroughTheAPIServer(t *testing.T) {
	c := newChain(t, env.newNamespace(t, "single", admission.ModeEnforce), env.node)
	human := env.newActor(t, humanUser)
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{
			prefix + "/trace-ticket": "JIRA-7",
			prefix + "/trace--bad":   "x",
			prefix + "/trace-big":    strings.Repeat("b", 2048),
		}},
		"spec": map[string]any{"replicas": 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := human.kube.AppsV1().ReplicaSets(c.ns).Patch(t.Context(), "web-1", "application/merge-patch+json", body, metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("a change with bad trace annotations: %v, want allowed", err)
	}
	hops, err := admission.ParseTrace(rs.Annotations[prefix+"/trace"])
	if err != nil || len(hops) != 1 {
		t.Fatalf("trace %q: %v", rs.Annotations[prefix+"/trace"], err)
	}
	if diff := cmp.Diff(map[string]string{"ticket": "JIRA-7"}, hops[0].Labels); diff != "" || hops[0].User != humanUser {
		t.Errorf("hop %+v: labels (-want +got):\n%s", hops[0], diff)
	}
	w := human.Take()
	for _, want := range []string{"ignoring " + prefix + "/trace--bad", "ignoring " + prefix + "/trace-big"} {
		if !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("warnings %q, want one %q", w, want)
		}
	}
}
