package drift_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// TestRealControllers runs the real deployment and replicaset controllers
// (kube-controller-manager, each controller with its own service account)
// through the webhook. They get an API server and a policyd of their own,
// so that they reconcile no other test's objects. The webhook learns who
// the controllers are from what they do; nothing is told.
func TestRealControllers(t *testing.T) {
	began := time.Now()
	s, err := startStack(t.TempDir(), "kcm", servertest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop(func(err error) { t.Error(err) }) })
	kcm := s.StartControllerManager(t, "deployment-controller", "replicaset-controller")
	t.Logf("API server and policyd started in %v", kcm.Started.Sub(began).Round(time.Millisecond))
	ns := s.newNamespace(t, "kcm", admission.ModeEnforce)
	rc := &realChain{t: t, s: s, kcm: kcm, ns: ns, human: s.newActor(t, humanUser)}
	depCtrl, rsCtrl := kubetest.ControllerUser("deployment-controller"), kubetest.ControllerUser("replicaset-controller")

	var rs *appsv1.ReplicaSet // the ReplicaSet of the current template
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"a rollout through the webhook: the controllers are learned from their status writes", func(t *testing.T) {
			rc.createDeployment()
			var first time.Duration
			rs = rc.settled("the first rollout", func(d *appsv1.Deployment, rss []appsv1.ReplicaSet) error {
				if first == 0 && len(rss) > 0 {
					first = time.Since(kcm.Started)
				}
				return nil
			})
			t.Logf("kube-controller-manager: first ReplicaSet %v after its start", first.Round(time.Millisecond))
			d := rc.deployment()
			if got := admission.ParseHashes(d.Annotations[prefix+"/controllers"]); !slices.Equal(got, []string{admission.UserHash(depCtrl)}) {
				t.Errorf("Deployment controllers = %v, want only the deployment controller's %s", got, admission.UserHash(depCtrl))
			}
			if got := admission.ParseHashes(rs.Annotations[prefix+"/controllers"]); !slices.Equal(got, []string{admission.UserHash(rsCtrl)}) {
				t.Errorf("ReplicaSet controllers = %v, want only the replicaset controller's %s", got, admission.UserHash(rsCtrl))
			}
			if got := rs.Annotations[prefix+"/updaters"]; got != admission.UserHash(depCtrl) {
				t.Errorf("ReplicaSet updaters = %q, want the deployment controller's %s", got, admission.UserHash(depCtrl))
			}
			rc.wantTrace(rs, []admission.Hop{{Kind: "Deployment", Name: "web", User: humanUser}, {Kind: "ReplicaSet", Name: rs.Name, User: depCtrl}})
			rc.wantReports(0, 0)
		}},
		{"a template change rolls a new ReplicaSet and is not drift; trace labels stay on their own hop", func(t *testing.T) {
			old := rs
			rc.patchDeployment(`{"metadata":{"annotations":{"policyd.io/trace-ticket":"JIRA-1"}},"spec":{"template":{"spec":{"containers":[{"name":"app","image":"example.com/app:2"}]}}}}`)
			rs = rc.settled("the rollout of the new template", func(d *appsv1.Deployment, rss []appsv1.ReplicaSet) error {
				if len(rss) != 2 {
					return fmt.Errorf("%d ReplicaSets, want the old and the new", len(rss))
				}
				for _, r := range rss {
					if r.Name == old.Name && *r.Spec.Replicas != 0 {
						return fmt.Errorf("old ReplicaSet %s has %d replicas, want 0", r.Name, *r.Spec.Replicas)
					}
				}
				return nil
			})
			if rs.Name == old.Name || rs.Spec.Template.Spec.Containers[0].Image != "example.com/app:2" {
				t.Fatalf("current ReplicaSet %s runs %s, want a new one for the new template", rs.Name, rs.Spec.Template.Spec.Containers[0].Image)
			}
			if v, ok := rs.Annotations[prefix+"/trace-ticket"]; ok {
				t.Errorf("the controller's copy of trace-ticket (%q) survived on the ReplicaSet", v)
			}
			rc.wantTrace(rs, []admission.Hop{
				{Kind: "Deployment", Name: "web", User: humanUser, Labels: map[string]string{"ticket": "JIRA-1"}},
				{Kind: "ReplicaSet", Name: rs.Name, User: depCtrl},
			})
			rc.wantReports(0, 0)
		}},
		{"the controller undoing a human's scale is drift: enforced and reported once", func(t *testing.T) {
			rc.scaleRS(rs.Name, 3)
			var rep store.DriftReport
			rc.eventually("the controller's retries of the scale-down to be denied and counted", func() error {
				reps := rc.stored(store.PhaseDetected)
				if len(reps) != 1 {
					return fmt.Errorf("%d Detected reports stored", len(reps))
				}
				if rep = reps[0]; rep.Observations < 2 {
					return fmt.Errorf("%d observations, want the controller's retries", rep.Observations)
				}
				return nil
			})
			if got := *rc.replicaSet(rs.Name).Spec.Replicas; got != 3 {
				t.Errorf("ReplicaSet has %d replicas, want the human's 3: the drift must be denied", got)
			}
			det := rc.wantReports(1, 0)[0]
			if s := det.Spec; s.ID != rep.ID || s.Request.User != depCtrl || s.Child.Name != rs.Name || s.Parent.Kind != "Deployment" ||
				!slices.Equal(s.Diff, []string{"spec.replicas"}) {
				t.Errorf("Detected report %+v, want the deployment controller's scale of %s (id %s)", s, rs.Name, rep.ID)
			}
		}},
		{"approving the drift lets the controller proceed and sends Resolved", func(t *testing.T) {
			d := rc.deployment()
			// Writing the annotation bumps the Deployment's generation.
			approval, _ := json.Marshal([]admission.Approval{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, Mode: admission.ApprovalOnce, Generation: d.Generation + 1}})
			rc.annotateDeployment(prefix+"/approvals", string(approval))
			rc.eventually("the controller's scale-down and the Resolved report", func() error {
				if got := *rc.replicaSet(rs.Name).Spec.Replicas; got != 1 {
					return fmt.Errorf("ReplicaSet has %d replicas", got)
				}
				if n := len(rc.received(admission.ReportResolved)); n != 1 {
					return fmt.Errorf("%d Resolved reports received", n)
				}
				return nil
			})
			rc.settled("the Deployment after the approval", nil)
			res := rc.wantReports(1, 1)[1]
			if want := admission.ResolvedID(res.Spec.Parent, res.Spec.Child); res.Spec.ID != want || res.Spec.Child.Name != rs.Name {
				t.Errorf("Resolved report %+v, want id %s for %s", res.Spec, want, rs.Name)
			}
		}},
		{"a drift approved in advance with wildcards sends Resolved, for every approved drift", func(t *testing.T) {
			rc.annotateDeployment(prefix+"/approvals", `[{"apiVersion":"*","kind":"*","name":"*","mode":"always"}]`)
			rc.settled("the Deployment with the approval", nil)
			for i, replicas := range []int32{4, 5} {
				rc.scaleRS(rs.Name, replicas)
				rc.eventually(fmt.Sprintf("the approved scale-down %d and its Resolved report", i+1), func() error {
					if got := *rc.replicaSet(rs.Name).Spec.Replicas; got != 1 {
						return fmt.Errorf("ReplicaSet has %d replicas", got)
					}
					if n := len(rc.received(admission.ReportResolved)); n != 2+i {
						return fmt.Errorf("%d Resolved reports received", n)
					}
					return nil
				})
			}
			reps := rc.wantReports(1, 3)
			for _, rep := range reps[2:] {
				var obj appsv1.ReplicaSet
				if err := json.Unmarshal(rep.Spec.NewObject, &obj); err != nil {
					t.Fatal(err)
				}
				if rep.Spec.Request.User != depCtrl || *obj.Spec.Replicas != 1 || !slices.Equal(rep.Spec.Diff, []string{"spec.replicas"}) {
					t.Errorf("approved drift's report: user %s, new replicas %d, diff %v; want the deployment controller's scale to 1",
						rep.Spec.Request.User, *obj.Spec.Replicas, rep.Spec.Diff)
				}
			}
			if got := rc.stored(store.PhaseResolved); len(got) != 3 {
				t.Errorf("%d Resolved reports stored, want 3 (each approved drift its own)", len(got))
			}
		}},
	}
	for _, st := range steps {
		if !t.Run(st.name, st.run) {
			return // each step builds on the one before
		}
	}
}

