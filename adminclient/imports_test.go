package adminclient

import (
	"go/build"
	"strings"
	"testing"
)

// TestImportsOnlyAPI holds the package to the module's layering: of this module it
// imports only api/, so bench/, chaos/ and outside programs can use it
// without the server.
func TestImportsOnlyAPI(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/policyd/policyd/"
	if len(pkg.Imports) < 5 {
		t.Fatalf("read only %d imports: %v", len(pkg.Imports), pkg.Imports)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, module) && !strings.HasPrefix(imp, module+"api/") {
			t.Errorf("adminclient imports %s; only %sapi/... is allowed", imp, module)
		}
	}
}
