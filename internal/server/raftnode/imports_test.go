package raftnode

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

// forbiddenImports are what only raftnode (and the store and FSM below it)
// may import: raft, its log stores, bbolt and the FSM itself. Listeners
// build commands with internal/command.
var forbiddenImports = []string{"github.com/policyd/policyd/internal/third_party/raft", "go.etcd.io/bbolt", "github.com/policyd/policyd/internal/raftfsm"}

// allowedDirs are the server sub-packages that may import them.
var allowedDirs = map[string]string{
	"raftnode":   "the one owner of Raft",
	"raftlog":    "the Raft log and stable store raftnode builds raft over: raft's log types, raft-boltdb, raft-wal and bbolt",
	"servertest": "test helpers",
}

// TestOnlyRaftnodeImportsRaft fails if the command (cmd/policyd and
// internal/cli), the server root or any other server sub-package (the listeners among them) imports
// hashicorp/raft, raft-boltdb, raft-wal, bbolt or raftfsm in its non-test files:
// raftnode is the one owner of Raft, over raftlog's data directory.
func TestOnlyRaftnodeImportsRaft(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	dirs := []string{filepath.Join(root, "cmd", "policyd"), filepath.Join(root, "internal", "cli"), filepath.Join(root, "internal", "server")}
	entries, err := os.ReadDir(filepath.Join(root, "internal", "server"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := allowedDirs[e.Name()]; e.IsDir() && !ok {
			dirs = append(dirs, filepath.Join(root, "internal", "server", e.Name()))
		}
	}
	checked := 0
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			checked++
			for _, imp := range importsOf(t, f) {
				for _, bad := range forbiddenImports {
					if strings.HasPrefix(imp, bad) {
						t.Errorf("%s imports %s: only server/raftnode and server/raftlog may", f, imp)
					}
				}
			}
		}
	}
	// A wrong root would check nothing.
	if _, err := os.Stat(filepath.Join(root, "cmd", "policyd", "main.go")); err != nil || checked < 10 {
		t.Fatalf("checked %d files; cmd/policyd/main.go under %s: %v", checked, root, err)
	}
}

func importsOf(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range f.Imports {
		p, err := strconv.Unquote(s.Path.Value)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestImportsOfSeesRaft makes sure the check above can fail: it finds the
// imports in this package's own setup.
func TestImportsOfSeesRaft(t *testing.T) {
	if imps := importsOf(t, "raft.go"); !slices.Contains(imps, "github.com/policyd/policyd/internal/third_party/raft") {
		t.Fatalf("imports of raft.go = %v, want github.com/hashicorp/raft among them", imps)
	}
}
