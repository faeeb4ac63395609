package admission

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/drift/admission/initrule"
)

// TestPhase covers the default initialization detection order, the high
// water mark, deletion, and the per-kind rules.
func TestPhase(t *testing.T) {
	widget := func(opts ...objOpt) *unstructured.Unstructured {
		return newObj("example.com/v1", "Widget", "w", append([]objOpt{gen(2)}, opts...)...)
	}
	deploy := func(opts ...objOpt) *unstructured.Unstructured {
		return newObj("apps/v1", "Deployment", "d", append([]objOpt{gen(2)}, opts...)...)
	}
	rs := func(kind string, opts ...objOpt) *unstructured.Unstructured {
		return newObj("apps/v1", kind, "r", append([]objOpt{gen(2), obsGen(2)}, opts...)...)
	}
	custom := Config{Initialization: []InitOverride{
		{Group: "example.com", Kind: "Widget", Conditions: []string{"Synced"}},
		{Group: "apps", Kind: "StatefulSet", Conditions: []string{"Healthy"}},
	}}
	rules := func(texts ...string) Config {
		var c Config
		for _, s := range texts {
			r, err := initrule.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			c.Initialization = append(c.Initialization, r)
		}
		return c
	}
	seedDeploy := rules("apps/Deployment=default")
	anyOf := rules("apps/Deployment=default", "apps/Deployment=Available+observedGeneration")
	tests := []struct {
		name string
		cfg  Config
		obj  *unstructured.Unstructured
		want string
	}{
		{"no status", Config{}, widget(), PhaseInitializing},
		{"1. phase annotation", Config{}, widget(ann("phase", PhaseInitialized)), PhaseInitialized},
		{"1. annotation is a high water mark: Ready=False does not downgrade", Config{}, widget(ann("phase", PhaseInitialized), cond("Ready", "False")), PhaseInitialized},
		{"phase annotation initializing means nothing", Config{}, widget(ann("phase", PhaseInitializing)), PhaseInitializing},
		{"2. Initialized=True", Config{}, widget(cond("Initialized", "True")), PhaseInitialized},
		{"3. Ready=True", Config{}, widget(cond("Ready", "True"), obsGen(1)), PhaseInitialized},
		{"4. observedGeneration == generation with Ready=True", Config{}, widget(obsGen(2), cond("Ready", "True")), PhaseInitialized},
		{"observedGeneration == generation alone", Config{}, widget(obsGen(2)), PhaseInitializing},
		{"Synced=True with Ready=False is still initializing", Config{}, widget(obsGen(2), cond("Synced", "True"), cond("Ready", "False")), PhaseInitializing},
		{"Ready=Unknown", Config{}, widget(cond("Ready", "Unknown")), PhaseInitializing},
		{"deletionTimestamp wins over everything", Config{}, widget(deleting(), ann("phase", PhaseInitialized)), PhaseDeleting},
		{"malformed conditions are skipped", Config{}, widget(func(u *unstructured.Unstructured) {
			sub(u, "status")["conditions"] = []any{"x", 3, map[string]any{"type": 1}, map[string]any{"type": "Ready", "status": "True"}}
		}), PhaseInitialized},
		{"conditions not a list", Config{}, widget(statusField("conditions", "Ready")), PhaseInitializing},

		{"Deployment Available=True and observed", Config{}, deploy(obsGen(2), cond("Available", "True")), PhaseInitialized},
		{"Deployment Available=True, not yet observed", Config{}, deploy(obsGen(1), cond("Available", "True")), PhaseInitializing},
		{"Deployment Available=False", Config{}, deploy(obsGen(2), cond("Available", "False")), PhaseInitializing},
		{"Deployment Ready=True is not its rule", Config{}, deploy(cond("Ready", "True")), PhaseInitializing},
		{"Deployment annotation still first", Config{}, deploy(ann("phase", PhaseInitialized)), PhaseInitialized},
		{"ReplicaSet all ready", Config{}, rs("ReplicaSet", specField("replicas", int64(3)), statusField("readyReplicas", int64(3))), PhaseInitialized},
		{"ReplicaSet not all ready", Config{}, rs("ReplicaSet", specField("replicas", int64(3)), statusField("readyReplicas", int64(2))), PhaseInitializing},
		{"ReplicaSet all ready, not observed", Config{}, rs("ReplicaSet", obsGen(1), specField("replicas", int64(3)), statusField("readyReplicas", int64(3))), PhaseInitializing},
		{"ReplicaSet scaled to 0 (readyReplicas omitted)", Config{}, rs("ReplicaSet", specField("replicas", int64(0))), PhaseInitialized},
		{"StatefulSet default 1 replica ready", Config{}, rs("StatefulSet", statusField("readyReplicas", int64(1))), PhaseInitialized},
		{"StatefulSet default 1 replica, none ready", Config{}, rs("StatefulSet"), PhaseInitializing},
		{"float numbers from a plain JSON decoder", Config{}, rs("ReplicaSet", gen(2), func(u *unstructured.Unstructured) {
			md(u)["generation"] = float64(2)
			sub(u, "status")["observedGeneration"] = float64(2)
			sub(u, "spec")["replicas"] = float64(2)
			sub(u, "status")["readyReplicas"] = float64(2)
		}), PhaseInitialized},

		{"configured rule for a custom kind", custom, widget(cond("Synced", "True")), PhaseInitialized},
		{"configured rule replaces the default order", custom, widget(cond("Ready", "True")), PhaseInitializing},
		{"configured rule overrides a built-in", custom, rs("StatefulSet", cond("Healthy", "True")), PhaseInitialized},
		{"configured rule overrides a built-in: replicas no longer count", custom, rs("StatefulSet", statusField("readyReplicas", int64(1))), PhaseInitializing},
		{"other kinds keep their rules", custom, deploy(obsGen(2), cond("Available", "True")), PhaseInitialized},

		// Several rules of one kind are alternatives; default is the generic
		// order; configured rules replace the kind's built-in one.
		{"default rule: Ready=True", seedDeploy, deploy(cond("Ready", "True")), PhaseInitialized},
		{"default rule: Initialized=True", seedDeploy, deploy(cond("Initialized", "True")), PhaseInitialized},
		{"default rule replaces the built-in: Available=True no longer counts", seedDeploy, deploy(obsGen(2), cond("Available", "True")), PhaseInitializing},
		{"any of: first rule", anyOf, deploy(cond("Ready", "True")), PhaseInitialized},
		{"any of: second rule", anyOf, deploy(obsGen(2), cond("Available", "True")), PhaseInitialized},
		{"any of: neither", anyOf, deploy(obsGen(1), cond("Available", "True")), PhaseInitializing},
		{"any of: annotation still first", anyOf, deploy(ann("phase", PhaseInitialized)), PhaseInitialized},
		{"any of: other kinds untouched", anyOf, rs("ReplicaSet", specField("replicas", int64(1)), statusField("readyReplicas", int64(1))), PhaseInitialized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.AnnotationPrefix = "policyd.io"
			if got := cfg.Phase(tc.obj); got != tc.want {
				t.Errorf("Phase = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestConfigFromDrift(t *testing.T) {
	d := config.Default().Drift
	cfg, err := ConfigFromDrift(d)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Config{AnnotationPrefix: "policyd.io", Mode: ModeLog}, cfg); diff != "" {
		t.Errorf("default config (-want +got):\n%s", diff)
	}
	d.Mode, d.AnnotationPrefix, d.Initialization = ModeEnforce, "drift.example.com", []string{"example.com/Widget=Ready"}
	cfg, err = ConfigFromDrift(d)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{AnnotationPrefix: "drift.example.com", Mode: ModeEnforce, Initialization: []InitOverride{{Group: "example.com", Kind: "Widget", Conditions: []string{"Ready"}}}}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	d.Initialization = []string{"apps/Deployment=default", "apps/Deployment=Ready+observedGeneration"}
	if cfg, err = ConfigFromDrift(d); err != nil || len(cfg.Initialization) != 2 || !cfg.Initialization[0].Default {
		t.Errorf("two rules for one kind: %+v, %v", cfg.Initialization, err)
	}
	d.Initialization = []string{"apps/Deployment=default+Ready"}
	if _, err := ConfigFromDrift(d); err == nil || !strings.Contains(err.Error(), "stands alone") {
		t.Errorf("default with another signal: err = %v", err)
	}
	d.Initialization = []string{"nope"}
	if _, err := ConfigFromDrift(d); err == nil || !strings.Contains(err.Error(), "drift.initialization[0]") {
		t.Errorf("bad initialization: err = %v", err)
	}
	d.Initialization, d.Mode = nil, "strict"
	if _, err := ConfigFromDrift(d); err == nil || !strings.Contains(err.Error(), "drift.mode") {
		t.Errorf("bad mode: err = %v", err)
	}
}

// TestPrefix: every annotation follows drift.annotation_prefix; the
// seed's kausality.io keys mean nothing.
func TestPrefix(t *testing.T) {
	cfg := Config{AnnotationPrefix: "drift.example.com", Mode: ModeEnforce}
	p := steadyParent(noAnn("controllers"), ann("drift.example.com/controllers", hCtrl), ann("drift.example.com/phase", PhaseInitialized),
		ann("kausality.io/approvals", `[{"kind":"Gadget","name":"g","mode":"always"}]`))
	old := childOf(p)
	nw := with(old, specField("replicas", int64(2)))
	d := Decide(Input{Request: request("UPDATE", ctrlUser, old, nw), Old: old, New: nw, Parent: p, Now: now, Config: cfg})
	if d.Allowed || d.Outcome != OutcomeDriftDenied {
		t.Fatalf("outcome %s allowed=%v, want drift denied", d.Outcome, d.Allowed)
	}
	p = with(p, ann("drift.example.com/approvals", `[{"kind":"Gadget","name":"g","mode":"always"}]`))
	d = Decide(Input{Request: request("UPDATE", ctrlUser, old, nw), Old: old, New: nw, Parent: p, Now: now, Config: cfg})
	if !d.Allowed || d.Outcome != OutcomeApproved {
		t.Fatalf("outcome %s allowed=%v, want approved", d.Outcome, d.Allowed)
	}
	if got := applied(t, nw, d).GetAnnotations()["drift.example.com/updaters"]; got != hCtrl {
		t.Errorf("updaters under the prefix = %q, want %q", got, hCtrl)
	}
}
