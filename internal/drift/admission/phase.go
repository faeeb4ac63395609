package admission

import (
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// builtinInit makes the common workloads initialize: they have no Ready or
// Initialized condition, so the default order would keep them
// initializing forever (docs/drift.md). A kind with configured rules does
// not use its built-in one.
var builtinInit = []InitOverride{
	{Group: "apps", Kind: "Deployment", Conditions: []string{"Available"}, ObservedGeneration: true},
	{Group: "apps", Kind: "StatefulSet", ObservedGeneration: true, ReadyReplicas: true},
	{Group: "apps", Kind: "ReplicaSet", ObservedGeneration: true, ReadyReplicas: true},
}

// initRules are the rules for obj's group and kind: the configured ones if
// there are any, else the built-in one; none means the default
// order.
func (c Config) initRules(obj *unstructured.Unstructured) []InitOverride {
	group, kind := groupOf(obj.GetAPIVersion()), obj.GetKind()
	for _, list := range [][]InitOverride{c.Initialization, builtinInit} {
		var out []InitOverride
		for _, r := range list {
			if r.Group == group && r.Kind == kind {
				out = append(out, r)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// Phase is the lifecycle phase of a parent: deleting while it has a
// deletionTimestamp, initialized once the phase annotation says so (a high
// water mark) or its kind's rule holds, initializing otherwise.
func (c Config) Phase(obj *unstructured.Unstructured) string {
	if hasDeletionTimestamp(obj) {
		return PhaseDeleting
	}
	if obj.GetAnnotations()[c.key(annPhase)] == PhaseInitialized {
		return PhaseInitialized
	}
	if c.reachedInitialized(obj) {
		return PhaseInitialized
	}
	return PhaseInitializing
}

// reachedInitialized holds when any of the kind's rules holds, or, for a
// kind without rules, the default order does.
func (c Config) reachedInitialized(obj *unstructured.Unstructured) bool {
	rules := c.initRules(obj)
	if len(rules) == 0 {
		return seedInitialized(obj)
	}
	return slices.ContainsFunc(rules, func(r InitOverride) bool { return ruleHolds(r, obj) })
}

// ruleHolds evaluates one rule: the default order, or all of its signals.
func ruleHolds(r InitOverride, obj *unstructured.Unstructured) bool {
	if r.Default {
		return seedInitialized(obj)
	}
	for _, t := range r.Conditions {
		if conditionStatus(obj, t) != "True" {
			return false
		}
	}
	if r.ObservedGeneration && observedGeneration(obj) != generation(obj) {
		return false
	}
	if r.ReadyReplicas {
		want, ok := nestedInt(obj.Object, "spec", "replicas")
		if !ok {
			want = 1 // the API default for the workload kinds
		}
		got, _ := nestedInt(obj.Object, "status", "readyReplicas")
		if got != want {
			return false
		}
	}
	return true
}

// seedInitialized is the default detection order after the annotation:
// Initialized=True, Ready=True, observedGeneration == generation with
// Ready=True. Synced=True alone is not enough: Crossplane sets it before
// the children exist.
func seedInitialized(obj *unstructured.Unstructured) bool {
	switch {
	case conditionStatus(obj, "Initialized") == "True":
		return true
	case conditionStatus(obj, "Ready") == "True":
		return true
	default:
		return observedGeneration(obj) == generation(obj) && conditionStatus(obj, "Ready") == "True"
	}
}

func hasDeletionTimestamp(obj *unstructured.Unstructured) bool {
	md, _ := obj.Object["metadata"].(map[string]any)
	ts, _ := md["deletionTimestamp"].(string)
	return ts != ""
}

func observedGeneration(obj *unstructured.Unstructured) int64 {
	v, _ := nestedInt(obj.Object, "status", "observedGeneration")
	return v
}

// conditionStatus is the status of the first condition of type t in
// status.conditions, or "" when there is none. Malformed entries are skipped.
func conditionStatus(obj *unstructured.Unstructured, t string) string {
	status, _ := obj.Object["status"].(map[string]any)
	conds, _ := status["conditions"].([]any)
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if ct, _ := m["type"].(string); ct == t {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

// nestedInt reads an integer field whatever numeric type the decoder chose.
func nestedInt(obj map[string]any, path ...string) (int64, bool) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return 0, false
		}
		cur = m[p]
	}
	switch v := cur.(type) {
	case int64:
		return v, true
	case int:
		return int64(v), true
	case int32:
		return int64(v), true
	case float64:
		return int64(v), true
	}
	return 0, false
}
