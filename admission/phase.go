package admission

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Signals of an InitOverride's text form that are not condition types.
const (
	signalObservedGeneration = "observedGeneration"
	signalReadyReplicas      = "readyReplicas"
)

// builtinInit makes the common workloads initialize: they have no Ready or
// Initialized condition, so the seed's default order would keep them
// initializing forever (DESIGN part 7).
var builtinInit = []InitOverride{
	{Group: "apps", Kind: "Deployment", Conditions: []string{"Available"}, ObservedGeneration: true},
	{Group: "apps", Kind: "StatefulSet", ObservedGeneration: true, ReadyReplicas: true},
	{Group: "apps", Kind: "ReplicaSet", ObservedGeneration: true, ReadyReplicas: true},
}

// ParseInitOverride parses one drift.initialization entry,
// "group/Kind=Signal+Signal" (see InitOverride).
func ParseInitOverride(s string) (InitOverride, error) {
	target, signals, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return InitOverride{}, fmt.Errorf("initialization rule %q: want group/Kind=Signal+Signal", s)
	}
	group, kind, ok := strings.Cut(target, "/")
	if !ok || kind == "" || strings.Contains(kind, "/") {
		return InitOverride{}, fmt.Errorf("initialization rule %q: %q is not group/Kind (core group: /Kind)", s, target)
	}
	o := InitOverride{Group: group, Kind: kind}
	for sig := range strings.SplitSeq(signals, "+") {
		switch {
		case sig == signalObservedGeneration:
			o.ObservedGeneration = true
		case sig == signalReadyReplicas:
			o.ReadyReplicas = true
		case validConditionType(sig):
			o.Conditions = append(o.Conditions, sig)
		default:
			return InitOverride{}, fmt.Errorf("initialization rule %q: %q is not a condition type, %s or %s", s, sig, signalObservedGeneration, signalReadyReplicas)
		}
	}
	return o, nil
}

func validConditionType(s string) bool {
	if s == "" || len(s) > 316 {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune(".-_/", c):
		default:
			return false
		}
	}
	return true
}

// initRule is the override for obj's group and kind: configuration first,
// then the built-ins; nil means the seed's default order.
func (c Config) initRule(obj *unstructured.Unstructured) *InitOverride {
	group, kind := groupOf(obj.GetAPIVersion()), obj.GetKind()
	for _, list := range [][]InitOverride{c.Initialization, builtinInit} {
		for i := range list {
			if list[i].Group == group && list[i].Kind == kind {
				return &list[i]
			}
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

// reachedInitialized evaluates the kind's rule, or the seed's default order:
// Initialized=True, Ready=True, observedGeneration == generation with
// Ready=True. Synced=True alone is not enough: Crossplane sets it before the
// children exist.
func (c Config) reachedInitialized(obj *unstructured.Unstructured) bool {
	if r := c.initRule(obj); r != nil {
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
