package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeHasNoForwarders fails for a Node method whose whole body calls one
// method of a field with the method's own arguments: such a method belongs
// to the field's package, reached through the embedded field instead.
func TestNodeHasNoForwarders(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Body == nil || recvName(fn) != "Node" {
				continue
			}
			if forwards(fn) {
				t.Errorf("%s: Node.%s only forwards to a field's method; use the field's method", fset.Position(fn.Pos()), fn.Name.Name)
			}
		}
	}
}

func recvName(fn *ast.FuncDecl) string {
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// forwards reports whether fn's body is one call, `n.field.M(params…)`, bare
// or returned, passing exactly fn's parameters in order.
func forwards(fn *ast.FuncDecl) bool {
	if len(fn.Body.List) != 1 {
		return false
	}
	var call *ast.CallExpr
	switch s := fn.Body.List[0].(type) {
	case *ast.ReturnStmt:
		if len(s.Results) == 1 {
			call, _ = s.Results[0].(*ast.CallExpr)
		}
	case *ast.ExprStmt:
		call, _ = s.X.(*ast.CallExpr)
	}
	if call == nil {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	field, ok := sel.X.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	if _, ok := field.X.(*ast.Ident); !ok {
		return false
	}
	var params []string
	for _, p := range fn.Type.Params.List {
		for _, n := range p.Names {
			params = append(params, n.Name)
		}
	}
	if len(params) != len(call.Args) {
		return false
	}
	for i, a := range call.Args {
		id, ok := a.(*ast.Ident)
		if !ok || id.Name != params[i] {
			return false
		}
	}
	return true
}
