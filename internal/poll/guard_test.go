package poll

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"testing"
)

// copies are the names the suite's poll helpers had before this package.
var copies = map[string]bool{"waitFor": true, "waitUntil": true, "eventually": true, "Eventually": true, "poll": true, "Poll": true}

// TestNoOtherPollHelper fails when a function of the module outside this
// package takes one of the old poll helpers' names: waiting goes through
// Eventually or Until.
func TestNoOtherPollHelper(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "third_party", ".git", "testdata", "poll":
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Ext(path) != ".go" {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && copies[fn.Name.Name] {
				t.Errorf("%s: func %s is another poll helper: use poll.Eventually or poll.Until", fset.Position(fn.Pos()), fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read only %d Go files: the walk is not reading the module", files)
	}
}