// realChain is a Deployment that the real controllers reconcile, and the
// human who changes it and its ReplicaSets.
type realChain struct {
	t     *testing.T
	s     *stack
	kcm   *kubetest.ControllerManager
	ns    string
	human *actor
}

// createDeployment creates the Deployment "web" as the human. Nothing runs
// pods, so none ever becomes available: with maxUnavailable 1 of 1
// replica, a rollout completes anyway and the Deployment is Available,
// which is its built-in initialization rule.
func (rc *realChain) createDeployment() {
	rc.t.Helper()
	labels := map[string]string{"app": "web"}
	one := intstr.FromInt32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: rc.ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: int32p(1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate(labels),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &one, MaxUnavailable: &one}},
		},
	}
	if _, err := rc.human.kube.AppsV1().Deployments(rc.ns).Create(rc.t.Context(), dep, metav1.CreateOptions{}); err != nil {
		rc.t.Fatalf("create deployment: %v", err)
	}
}

// eventually is poll.Eventually that fails at once if the
// controller-manager has exited.
func (rc *realChain) eventually(what string, cond func() error) {
	rc.t.Helper()
	poll.Eventually(rc.t, what, func() error {
		if err := rc.kcm.Err(); err != nil {
			rc.t.Fatal(err)
		}
		return cond()
	}, poll.Within(90*time.Second))
}

