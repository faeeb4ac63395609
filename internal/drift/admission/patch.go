package admission

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// annotationPatch is the JSONPatch turning obj's annotations into want, or
// nil when they are equal. It touches only the keys that change, so other
// mutating webhooks' annotations in the same request are left alone.
func annotationPatch(obj *unstructured.Unstructured, want map[string]string) []byte {
	have := obj.GetAnnotations()
	if sameAnnotations(have, want) {
		return nil
	}
	var ops []patchOp
	md, hasMD := obj.Object["metadata"].(map[string]any)
	_, hasAnn := md["annotations"].(map[string]any)
	switch {
	case !hasMD:
		ops = append(ops, patchOp{Op: "add", Path: "/metadata", Value: map[string]any{"annotations": want}})
	case !hasAnn:
		ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations", Value: want})
	default:
		keys := make([]string, 0, len(have)+len(want))
		for k := range have {
			keys = append(keys, k)
		}
		for k := range want {
			if _, ok := have[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys) // a deterministic patch for tests and logs
		for _, k := range keys {
			hv, inHave := have[k]
			wv, inWant := want[k]
			switch {
			case !inWant:
				ops = append(ops, patchOp{Op: "remove", Path: "/metadata/annotations/" + escapePointer(k)})
			case !inHave || hv != wv:
				ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations/" + escapePointer(k), Value: wv})
			}
		}
	}
	b, err := json.Marshal(ops)
	if err != nil { // only strings and maps of strings
		panic(fmt.Sprintf("marshal annotation patch: %v", err))
	}
	return b
}

// escapePointer escapes a JSON Pointer (RFC 6901) reference token.
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// specOf is what drift detection compares: the spec field when either
// object has one, otherwise every top-level field but apiVersion, kind,
// metadata and status (ConfigMap data, Secret data, RBAC rules), so that
// spec-less kinds are not silently exempt.
func specOf(old, new *unstructured.Unstructured) (oldSpec, newSpec map[string]any) {
	_, oldHas := fieldsOf(old)["spec"]
	_, newHas := fieldsOf(new)["spec"]
	pick := func(o *unstructured.Unstructured) map[string]any {
		f := fieldsOf(o)
		if oldHas || newHas {
			if s, ok := f["spec"]; ok {
				return map[string]any{"spec": s}
			}
			return map[string]any{}
		}
		out := make(map[string]any, len(f))
		for k, v := range f {
			switch k {
			case "apiVersion", "kind", "metadata", "status":
				continue
			}
			out[k] = v
		}
		return out
	}
	return pick(old), pick(new)
}

func fieldsOf(o *unstructured.Unstructured) map[string]any {
	if o == nil {
		return nil
	}
	return o.Object
}

// maxDiffPaths bounds a report's diff summary.
const maxDiffPaths = 50

// diffPaths lists the dotted paths that differ between two specs, sorted;
// lists are compared whole. At most maxDiffPaths are returned, the last
// being "..." when some were left out.
func diffPaths(a, b map[string]any) []string {
	var out []string
	var walk func(prefix string, a, b any)
	walk = func(prefix string, a, b any) {
		am, aok := a.(map[string]any)
		bm, bok := b.(map[string]any)
		if !aok || !bok {
			if !reflect.DeepEqual(a, b) {
				out = append(out, prefix)
			}
			return
		}
		for k, av := range am {
			walk(join(prefix, k), av, bm[k])
		}
		for k, bv := range bm {
			if _, ok := am[k]; !ok {
				walk(join(prefix, k), nil, bv)
			}
		}
	}
	walk("", a, b)
	slices.Sort(out)
	if len(out) > maxDiffPaths {
		out = append(out[:maxDiffPaths-1], "...")
	}
	return out
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}
