package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCommandFiles holds the package to its layout, so that a reader finds
// a command by its name: every top-level command of the tree is built in
// the file of its name, by the function of its name, and no file registers
// anything from an init function (the tree is rootCommand's list alone).
//
// The file of a command is its name without dashes, plus ".go", and its
// function is that name plus "Command", compared without case: `policyd
// snapshot` is snapshotCommand in snapshot.go, and a `proxy-status` would
// be proxyStatusCommand in proxystatus.go (as the internal/server/proxystatus
// package spells it).
func TestCommandFiles(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string][]string{} // file: its top-level functions, lower case
	fset := token.NewFileSet()
	for _, f := range files {
		parsed, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range parsed.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil {
				continue
			}
			if fd.Name.Name == "init" {
				t.Errorf("%s: an init function; add the command to its parent instead", fset.Position(fd.Pos()))
			}
			funcs[f] = append(funcs[f], strings.ToLower(fd.Name.Name))
		}
	}

	cmds := rootCommand().Commands()
	// A tree that failed to build would pass vacuously.
	if len(cmds) < 10 {
		t.Fatalf("the root has %d commands", len(cmds))
	}
	for _, cmd := range cmds {
		base := strings.ReplaceAll(cmd.Name(), "-", "")
		file, fn := base+".go", base+"command"
		switch have, ok := funcs[file]; {
		case !ok:
			t.Errorf("policyd %s: no file %s", cmd.Name(), file)
		case !slices.Contains(have, fn):
			t.Errorf("policyd %s: %s does not build it (no function %sCommand, in any case)", cmd.Name(), file, base)
		}
	}
}