// settled waits until the Deployment is at rest: its status observes its
// generation and says Available, its phase and controller are recorded,
// its current ReplicaSet (returned) has the desired replicas and a
// controller recorded, no follow-up patch is pending, and the webhook's
// cache holds this Deployment. more, if set, must hold too.
func (rc *realChain) settled(what string, more func(*appsv1.Deployment, []appsv1.ReplicaSet) error) *appsv1.ReplicaSet {
	rc.t.Helper()
	var cur *appsv1.ReplicaSet
	rc.eventually(what, func() error {
		d := rc.deployment()
		rss := rc.replicaSets()
		if more != nil {
			if err := more(d, rss); err != nil {
				return err
			}
		}
		if d.Status.ObservedGeneration != d.Generation || !available(d) {
			return fmt.Errorf("Deployment generation %d, observed %d, conditions %v", d.Generation, d.Status.ObservedGeneration, d.Status.Conditions)
		}
		if d.Annotations[prefix+"/phase"] != admission.PhaseInitialized || d.Annotations[prefix+"/controllers"] == "" {
			return fmt.Errorf("Deployment annotations %v: phase and controllers not recorded yet", d.Annotations)
		}
		cur = nil
		for i, r := range rss {
			if r.Spec.Template.Spec.Containers[0].Image == d.Spec.Template.Spec.Containers[0].Image {
				cur = &rss[i]
			}
		}
		if cur == nil || *cur.Spec.Replicas != *d.Spec.Replicas || cur.Annotations[prefix+"/controllers"] == "" {
			return fmt.Errorf("no current ReplicaSet with %d replicas and a recorded controller in %d", *d.Spec.Replicas, len(rss))
		}
		tasks, err := rc.s.node.Store().DriftTasks()
		if err != nil {
			return err
		}
		for _, tk := range tasks {
			if tk.ReportID == "" {
				return fmt.Errorf("follow-up task %s pending", tk.Key)
			}
		}
		if u := rc.s.node.DriftObjects().Cached(deploymentGVK, rc.ns, "web"); u == nil || u.GetResourceVersion() != d.ResourceVersion {
			return errors.New("webhook cache behind")
		}
		return nil
	})
	return cur
}

