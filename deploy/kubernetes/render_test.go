package kubernetes_test

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// The tests render the kustomizations themselves: the base and each
// component only list resource files, so rendering is reading those files
// in order. A kustomization that asks for more (patches, generators,
// transformers) fails readKustomization, and TestKustomizeBuild checks the
// renderings against kustomize's own where kubectl is installed.

// manifest is one YAML document and the file it came from.
type manifest struct {
	file string
	obj  *unstructured.Unstructured
}

func (m manifest) String() string {
	return fmt.Sprintf("%s: %s %s", m.file, m.obj.GetKind(), objectName(m.obj))
}

func objectName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// kustomizationKeys are the keys the renderer understands.
var kustomizationKeys = []string{"apiVersion", "kind", "resources", "components"}

// readKustomization returns the resources listed by dir/kustomization.yaml,
// which must be files in dir, and checks that they are every YAML file of
// dir, so that none is forgotten.
func readKustomization(t *testing.T, dir string) []string {
	t.Helper()
	path := filepath.Join(dir, "kustomization.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var k map[string]any
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(&k); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for key := range k {
		if !slices.Contains(kustomizationKeys, key) {
			t.Fatalf("%s: key %q: the tests render only %v", path, key, kustomizationKeys)
		}
	}
	if _, ok := k["components"]; ok {
		t.Fatalf("%s: components are enabled in an overlay, not here (the tests apply the base and each component)", path)
	}
	var files []string
	list, _ := k["resources"].([]any)
	for _, r := range list {
		f, ok := r.(string)
		if !ok || f == "" || filepath.Base(f) != f || filepath.Ext(f) != ".yaml" {
			t.Fatalf("%s: resource %v is not a YAML file of this directory", path, r)
		}
		files = append(files, f)
	}
	onDisk, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range onDisk {
		onDisk[i] = filepath.Base(f)
	}
	onDisk = slices.DeleteFunc(onDisk, func(f string) bool { return f == "kustomization.yaml" })
	if listed := slices.Sorted(slices.Values(files)); !slices.Equal(listed, onDisk) {
		t.Fatalf("%s lists %v; the directory holds %v", path, listed, onDisk)
	}
	return files
}

// readManifests decodes every document of every resource of the
// kustomization in dir, in its order.
func readManifests(t *testing.T, dir string) []manifest {
	t.Helper()
	var out []manifest
	for _, f := range readKustomization(t, dir) {
		out = append(out, readFile(t, filepath.Join(dir, f))...)
	}
	return out
}

// readFile decodes every document of one YAML file.
func readFile(t *testing.T, file string) []manifest {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []manifest
	for _, obj := range decodeDocs(t, file, bytes.NewReader(raw)) {
		out = append(out, manifest{file: file, obj: &unstructured.Unstructured{Object: obj}})
	}
	return out
}

// decodeDocs decodes a stream of YAML documents, skipping empty ones.
func decodeDocs(t *testing.T, what string, r io.Reader) []map[string]any {
	t.Helper()
	var out []map[string]any
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if obj != nil {
			out = append(out, obj)
		}
	}
}

// componentDirs lists the kustomize components, components/<name>.
func componentDirs(t *testing.T) []string {
	t.Helper()
	ks, err := filepath.Glob(filepath.Join("components", "*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, k := range ks {
		dirs = append(dirs, filepath.Dir(k))
	}
	for _, want := range []string{"components/cert-manager", "components/drift", "components/kubernetes-source", "components/policy-webhook"} {
		if !slices.Contains(dirs, want) {
			t.Fatalf("no component %s among %v", want, dirs)
		}
	}
	return dirs
}

// render is the base with the given components.
func render(t *testing.T, components ...string) []manifest {
	t.Helper()
	out := readManifests(t, ".")
	for _, c := range components {
		out = append(out, readManifests(t, c)...)
	}
	return out
}

// TestKustomizeBuild checks the tests' renderings against `kubectl
// kustomize`: the base alone, and the base with every component, as an
// overlay of an operator's would list them.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed, so kustomize's rendering cannot be compared")
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	comps := componentDirs(t)
	for _, tc := range []struct {
		name       string
		components []string
	}{{"base", nil}, {"all components", comps}} {
		t.Run(tc.name, func(t *testing.T) {
			overlay := t.TempDir()
			// kustomize wants relative paths to other kustomizations.
			rel, err := filepath.Rel(overlay, here)
			if err != nil {
				t.Fatal(err)
			}
			var k strings.Builder
			fmt.Fprintf(&k, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n", rel)
			if len(tc.components) > 0 {
				k.WriteString("components:\n")
				for _, c := range tc.components {
					fmt.Fprintf(&k, "  - %s\n", filepath.Join(rel, c))
				}
			}
			if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k.String()), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			cmd := exec.CommandContext(t.Context(), kubectl, "kustomize", overlay)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("kubectl kustomize: %v\n%s", err, stderr.String())
			}
			built := decodeDocs(t, "kubectl kustomize output", &stdout)
			var ours []map[string]any
			for _, m := range render(t, tc.components...) {
				ours = append(ours, m.obj.Object)
			}
			byID := func(a, b map[string]any) int {
				ua, ub := unstructured.Unstructured{Object: a}, unstructured.Unstructured{Object: b}
				return cmp.Or(cmp.Compare(ua.GetKind(), ub.GetKind()), cmp.Compare(objectName(&ua), objectName(&ub)))
			}
			slices.SortFunc(built, byID)
			slices.SortFunc(ours, byID)
			if diff := gocmp.Diff(built, ours); diff != "" {
				t.Errorf("the tests' rendering differs from kubectl kustomize's (-kustomize +tests):\n%s", diff)
			}
		})
	}
}
