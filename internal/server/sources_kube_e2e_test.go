package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/kubetest"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/store"
)

// kubeCluster is a real kube-apiserver with the shipped CRDs, kubectl, and
// a 3-node cluster whose leader reconciles the Kubernetes source.
type kubeCluster struct {
	*cluster
	env        *kubetest.Env
	dyn        dynamic.Interface
	kubeconfig string
	dir        string
}

func newKubeCluster(t *testing.T) *kubeCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an API server and a cluster: not in -short (make check)")
	}
	env, err := kubetest.Start(kubetest.Options{CRDs: []string{filepath.Join("..", "..", "deploy", "kubernetes", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	k := &kubeCluster{env: env, dir: t.TempDir()}
	k.kubeconfig = filepath.Join(k.dir, "kubeconfig")
	if err := env.WriteKubeconfig(k.kubeconfig, kubetest.Kubeconfig{}); err != nil {
		t.Fatal(err)
	}
	if k.dyn, err = dynamic.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	k.cluster = newCluster(t, 3, func(cfg *config.Config) {
		cfg.Kubernetes.Kubeconfig = k.kubeconfig
		cfg.Sources.Kubernetes.Enabled = true
	})
	return k
}

// kubectl runs kubectl (built by hack/kube-bins.sh beside the API server)
// with stdin, and returns its output; it fails the test unless wantErr.
func (k *kubeCluster) kubectl(stdin string, wantErr bool, args ...string) string {
	k.t.Helper()
	cmd := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if (err != nil) != wantErr {
		k.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (k *kubeCluster) apply(docs ...string) {
	k.t.Helper()
	k.kubectl(strings.Join(docs, "---\n"), false, "apply", "-f", "-")
}

// kubeTool is a ToolPolicy object in org acme.
func kubeTool(name, reason string, annotations ...string) string {
	meta := "{name: " + name + "}"
	if len(annotations) > 0 {
		meta = fmt.Sprintf("{name: %s, annotations: {%s}}", name, strings.Join(annotations, ", "))
	}
	return fmt.Sprintf("apiVersion: policyd.io/v1alpha1\nkind: ToolPolicy\nmetadata: %s\nspec:\n  scope: {org: acme}\n  toolName: Bash\n  action: deny\n  reason: %q\n  conditions: {patterns: [\"rm -rf\"]}\n", meta, reason)
}

// status reads a ToolPolicy's status.
func (k *kubeCluster) status(name string) (v1alpha1.PolicyStatus, int64) {
	k.t.Helper()
	u, err := k.dyn.Resource(v1alpha1.ToolPolicies).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	var tp v1alpha1.ToolPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &tp); err != nil {
		k.t.Fatal(err)
	}
	return tp.Status, tp.Generation
}

// condition waits until name's status, for its current generation, has
// condition typ with status and reason, and a message containing msg.
func (k *kubeCluster) condition(name, typ string, status metav1.ConditionStatus, reason, msg string) v1alpha1.PolicyStatus {
	k.t.Helper()
	var st v1alpha1.PolicyStatus
	poll.Eventually(k.t, fmt.Sprintf("%s: %s=%s (%s)", name, typ, status, reason), func() error {
		var gen int64
		st, gen = k.status(name)
		c := meta.FindStatusCondition(st.Conditions, typ)
		switch {
		case st.ObservedGeneration != gen:
			return fmt.Errorf("observedGeneration %d, generation %d", st.ObservedGeneration, gen)
		case c == nil:
			return fmt.Errorf("no %s condition in %+v", typ, st.Conditions)
		case c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg):
			return fmt.Errorf("%s is %s/%s %q", typ, c.Status, c.Reason, c.Message)
		}
		return nil
	}, poll.Within(20*time.Second))
	return st
}

// policies waits until every running node holds want (name → source) of
// the policies named with prefix.
func (k *kubeCluster) policies(what, prefix string, want map[string]string) {
	k.t.Helper()
	poll.Eventually(k.t, what, func() error {
		for _, n := range k.running() {
			got := map[string]string{}
			for name, src := range owners(k.t, n) {
				if strings.HasPrefix(name, prefix) {
					got[name] = src
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("%s holds %d: %.300v; want %d", n.ID(), len(got), fmt.Sprint(got), len(want))
			}
		}
		return nil
	}, poll.Within(30*time.Second))
}

// TestKubernetesSource walks the Kubernetes source through its cases on a
// 3-node cluster, with kubectl and SDK sidecars on both transports:
// create, change and delete; RolledOut once every sidecar ACKed, and a
// NACK in it; spec.rollout staging a change; an invalid object (the webhook off) is Accepted=False with
// its field; a conflict with an API policy, then adopt; the API cannot
// change a managed policy; a prune refusal and --allow-prune; 1,000
// objects in one apply, in few entries; the leader killed mid-sync;
// policyd down while objects change.
func TestKubernetesSource(t *testing.T) {
	k := newKubeCluster(t)
	api := apiFor(t, k.follower())
	if err := api.client.Do(t.Context(), http.MethodPut, "/v1/employees/alice", nil, []byte(`{"org":"acme","team":"","status":"active"}`), nil); err != nil {
		t.Fatal(err)
	}
	nacker := func(set []client.Policy) error {
		for _, p := range set {
			if strings.Contains(string(p.Spec), "nack-me") {
				return fmt.Errorf("this sidecar refuses %s", p.Name)
			}
		}
		return nil
	}
	grpcSDK := startSDK(t, client.Config{Transport: client.TransportGRPC, Servers: []string{k.nodes[1].GRPCAddr()}, Scope: client.Scope{Org: "acme"}})
	wsSDK := startSDK(t, client.Config{Transport: client.TransportWS, Servers: []string{k.nodes[2].HTTPAddr()}, Employee: "alice"})

	// Create, and RolledOut once both sidecars hold it.
	k.apply(kubeTool("acme.k1", "one"), kubeTool("acme.k2", "two"))
	k.policies("the created policies", "acme.k", map[string]string{"acme.k1": "kubernetes", "acme.k2": "kubernetes"})
	grpcSDK.hasPolicy(t, "acme.k1")
	wsSDK.hasPolicy(t, "acme.k1")
	st := k.condition("acme.k1", v1alpha1.ConditionRolledOut, metav1.ConditionTrue, v1alpha1.ReasonAllAcked, "")
	if st.Sidecars.Total != 2 || st.Sidecars.Acked != 2 || st.Source != "kubernetes" || st.Revision == 0 {
		t.Errorf("acme.k1 status %+v; want 2 of 2 sidecars acked at a revision, source kubernetes", st)
	}
	k.condition("acme.k1", v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonCommitted, fmt.Sprintf("revision %d", st.Revision))

	// The API cannot change it.
	if r := api.do(http.MethodPut, "/v1/policies/acme.k1", toolPolicy("acme.k1", "acme", "by hand"), nil); r.status != http.StatusConflict ||
		!strings.Contains(string(r.body), "managed by kubernetes (ToolPolicy acme.k1); change it there") {
		t.Errorf("PUT of a managed policy: %d %s", r.status, r.body)
	}

	// A change a sidecar refuses: RolledOut says so.
	k3 := startSDK(t, client.Config{Transport: client.TransportGRPC, Servers: []string{k.nodes[0].GRPCAddr()}, Scope: client.Scope{Org: "acme", Team: "t3"}, Apply: nacker})
	_ = k3
	k.apply(kubeTool("acme.k1", "nack-me"))
	k.condition("acme.k1", v1alpha1.ConditionRolledOut, metav1.ConditionFalse, v1alpha1.ReasonNacked, "this sidecar refuses acme.k1")
	k.apply(kubeTool("acme.k1", "changed"))
	k.condition("acme.k1", v1alpha1.ConditionRolledOut, metav1.ConditionTrue, v1alpha1.ReasonAllAcked, "")
	if p, err := k.nodes[0].Store().GetPolicy("acme.k1"); err != nil || !strings.Contains(string(p.Spec), "changed") {
		t.Errorf("acme.k1 after the change: %v, %v", p, err)
	}

	// spec.rollout stages a change: Progressing while it runs, then the
	// candidate is the source's policy.
	k.apply(strings.Replace(kubeTool("acme.k2", "staged"), "  toolName: Bash\n",
		"  toolName: Bash\n  rollout: {stages: [\"50%\", \"100%\"], bake: 1s}\n", 1))
	k.condition("acme.k2", v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonStaging, "stage")
	poll.Eventually(t, "the staged change completed", func() error {
		p, err := k.nodes[0].Store().GetPolicy("acme.k2")
		if err != nil {
			return err
		}
		if p.Source != "kubernetes" || !strings.Contains(string(p.Spec), "staged") {
			return fmt.Errorf("acme.k2 is %s from %q", p.Spec, p.Source)
		}
		return nil
	}, poll.Within(30*time.Second))
	k.condition("acme.k2", v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.ReasonIdle, "")
	k.condition("acme.k2", v1alpha1.ConditionRolledOut, metav1.ConditionTrue, v1alpha1.ReasonAllAcked, "")

	// An invalid object, written with no webhook in the way.
	bad := strings.Replace(kubeTool("acme.kbad", "bad"), `["rm -rf"]`, `["("]`, 1)
	k.apply(bad)
	k.condition("acme.kbad", v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonInvalid, "spec.conditions.patterns[0]")

	// A conflict with the API's policy, then adopt.
	api.putPolicy("acme.kapi", "acme", "the API's")
	k.apply(kubeTool("acme.kapi", "taken"))
	k.condition("acme.kapi", v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonConflict, "owned by the API")
	k.apply(kubeTool("acme.kapi", "taken", `policyd.io/adopt: "true"`))
	k.condition("acme.kapi", v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonCommitted, "")
	k.policies("the adopted policy", "acme.k", map[string]string{"acme.k1": "kubernetes", "acme.k2": "kubernetes", "acme.kapi": "kubernetes"})

	// Delete.
	k.kubectl("", false, "delete", "toolpolicy", "acme.k2")
	k.policies("the deletion", "acme.k", map[string]string{"acme.k1": "kubernetes", "acme.kapi": "kubernetes"})

	// Deleting everything is refused, until it is allowed.
	k.kubectl("", false, "delete", "toolpolicies", "--all")
	poll.Eventually(t, "the prune refusal", func() error {
		list, err := apiFor(t, k.leader()).client.Sources(t.Context())
		if err != nil {
			return err
		}
		for _, s := range list.Sources {
			if s.Name == "kubernetes" && s.Reconciler != nil && s.Reconciler.PruneRefused != nil {
				return nil
			}
		}
		return fmt.Errorf("no refusal: %+v", list)
	})
	k.policies("nothing pruned", "acme.k", map[string]string{"acme.k1": "kubernetes", "acme.kapi": "kubernetes"})
	if _, err := api.client.SyncSource(t.Context(), "kubernetes", true); err != nil {
		t.Fatal(err)
	}
	k.policies("the allowed prune", "acme.k", map[string]string{})

	// 1,000 objects in one apply: a few entries, every policy.
	before := k.nodes[0].Store().AppliedIndex()
	var docs []string
	want := map[string]string{}
	for i := range 1000 {
		name := fmt.Sprintf("acme.kb%04d", i)
		docs = append(docs, kubeTool(name, "batch"))
		want[name] = "kubernetes"
	}
	applyStart := time.Now()
	k.kubectl(strings.Join(docs, "---\n"), false, "apply", "--server-side", "-f", "-")
	applyTook := time.Since(applyStart)
	k.policies("the batch", "acme.kb", want)
	page, err := k.nodes[0].Store().ListEvents(store.EventFilter{Type: store.EntityPolicy, After: before, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	entries := map[uint64]bool{}
	for _, ev := range page.Events {
		entries[ev.ID] = true
	}
	// kubectl creates the objects one by one, over seconds; the engine
	// coalesces what it sees within a second of the first change.
	if most := int(applyTook/time.Second) + 2; len(entries) > most {
		t.Errorf("the batch took %d entries over kubectl's %v; want at most %d", len(entries), applyTook, most)
	}
	t.Logf("1,000 objects in %d entries over kubectl's %v", len(entries), applyTook)

	// The leader killed while kubectl is still creating objects: the new
	// leader converges on all of them, each created once.
	var more []string
	wantMore := map[string]string{}
	for i := range 300 {
		name := fmt.Sprintf("acme.kc%03d", i)
		more = append(more, kubeTool(name, "during the kill"))
		wantMore[name] = "kubernetes"
	}
	beforeKill := k.nodes[0].Store().AppliedIndex()
	applied := make(chan string, 1)
	go func() {
		cmd := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), "--kubeconfig", k.kubeconfig, "apply", "-f", "-")
		cmd.Stdin = strings.NewReader(strings.Join(more, "---\n"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			applied <- fmt.Sprintf("%v: %s", err, out)
			return
		}
		applied <- ""
	}()
	leader := k.leader()
	poll.Eventually(t, "the first of the objects synced", func() error {
		if _, err := leader.Store().GetPolicy("acme.kc000"); err != nil {
			return err
		}
		return nil
	})
	killed := k.indexOf(leader)
	k.crash(killed)
	if msg := <-applied; msg != "" {
		t.Fatalf("kubectl apply: %s", msg)
	}
	k.leader()
	k.restart(killed)
	k.policies("converged after the leader's kill", "acme.kc", wantMore)
	for _, n := range k.running() {
		page, err := n.Store().ListEvents(store.EventFilter{Type: store.EntityPolicy, Limit: 1000, After: beforeKill})
		if err != nil {
			t.Fatal(err)
		}
		creates := map[string]int{}
		for _, ev := range page.Events {
			if ev.Action == store.ActionCreate && strings.HasPrefix(ev.EntityID, "acme.kc") {
				creates[ev.EntityID]++
			}
		}
		for name := range wantMore {
			if creates[name] != 1 {
				t.Fatalf("%s: %s created %d times", n.ID(), name, creates[name])
			}
		}
	}

	// policyd down while objects change: converged after the restart.
	for i := range k.nodes {
		k.stop(i)
	}
	k.kubectl("", false, "delete", "toolpolicy", "acme.kb0000")
	k.apply(kubeTool("acme.kb0001", "changed while down"))
	for i := range k.nodes {
		k.restart(i)
	}
	k.leader()
	delete(want, "acme.kb0000")
	k.policies("converged after the restart", "acme.kb", want)
	poll.Eventually(t, "the change made while down", func() error {
		p, err := k.nodes[1].Store().GetPolicy("acme.kb0001")
		if err != nil {
			return err
		}
		if !strings.Contains(string(p.Spec), "changed while down") {
			return fmt.Errorf("spec %s", p.Spec)
		}
		return nil
	}, poll.Within(20*time.Second))
}
