package server

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// modulePath is the module the import walk stays inside.
const modulePath = "github.com/policyd/policyd"

// listeners are the server sub-packages that each serve, or guard, a
// listener of the node. None may import another: what they
// share sits in a package of its own (apierror, rollout, policyset,
// grpccodec), and the server root wires them together.
var listeners = []string{
	"internal/server/adminapi",  // the admin REST API
	"internal/server/discovery", // the gRPC discovery service
	"internal/server/feed",      // the WebSocket feed
	"internal/server/peer",      // the peer plane's door: Raft and the node-to-node API
	"internal/server/limits",    // the connection caps and set-up gate every listener sits behind
	"internal/server/drift",     // what the drift webhook's listener runs: informers, sink, follow-up
}

// TestListenersImportNoListener fails when a listener package reaches
// another, directly or through other packages of the module. Test files are
// left out: a test may wire two listeners together to test how they meet.
func TestListenersImportNoListener(t *testing.T) {
	for _, from := range listeners {
		t.Run(from, func(t *testing.T) {
			via := moduleDeps(t, from)
			for _, to := range listeners {
				if to == from {
					continue
				}
				if _, ok := via[to]; ok {
					t.Errorf("%s imports %s: %s; move what they share to a package of its own",
						from, to, strings.Join(importChain(via, to), " -> "))
				}
			}
		})
	}
}

// TestModuleDepsFindsListeners checks the walk itself on the server root,
// which imports every listener, so that a walk that finds nothing cannot
// pass the test above.
func TestModuleDepsFindsListeners(t *testing.T) {
	via := moduleDeps(t, "internal/server")
	for _, l := range listeners {
		if _, ok := via[l]; !ok {
			t.Errorf("the walk from server does not reach %s", l)
		}
	}
}

// moduleDeps walks the module's packages that pkg (a path relative to the
// module root) imports, directly or not, reading every non-test Go file
// whatever its build constraint. It maps each package reached to the one it
// was first imported from.
func moduleDeps(t *testing.T, pkg string) map[string]string {
	t.Helper()
	via := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range packageImports(t, p) {
			rel, ok := strings.CutPrefix(imp, modulePath+"/")
			if !ok {
				continue
			}
			if _, seen := via[rel]; !seen {
				via[rel] = p
				queue = append(queue, rel)
			}
		}
	}
	return via
}

// packageImports lists the imports of the non-test Go files of pkg, a path
// relative to the module root (this test runs in internal/server/).
func packageImports(t *testing.T, pkg string) []string {
	t.Helper()
	dir := filepath.Join("..", "..", filepath.FromSlash(pkg))
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read package %s: %v", pkg, err)
	}
	var imports []string
	files := 0
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("parse %s: %v", filepath.Join(pkg, name), err)
		}
		files++
		for _, is := range f.Imports {
			path, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				t.Fatalf("%s: import %s: %v", filepath.Join(pkg, name), is.Path.Value, err)
			}
			imports = append(imports, path)
		}
	}
	if files == 0 {
		t.Fatalf("package %s has no Go files: is the list of listeners out of date?", pkg)
	}
	return imports
}

// importChain is the path of imports from the walk's start to pkg.
func importChain(via map[string]string, pkg string) []string {
	var chain []string
	for p := pkg; p != ""; p = via[p] {
		chain = append(chain, p)
	}
	slices.Reverse(chain)
	return chain
}