func available(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (rc *realChain) deployment() *appsv1.Deployment {
	rc.t.Helper()
	d, err := rc.s.Kube.AppsV1().Deployments(rc.ns).Get(rc.t.Context(), "web", metav1.GetOptions{})
	if err != nil {
		rc.t.Fatalf("get deployment: %v", err)
	}
	return d
}

func (rc *realChain) replicaSets() []appsv1.ReplicaSet {
	rc.t.Helper()
	l, err := rc.s.Kube.AppsV1().ReplicaSets(rc.ns).List(rc.t.Context(), metav1.ListOptions{})
	if err != nil {
		rc.t.Fatalf("list replicasets: %v", err)
	}
	return l.Items
}

func (rc *realChain) replicaSet(name string) *appsv1.ReplicaSet {
	rc.t.Helper()
	r, err := rc.s.Kube.AppsV1().ReplicaSets(rc.ns).Get(rc.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		rc.t.Fatalf("get replicaset %s: %v", name, err)
	}
	return r
}

// patchDeployment applies a strategic merge patch as the human.
func (rc *realChain) patchDeployment(patch string) {
	rc.t.Helper()
	if _, err := rc.human.kube.AppsV1().Deployments(rc.ns).Patch(rc.t.Context(), "web", "application/strategic-merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		rc.t.Fatalf("patch deployment: %v", err)
	}
}

func (rc *realChain) annotateDeployment(key, value string) {
	rc.t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		rc.t.Fatal(err)
	}
	rc.patchDeployment(string(b))
}

// scaleRS is the human scaling a ReplicaSet directly (kubectl scale rs):
// a new origin, allowed.
func (rc *realChain) scaleRS(name string, replicas int32) {
	rc.t.Helper()
	body := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := rc.human.kube.AppsV1().ReplicaSets(rc.ns).Patch(rc.t.Context(), name, "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
		rc.t.Fatalf("human scaling %s: %v, want allowed", name, err)
	}
}

// wantTrace checks the kinds, names, users and labels of the object's
// trace hops.
func (rc *realChain) wantTrace(rs *appsv1.ReplicaSet, want []admission.Hop) {
	rc.t.Helper()
	hops, err := admission.ParseTrace(rs.Annotations[prefix+"/trace"])
	if err != nil {
		rc.t.Fatal(err)
	}
	var got []admission.Hop
	for _, h := range hops {
		got = append(got, admission.Hop{Kind: h.Kind, Name: h.Name, User: h.User, Labels: h.Labels})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		rc.t.Errorf("trace of %s:\n got %+v\nwant %+v", rs.Name, got, want)
	}
}

// stored is the node's reports about children in the namespace, of one
// phase.
func (rc *realChain) stored(phase string) []store.DriftReport {
	rc.t.Helper()
	all, err := rc.s.node.Store().DriftReports(store.DriftFilter{Phase: phase})
	if err != nil {
		rc.t.Fatal(err)
	}
	var out []store.DriftReport
	for _, r := range all {
		var rep admission.DriftReport
		if err := json.Unmarshal(r.Report, &rep); err != nil {
			rc.t.Fatal(err)
		}
		if rep.Spec.Child.Namespace == rc.ns {
			out = append(out, r)
		}
	}
	return out
}

// received is the reports the callback receiver accepted, of one phase.
func (rc *realChain) received(phase string) []admission.DriftReport {
	var out []admission.DriftReport
	for _, r := range rc.s.recv.reports(rc.ns) {
		if r.Spec.Phase == phase {
			out = append(out, r)
		}
	}
	return out
}

// wantReports checks that the receiver accepted exactly this many
// reports of each phase, Detected ones first, and returns them in that
// order.
func (rc *realChain) wantReports(detected, resolved int) []admission.DriftReport {
	rc.t.Helper()
	det, res := rc.received(admission.ReportDetected), rc.received(admission.ReportResolved)
	if len(det) != detected || len(res) != resolved {
		var phases []string
		for _, r := range rc.s.recv.reports(rc.ns) {
			phases = append(phases, r.Spec.Phase+" "+r.Spec.Child.Name+" by "+r.Spec.Request.User)
		}
		rc.t.Fatalf("reports received: %s; want %d Detected and %d Resolved", strings.Join(phases, ", "), detected, resolved)
	}
	return append(det, res...)
}
