// Package layout checks the repository's file layout: every feature can be
// found by name, so `git ls-files | grep -i <feature>` lists every
// hand-written file of it.
package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// feature is one feature's name as it appears in identifiers and, with '-'
// and '_' removed, in file paths.
type feature struct {
	name string // as written in the docs
	word string // lowercased, as matched in identifiers and paths
}

var features = []feature{
	{"rollout", "rollout"},
	{"shadow", "shadow"},
	{"drift", "drift"},
	{"reload", "reload"},
	{"authz", "authz"},
	{"proxy-status", "proxystatus"},
	{"history", "history"},
}

// exception is one declaration allowed to live outside its feature's file,
// keyed by slash-separated path from the repository root and identifier.
type exception struct {
	path, ident string
}

// exceptions name declarations that belong in a shared file; each one says
// why. An exception for a type covers its methods too.
var exceptions = map[exception]string{
	{"internal/tlsfiles/tlsfiles.go", "Reloader"}:          "re-reads TLS files, not the ConfigMap reload controller; internal/server/raftnode names the type",
	{"internal/store/store.go", "StartHistory"}:            "starts the event log's indexes anew for a restore, not the history view; internal/server/raftnode calls it",
	{"api/feed/v1/feed.go", "TypeShadowReport"}:            "one row of the table of feed message types",
	{"api/feed/v1/feed.go", "CapabilityRollouts"}:          "one row of the table of client capabilities",
	{"api/feed/v1/feed.go", "CapabilityShadow"}:            "one row of the table of client capabilities",
	{"internal/server/policyset/rollouts.go", "CapShadow"}: "mirrors feedv1.CapabilityShadow beside CapRollouts in the capability table",
	{"internal/policy/policy.go", "EnforcementShadow"}:     "one row of the table of enforcement modes",
	{"internal/reload/hash.go", "drifted"}:                 "one value of the reload controller's startup-action enum (the ConfigMap changed while away), not the drift feature",
}

// decl is one top-level declaration's identifier and where it is.
type decl struct {
	path  string // slash-separated, from the repository root
	line  int
	ident string
	recv  string // a method's receiver type; empty otherwise
}

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// handWrittenGoFiles lists the repository's Go files that people write,
// slash-separated from the root: not third_party, not generated code.
func handWrittenGoFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		name := d.Name()
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
				name == "testdata" || name == "vendor" || rel == "internal/third_party") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".pb.go") ||
			strings.HasPrefix(name, "zz_generated") {
			return nil
		}
		files = append(files, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// pathWords is a path as feature words are matched against it.
func pathWords(path string) string {
	return strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(path))
}

// topLevelIdents lists a file's top-level declared identifiers: functions,
// methods (by name and by receiver type), and each type, var and const spec.
func topLevelIdents(fset *token.FileSet, f *ast.File, path string) []decl {
	var out []decl
	add := func(id *ast.Ident, recv string) {
		if id == nil || id.Name == "_" {
			return
		}
		out = append(out, decl{path: path, line: fset.Position(id.Pos()).Line, ident: id.Name, recv: recv})
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) != 1 {
				add(d.Name, "")
				continue
			}
			recv := receiverType(d.Recv.List[0].Type)
			if recv == nil {
				add(d.Name, "")
				continue
			}
			add(d.Name, recv.Name)
			add(recv, recv.Name)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					add(s.Name, "")
				case *ast.ValueSpec:
					for _, n := range s.Names {
						add(n, "")
					}
				}
			}
		}
	}
	return out
}

// receiverType is the type name of a method receiver, through pointers and
// type parameters.
func receiverType(e ast.Expr) *ast.Ident {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x
		default:
			return nil
		}
	}
}

// TestFeatureCodeInFeatureFiles checks that every top-level declaration whose
// name carries a feature's word lives in a file whose path carries it too, so
// grepping the file list for the feature finds its code.
func TestFeatureCodeInFeatureFiles(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	var decls []decl
	for _, path := range handWrittenGoFiles(t, root) {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(root, filepath.FromSlash(path)), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, topLevelIdents(fset, f, path)...)
	}
	used := make(map[exception]bool)
	for _, ft := range features {
		t.Run(ft.name, func(t *testing.T) {
			for _, d := range decls {
				if !strings.Contains(strings.ToLower(d.ident), ft.word) ||
					strings.Contains(pathWords(d.path), ft.word) {
					continue
				}
				key := exception{d.path, d.ident}
				if _, ok := exceptions[key]; ok {
					used[key] = true
					continue
				}
				if _, ok := exceptions[exception{d.path, d.recv}]; ok && d.recv != "" {
					used[exception{d.path, d.recv}] = true
					continue
				}
				t.Errorf("%s:%d: %s is %s code; move it to a file named after %s", d.path, d.line, d.ident, ft.name, ft.word)
			}
		})
	}
	for key := range exceptions {
		if !used[key] {
			t.Errorf("exception %s:%s matches no misplaced declaration; remove it", key.path, key.ident)
		}
	}
}

// TestEveryFeatureHasFiles checks that grepping the file list for each
// feature finds at least one hand-written Go file.
func TestEveryFeatureHasFiles(t *testing.T) {
	files := handWrittenGoFiles(t, repoRoot(t))
	for _, ft := range features {
		t.Run(ft.name, func(t *testing.T) {
			for _, path := range files {
				if strings.Contains(pathWords(path), ft.word) {
					return
				}
			}
			t.Errorf("no hand-written Go file's path contains %q", ft.word)
		})
	}
}
