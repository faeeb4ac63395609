package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/sources"
)

// declared finds the policy named name in obs.
func declared(obs *sources.Observation, name string) *sources.Declared {
	for i := range obs.Policies {
		if obs.Policies[i].Policy.Name == name {
			return &obs.Policies[i]
		}
	}
	return nil
}

// TestObserveFollowsObjects creates, changes, annotates and deletes objects
// of both kinds and checks each observation and change signal.
func TestObserveFollowsObjects(t *testing.T) {
	needAPIServer(t)
	r := startDriver(t, Config{StatusInterval: 100 * time.Millisecond})
	r.observe(t, "empty start", func(obs *sources.Observation) error {
		if n := len(obs.Policies) + len(obs.Invalid); n != 0 {
			return fmt.Errorf("%d objects, want 0", n)
		}
		return nil
	})
	<-r.changed // the start's signals

	tp := create(t, toolPolicy("acme.deny-shell", v1alpha1.ToolPolicySpec{
		PolicySpec: v1alpha1.PolicySpec{
			Scope:       v1alpha1.Scope{Org: "acme", Team: "infra"},
			Labels:      map[string]string{"tier": "prod"},
			Enforcement: "shadow",
			Rollout:     &v1alpha1.Rollout{Stages: []string{"5%", "100%"}, Bake: "2m", MaxNackRatio: "0.01", OnHalt: "stay"},
		},
		ToolName:   "Bash",
		Action:     "deny",
		Reason:     "Shell commands blocked",
		Conditions: &v1alpha1.ToolConditions{Patterns: []string{"rm -rf"}},
	}))
	create(t, &v1alpha1.ValidatingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "acme.cel", Annotations: map[string]string{v1alpha1.AnnotationAdopt: "true"}},
		Spec: v1alpha1.ValidatingPolicySpec{
			MatchConditions: []v1alpha1.MatchCondition{{Name: "bash", Expression: `tool.name == "Bash"`}},
			Validations:     []v1alpha1.Validation{{Expression: "true", Message: "never", Reason: "Forbidden"}},
		},
	})
	select {
	case <-r.changed:
	case <-time.After(poll.DefaultWithin):
		t.Fatal("no change signalled after create")
	}

	obs := r.observe(t, "both objects", func(obs *sources.Observation) error {
		if len(obs.Policies) != 2 {
			return fmt.Errorf("%d policies, want 2", len(obs.Policies))
		}
		return nil
	})
	if obs.Atomic || obs.Revision == "" || len(obs.Invalid) != 0 {
		t.Errorf("Atomic %v, Revision %q, Invalid %v; want false, set, none", obs.Atomic, obs.Revision, obs.Invalid)
	}
	specOf := func(d *sources.Declared) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(d.Policy.Spec, &m); err != nil {
			t.Fatalf("spec of %s: %v", d.Object, err)
		}
		d.Policy.Spec = nil
		return m
	}
	gotTP := declared(obs, "acme.deny-shell")
	if diff := cmp.Diff(map[string]any{
		"tool_name": "Bash", "action": "deny", "reason": "Shell commands blocked",
		"conditions": map[string]any{"patterns": []any{"rm -rf"}},
	}, specOf(gotTP)); diff != "" {
		t.Errorf("ToolPolicy spec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sources.Declared{
		Policy: &policy.Policy{Name: "acme.deny-shell", Kind: "ToolPolicy",
			Scope: policy.Scope{Org: "acme", Team: "infra"}, Labels: map[string]string{"tier": "prod"}, Enforcement: "shadow"},
		Object:     "ToolPolicy acme.deny-shell",
		Generation: 1,
		Rollout:    &sources.Rollout{Stages: []string{"5%", "100%"}, Bake: 2 * time.Minute, MaxNackRatio: "0.01", OnHalt: "stay"},
	}, *gotTP); diff != "" {
		t.Errorf("ToolPolicy (-want +got):\n%s", diff)
	}
	gotVP := declared(obs, "acme.cel")
	if diff := cmp.Diff(map[string]any{
		"matchConditions": []any{map[string]any{"name": "bash", "expression": `tool.name == "Bash"`}},
		"validations":     []any{map[string]any{"expression": "true", "message": "never", "reason": "Forbidden"}},
	}, specOf(gotVP)); diff != "" {
		t.Errorf("ValidatingPolicy spec (-want +got):\n%s", diff)
	}
	if !gotVP.Adopt || gotVP.Object != "ValidatingPolicy acme.cel" {
		t.Errorf("ValidatingPolicy Adopt %v Object %q, want true, ValidatingPolicy acme.cel", gotVP.Adopt, gotVP.Object)
	}

	t.Run("change", func(t *testing.T) {
		patch := []byte(`{"spec":{"action":"audit"},"metadata":{"annotations":{"policyd.io/adopt":"true"}}}`)
		if _, err := dyn.Resource(v1alpha1.ToolPolicies).Patch(context.Background(), tp.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		r.observe(t, "changed ToolPolicy", func(obs *sources.Observation) error {
			d := declared(obs, "acme.deny-shell")
			if d == nil || d.Generation != 2 || !d.Adopt || !strings.Contains(string(d.Policy.Spec), `"action":"audit"`) {
				return fmt.Errorf("got %+v, want generation 2, adopt, action audit", d)
			}
			return nil
		})
	})
	t.Run("a name both kinds declare", func(t *testing.T) {
		create(t, &v1alpha1.ValidatingPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "acme.deny-shell"},
			Spec:       v1alpha1.ValidatingPolicySpec{Validations: []v1alpha1.Validation{{Expression: "true", Message: "m"}}},
		})
		r.observe(t, "the younger object invalid", func(obs *sources.Observation) error {
			want := []sources.ObjectError{{Object: "ValidatingPolicy acme.deny-shell", Name: "acme.deny-shell", Field: "metadata.name",
				Message: `policy "acme.deny-shell" is already declared by ToolPolicy acme.deny-shell`}}
			if diff := cmp.Diff(want, obs.Invalid); diff != "" {
				return fmt.Errorf("Invalid (-want +got):\n%s", diff)
			}
			if d := declared(obs, "acme.deny-shell"); d == nil || d.Policy.Kind != "ToolPolicy" {
				return fmt.Errorf("acme.deny-shell declared as %+v, want the ToolPolicy", d)
			}
			return nil
		})
		if err := dyn.Resource(v1alpha1.ValidatingPolicies).Delete(context.Background(), "acme.deny-shell", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("delete", func(t *testing.T) {
		before := r.observe(t, "before delete", func(*sources.Observation) error { return nil }).Revision
		if err := dyn.Resource(v1alpha1.ToolPolicies).Delete(context.Background(), tp.GetName(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		r.observe(t, "ToolPolicy gone", func(obs *sources.Observation) error {
			if declared(obs, "acme.deny-shell") != nil || len(obs.Policies) != 1 || len(obs.Invalid) != 0 {
				return fmt.Errorf("policies %d, invalid %v; want only acme.cel", len(obs.Policies), obs.Invalid)
			}
			if b, _ := strconv.Atoi(before); mustAtoi(t, obs.Revision) <= b {
				return fmt.Errorf("revision %s, want past %s", obs.Revision, before)
			}
			return nil
		})
	})
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("revision %q: %v", s, err)
	}
	return n
}

func validator(t *testing.T) *policy.Validator {
	t.Helper()
	v, err := policy.NewValidator(nil)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestObserveIncompleteWithoutWatch: before Watch runs nothing is known, so
// the observation must not prune.
func TestObserveIncompleteWithoutWatch(t *testing.T) {
	needAPIServer(t)
	d, err := New(Config{}, testEnv.Config, newFakeFleet(), nil)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := d.Observe(context.Background())
	if err != nil || obs.Complete {
		t.Fatalf("Observe = %+v, %v; want incomplete", obs, err)
	}
	if got, want := d.Name(), sources.Kubernetes; got != want {
		t.Errorf("Name = %q, want %q", got, want)
	}
}

// TestReportWritesConditions reports each outcome shape and checks the
// status the API server ends up holding.
func TestReportWritesConditions(t *testing.T) {
	needAPIServer(t)
	r := startDriver(t, Config{StatusInterval: 50 * time.Millisecond})
	idle := cond{"Progressing", "False", "Idle", "no staged rollout runs"}
	tests := []struct {
		name     string
		outcome  sources.Outcome
		sidecars sources.Sidecars
		stage    string
		want     []cond
		revision int64
		counts   *v1alpha1.Sidecars
	}{{
		name:     "committed, all acked",
		outcome:  sources.Outcome{State: sources.StateCommitted, Revision: 1042},
		sidecars: sources.Sidecars{Total: 3, Acked: 3},
		want:     []cond{{"Accepted", "True", "Committed", "revision 1042"}, {"RolledOut", "True", "AllAcked", "3/3 acked"}, idle},
		revision: 1042,
		counts:   &v1alpha1.Sidecars{Total: 3, Acked: 3},
	}, {
		name:     "committed, no sidecar",
		outcome:  sources.Outcome{State: sources.StateCommitted, Revision: 7},
		want:     []cond{{"Accepted", "True", "Committed", "revision 7"}, {"RolledOut", "True", "AllAcked", "0/0 acked"}, idle},
		revision: 7,
		counts:   &v1alpha1.Sidecars{},
	}, {
		name:     "pending",
		outcome:  sources.Outcome{State: sources.StateCommitted, Revision: 9},
		sidecars: sources.Sidecars{Total: 120, Acked: 100, Pending: 20},
		want:     []cond{{"Accepted", "True", "Committed", "revision 9"}, {"RolledOut", "False", "Pending", "100/120 acked"}, idle},
		revision: 9,
		counts:   &v1alpha1.Sidecars{Total: 120, Acked: 100, Pending: 20},
	}, {
		name:     "nacked",
		outcome:  sources.Outcome{State: sources.StateCommitted, Revision: 9},
		sidecars: sources.Sidecars{Total: 120, Acked: 118, Nacked: 1, Pending: 1, FirstNack: "compile pattern: missing )"},
		want: []cond{{"Accepted", "True", "Committed", "revision 9"},
			{"RolledOut", "False", "Nacked", "118/120 acked, 1 nacked: compile pattern: missing )"}, idle},
		revision: 9,
		counts:   &v1alpha1.Sidecars{Total: 120, Acked: 118, Nacked: 1, Pending: 1},
	}, {
		name:     "nacked while all others acked",
		outcome:  sources.Outcome{State: sources.StateCommitted, Revision: 9},
		sidecars: sources.Sidecars{Total: 2, Acked: 1, Nacked: 1, FirstNack: "bad"},
		want:     []cond{{"Accepted", "True", "Committed", "revision 9"}, {"RolledOut", "False", "Nacked", "1/2 acked, 1 nacked: bad"}, idle},
		revision: 9,
		counts:   &v1alpha1.Sidecars{Total: 2, Acked: 1, Nacked: 1},
	}, {
		name:     "progressing",
		outcome:  sources.Outcome{State: sources.StateCommitted, Revision: 11},
		sidecars: sources.Sidecars{Total: 20, Acked: 1, Pending: 19},
		stage:    "5%",
		want: []cond{{"Accepted", "True", "Committed", "revision 11"}, {"RolledOut", "False", "Pending", "1/20 acked"},
			{"Progressing", "True", "Staging", "stage 5%"}},
		revision: 11,
		counts:   &v1alpha1.Sidecars{Total: 20, Acked: 1, Pending: 19},
	}, {
		name:    "invalid",
		outcome: sources.Outcome{State: sources.StateInvalid, Message: "spec.tool_name: required; spec.conditions.patterns[0]: invalid regexp: missing closing ): `(`"},
		want:    []cond{{"Accepted", "False", "Invalid", "spec.toolName: required; spec.conditions.patterns[0]: invalid regexp: missing closing ): `(`"}},
	}, {
		name:    "conflict",
		outcome: sources.Outcome{State: sources.StateConflict, Message: "owned by git:policies (policies/deny.yaml#1)"},
		want:    []cond{{"Accepted", "False", "Conflict", "owned by git:policies (policies/deny.yaml#1)"}},
	}, {
		name:    "prune refused",
		outcome: sources.Outcome{State: sources.StatePruneRefused, Message: "the sync would delete 8 of 10 policies"},
		want:    []cond{{"Accepted", "False", "PruneRefused", "the sync would delete 8 of 10 policies"}},
	}, {
		name:    "failed",
		outcome: sources.Outcome{State: sources.StateFailed, Message: "not the leader"},
		want:    []cond{{"Accepted", "False", "Failed", "not the leader"}},
	}}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("report-%d", i)
			u := create(t, toolPolicy(name, v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny"}))
			r.fleet.set(name, tc.sidecars, tc.stage)
			out := tc.outcome
			out.Object, out.Name, out.Generation = "ToolPolicy "+name, name, u.GetGeneration()
			r.Report(context.Background(), []sources.Outcome{out})
			want := &v1alpha1.PolicyStatus{ObservedGeneration: 1, Revision: tc.revision, Source: "kubernetes", Sidecars: tc.counts}
			poll.Eventually(t, "status written", func() error {
				st, err := statusOf("ToolPolicy", name)
				if err != nil {
					return err
				}
				if diff := cmp.Diff(tc.want, conds(st)); diff != "" {
					return fmt.Errorf("conditions (-want +got):\n%s", diff)
				}
				st.Conditions = nil
				if diff := cmp.Diff(want, st); diff != "" {
					return fmt.Errorf("status (-want +got):\n%s", diff)
				}
				return nil
			})
		})
	}

	t.Run("pending then all acked", func(t *testing.T) {
		name := "report-pending"
		create(t, toolPolicy(name, v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny"}))
		r.fleet.set(name, sources.Sidecars{Total: 2, Acked: 1, Pending: 1}, "")
		r.Report(context.Background(), []sources.Outcome{{Object: "ToolPolicy " + name, Name: name, Generation: 1, State: sources.StateCommitted, Revision: 5}})
		waitRolledOut(t, name, "False", "Pending", "1/2 acked")
		r.fleet.set(name, sources.Sidecars{Total: 2, Acked: 2}, "")
		// No new report: the writer keeps looking until the rollout is final.
		waitRolledOut(t, name, "True", "AllAcked", "2/2 acked")
	})
	t.Run("staging ends", func(t *testing.T) {
		name := "report-5" // staging at 5% above
		r.fleet.set(name, sources.Sidecars{Total: 20, Acked: 20}, "")
		poll.Eventually(t, "Progressing=False", func() error {
			st, err := statusOf("ToolPolicy", name)
			if err != nil {
				return err
			}
			want := []cond{{"Accepted", "True", "Committed", "revision 11"}, {"RolledOut", "True", "AllAcked", "20/20 acked"}, idle}
			if diff := cmp.Diff(want, conds(st)); diff != "" {
				return fmt.Errorf("conditions (-want +got):\n%s", diff)
			}
			return nil
		})
	})
	t.Run("nack resolved", func(t *testing.T) {
		name := "report-3" // nacked above
		r.fleet.set(name, sources.Sidecars{Total: 120, Acked: 120}, "")
		waitRolledOut(t, name, "True", "AllAcked", "120/120 acked")
	})
	t.Run("status overwritten by someone else", func(t *testing.T) {
		name := "report-1" // committed at 7 above
		u, err := dyn.Resource(v1alpha1.ToolPolicies).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u.Object["status"] = map[string]any{"source": "someone", "revision": int64(1)}
		if _, err := dyn.Resource(v1alpha1.ToolPolicies).UpdateStatus(context.Background(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// No report: the driver sees the foreign write in its informer and
		// writes its own status back over it.
		poll.Eventually(t, "status restored", func() error {
			st, err := statusOf("ToolPolicy", name)
			if err != nil {
				return err
			}
			if st.Source != "kubernetes" || st.Revision != 7 || condition(st, "RolledOut") == nil {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
	})
	t.Run("invalid keeps what is in force", func(t *testing.T) {
		name := "report-0" // committed at 1042 above
		r.Report(context.Background(), []sources.Outcome{{Object: "ToolPolicy " + name, Name: name, Generation: 2, State: sources.StateInvalid, Message: "spec.action: bad"}})
		poll.Eventually(t, "Accepted=False", func() error {
			st, err := statusOf("ToolPolicy", name)
			if err != nil {
				return err
			}
			if c := condition(st, "Accepted"); c == nil || c.Reason != "Invalid" || st.ObservedGeneration != 2 {
				return fmt.Errorf("Accepted %+v, observedGeneration %d", c, st.ObservedGeneration)
			}
			if c := condition(st, "RolledOut"); c == nil || c.Status != "True" || st.Revision != 1042 {
				return fmt.Errorf("RolledOut %+v, revision %d; want the committed revision's", c, st.Revision)
			}
			return nil
		})
	})
	t.Run("deleted object", func(t *testing.T) {
		r.Report(context.Background(), []sources.Outcome{{Object: "ToolPolicy gone", Name: "gone", Generation: 1, State: sources.StateCommitted, Revision: 1}})
		poll.Eventually(t, "entry dropped", func() error {
			r.status.mu.Lock()
			defer r.status.mu.Unlock()
			if _, ok := r.status.entries["ToolPolicy gone"]; ok {
				return fmt.Errorf("still pending")
			}
			return nil
		})
	})
}

func waitRolledOut(t *testing.T, name, status, reason, msg string) {
	t.Helper()
	poll.Eventually(t, "RolledOut "+reason, func() error {
		st, err := statusOf("ToolPolicy", name)
		if err != nil {
			return err
		}
		c := condition(st, "RolledOut")
		if c == nil || string(c.Status) != status || c.Reason != reason || c.Message != msg {
			return fmt.Errorf("RolledOut = %+v, want %s %s %q", c, status, reason, msg)
		}
		return nil
	})
}

// TestStatusWritesAtMostOncePerInterval keeps the rollout moving and the
// reports coming and checks that one object is written at most once a
// second.
func TestStatusWritesAtMostOncePerInterval(t *testing.T) {
	needAPIServer(t)
	r := startDriver(t, Config{}) // the default interval: one second
	const name = "batched"
	create(t, toolPolicy(name, v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny"}))
	r.fleet.mu.Lock()
	r.fleet.next = func(_ string, calls int) sources.Sidecars { // never final, always changed
		return sources.Sidecars{Total: 1000, Acked: calls, Pending: 1000 - calls}
	}
	r.fleet.mu.Unlock()

	var revision uint64 = 1
	report := func() {
		revision++
		r.Report(context.Background(), []sources.Outcome{{Object: "ToolPolicy " + name, Name: name, Generation: 1, State: sources.StateCommitted, Revision: revision}})
	}
	report()
	start := time.Now()
	poll.Throughout(t, "reports every 50ms", 3500*time.Millisecond, func() error { report(); return nil }, poll.Every(50*time.Millisecond))
	writes := r.writes.of(name)
	if len(writes) < 3 {
		t.Fatalf("%d writes in %v, want at least 3 (one a second)", len(writes), time.Since(start))
	}
	for i := 1; i < len(writes); i++ {
		if gap := writes[i].Sub(writes[i-1]); gap < 950*time.Millisecond {
			t.Errorf("writes %d and %d %v apart, want at least a second", i-1, i, gap)
		}
	}
	if n := len(writes); n > 5 {
		t.Errorf("%d writes in 3.5s, want at most 5", n)
	}
}

// TestThousandObjectsReachFinalStatusThenRest applies 1,000 objects at once,
// reports them committed, and checks that every status is final within
// 10s (without -race; see raceEnabled), after which nothing is written and
// the fleet is not asked.
func TestThousandObjectsReachFinalStatusThenRest(t *testing.T) {
	needAPIServer(t)
	const n = 1000
	r := startDriver(t, Config{})
	r.fleet.mu.Lock()
	r.fleet.next = func(_ string, calls int) sources.Sidecars {
		if calls == 1 {
			return sources.Sidecars{Total: 3, Acked: 1, Pending: 2} // the first look: still pending
		}
		return sources.Sidecars{Total: 3, Acked: 3}
	}
	r.fleet.mu.Unlock()

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				u := toUnstructured(t, toolPolicy(fmt.Sprintf("bulk-%04d", i), v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny"}))
				if _, err := dyn.Resource(v1alpha1.ToolPolicies).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	obs := r.observe(t, "1,000 policies", func(obs *sources.Observation) error {
		if len(obs.Policies) != n {
			return fmt.Errorf("%d policies, want %d", len(obs.Policies), n)
		}
		return nil
	})
	outcomes := make([]sources.Outcome, 0, n)
	for i, d := range obs.Policies {
		outcomes = append(outcomes, sources.Outcome{Object: d.Object, Name: d.Policy.Name, Generation: d.Generation, State: sources.StateCommitted, Revision: uint64(100 + i)})
	}
	// Follow the statuses with a watch: listing 1,000 objects again and
	// again would load the API server more than the writes do.
	list, err := dyn.Resource(v1alpha1.ToolPolicies).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	wi, err := dyn.Resource(v1alpha1.ToolPolicies).Watch(wctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer wi.Stop()
	var (
		mu    sync.Mutex
		final = map[string]bool{}
	)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range wi.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				mu.Lock()
				final[u.GetName()] = rolledOut(*u) == "AllAcked"
				mu.Unlock()
			}
		}
	}()
	defer func() { wi.Stop(); <-watched }()

	within := 10 * time.Second
	if raceEnabled {
		within = 60 * time.Second // the bound itself is checked without -race
	}
	start := time.Now()
	r.Report(context.Background(), outcomes)
	poll.Eventually(t, "every status final", func() error {
		mu.Lock()
		defer mu.Unlock()
		done := 0
		for _, f := range final {
			if f {
				done++
			}
		}
		if done != n {
			return fmt.Errorf("%d of %d final", done, n)
		}
		return nil
	}, poll.Within(within))
	t.Logf("1,000 objects final %v after the report, %d status writes", time.Since(start), r.writes.count())

	writes, looks := r.writes.count(), r.fleet.total.Load()
	poll.Throughout(t, "at rest", 3*time.Second, func() error {
		if w, l := r.writes.count(), r.fleet.total.Load(); w != writes || l != looks {
			return fmt.Errorf("%d writes and %d rollout looks at rest", w-writes, l-looks)
		}
		return nil
	}, poll.Every(100*time.Millisecond))

	// A report that changes nothing writes nothing.
	r.Report(context.Background(), outcomes)
	poll.Eventually(t, "the report looked at", func() error {
		if l := r.fleet.total.Load(); l < looks+n {
			return fmt.Errorf("%d of %d looked at", l-looks, n)
		}
		return nil
	})
	if w := r.writes.count(); w != writes {
		t.Errorf("an unchanged report made %d writes, want 0", w-writes)
	}
}

func rolledOut(u unstructured.Unstructured) string {
	cs, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok && m["type"] == "RolledOut" {
			s, _ := m["reason"].(string)
			return s
		}
	}
	return ""
}

// TestSchemaRefuses checks the CRDs' OpenAPI schema at the API server.
func TestSchemaRefuses(t *testing.T) {
	needAPIServer(t)
	tests := []struct {
		name  string
		obj   map[string]any
		field string
	}{
		{"missing toolName", map[string]any{"kind": "ToolPolicy", "spec": map[string]any{"action": "deny"}}, "spec.toolName"},
		{"bad action", map[string]any{"kind": "ToolPolicy", "spec": map[string]any{"toolName": "Bash", "action": "block"}}, "spec.action"},
		{"bad enforcement", map[string]any{"kind": "ToolPolicy", "spec": map[string]any{"toolName": "Bash", "action": "deny", "enforcement": "maybe"}}, "spec.enforcement"},
		{"bad onHalt", map[string]any{"kind": "ToolPolicy", "spec": map[string]any{"toolName": "Bash", "action": "deny",
			"rollout": map[string]any{"stages": []any{"100%"}, "onHalt": "hold"}}}, "spec.rollout.onHalt"},
		{"no validations", map[string]any{"kind": "ValidatingPolicy", "spec": map[string]any{"validations": []any{}}}, "spec.validations"},
		{"validation without message", map[string]any{"kind": "ValidatingPolicy", "spec": map[string]any{"validations": []any{map[string]any{"expression": "true"}}}}, "spec.validations[0].message"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: tc.obj}
			u.SetAPIVersion(v1alpha1.GroupVersion.String())
			u.SetName("schema")
			gvr, _ := resourceOf(u.GetKind())
			_, err := dyn.Resource(gvr).Create(context.Background(), u, metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("create = %v, want Invalid naming %s", err, tc.field)
			}
		})
	}
}

// TestWebhookRefusesAtTheAPIServer creates objects through the API server,
// which calls the webhook as components/policy-webhook registers it.
func TestWebhookRefusesAtTheAPIServer(t *testing.T) {
	needAPIServer(t)
	tests := []struct {
		name    string
		obj     *unstructured.Unstructured
		message string // "" for accepted
	}{
		{"valid", toUnstructured(t, toolPolicy("hook.ok", v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny"})), ""},
		{"bad RE2", toUnstructured(t, toolPolicy("hook.re2", v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny",
			Conditions: &v1alpha1.ToolConditions{Patterns: []string{"(unclosed"}}})),
			"spec.conditions.patterns[0]: invalid regexp: missing closing ): `(unclosed`"},
		{"bad scope", toUnstructured(t, toolPolicy("hook.scope", v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny",
			PolicySpec: v1alpha1.PolicySpec{Scope: v1alpha1.Scope{Org: "Acme!"}}})),
			"scope.org: must be 1 to 63 lowercase letters"},
		{"bad CEL", toUnstructured(t, &v1alpha1.ValidatingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "hook.cel"},
			Spec: v1alpha1.ValidatingPolicySpec{Validations: []v1alpha1.Validation{{Expression: "tool.name ==", Message: "m"}}}}),
			"spec.validations[0].expression: compile error: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gvr, _ := resourceOf(tc.obj.GetKind())
			_, err := dyn.Resource(gvr).Create(context.Background(), tc.obj, metav1.CreateOptions{})
			if tc.message == "" {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), `admission webhook "policies.policyd.io" denied the request`) ||
				!strings.Contains(err.Error(), tc.message) {
				t.Fatalf("create = %v, want the webhook's denial with %q", err, tc.message)
			}
		})
	}
}

// TestWatchPerTerm runs one driver through two leadership terms, with a
// report made between them.
func TestWatchPerTerm(t *testing.T) {
	needAPIServer(t)
	fleet := newFakeFleet()
	d, err := New(Config{StatusInterval: 50 * time.Millisecond}, testEnv.Config, fleet, nil)
	if err != nil {
		t.Fatal(err)
	}
	create(t, toolPolicy("term", v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny"}))
	term := func(check func() error) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Watch(ctx, func() {}) }()
		poll.Eventually(t, "the term's check", check)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Watch: %v", err)
		}
	}
	observed := func() error {
		obs, err := d.Observe(context.Background())
		if err != nil {
			return err
		}
		if !obs.Complete || len(obs.Policies) != 1 {
			return fmt.Errorf("complete %v, %d policies", obs.Complete, len(obs.Policies))
		}
		return nil
	}
	term(observed)
	if obs, _ := d.Observe(context.Background()); obs.Complete {
		t.Fatal("complete between terms")
	}
	d.Report(context.Background(), []sources.Outcome{{Object: "ToolPolicy term", Name: "term", Generation: 1, State: sources.StateCommitted, Revision: 3}})
	term(func() error {
		if err := observed(); err != nil {
			return err
		}
		st, err := statusOf("ToolPolicy", "term")
		if err != nil {
			return err
		}
		if c := condition(st, "RolledOut"); c == nil || c.Reason != "AllAcked" {
			return fmt.Errorf("RolledOut %+v", c)
		}
		return nil
	})
}
