package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// maxPackageDocLines keeps a package doc to what the package owns, what it
// does not, and a link to the docs/ page that holds its contract; contracts
// in Go comments drift from the pages readers look at.
const maxPackageDocLines = 12

// maxPerformanceLines keeps docs/performance.md a page of targets and
// figures; raw runs belong in bench/FINDINGS.md.
const maxPerformanceLines = 150

var (
	// citation matches a reference to a numbered part of the design, a seed
	// or an issue number: the reader of a Go file has none of them, so a
	// comment says the rule itself or links a docs/ page. The design document's name is
	// matched in capitals only, so the word "design" stays usable.
	citation = regexp.MustCompile(`\bDESIGN\b|(?i:\bdesign,? part \d|\bseeds?[ -]?0\d\d\b|\bseeds/|\b(?:issue|pr|pull request)s? ?#?\d+\b)|(?:^|[^\w/#&.-])#\d+\b`)
	// standardNumber is a numbered standard ("PKCS #1"), which is a name,
	// not an issue; it is removed before citation is matched.
	standardNumber = regexp.MustCompile(`\b(?:PKCS|RFC|FIPS) #\d+`)
	// docsPage matches a docs/ page named in a package doc.
	docsPage = regexp.MustCompile(`\bdocs/[\w.-]+\.md\b`)
)

// goFiles lists the hand-written Go files under root: third_party/, testdata
// and hidden directories are not ours, and generated files follow their
// source.
func goFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "third_party" || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, ".pb.go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A walk that found nothing would pass vacuously.
	if len(files) < 100 {
		t.Fatalf("found only %d Go files under %s; is the walk broken?", len(files), root)
	}
	return files
}

// rel names a file relative to the repository root, as a reader would.
func rel(p string) string {
	if r, err := filepath.Rel("..", p); err == nil {
		return filepath.ToSlash(r)
	}
	return p
}

// TestPackageDocs fails for a package doc comment longer than
// maxPackageDocLines, and for one that names a docs/ page that does not
// exist.
func TestPackageDocs(t *testing.T) {
	fset := token.NewFileSet()
	docs := 0
	for _, p := range goFiles(t, "..") {
		f, err := parser.ParseFile(fset, p, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Errorf("%s: %v", rel(p), err)
			continue
		}
		if f.Doc == nil || ast.IsGenerated(f) {
			continue
		}
		docs++
		if n := fset.Position(f.Doc.End()).Line - fset.Position(f.Doc.Pos()).Line + 1; n > maxPackageDocLines {
			t.Errorf("%s: package doc has %d lines, more than %d: keep what the package owns and does not, and move the contract to a docs/ page", rel(p), n, maxPackageDocLines)
		}
		for _, page := range docsPage.FindAllString(f.Doc.Text(), -1) {
			if _, err := os.Stat(filepath.Join("..", page)); err != nil {
				t.Errorf("%s: package doc links %s, which does not exist", rel(p), page)
			}
		}
	}
	if docs < 20 {
		t.Errorf("found only %d package docs; is the parser broken?", docs)
	}
}

// TestNoCitations fails for every line of a Go file that cites a design
// part, a seed or an issue number.
func TestNoCitations(t *testing.T) {
	for _, p := range goFiles(t, "..") {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		s := bufio.NewScanner(f)
		s.Buffer(nil, 1<<20)
		for n := 1; s.Scan(); n++ {
			if m := citation.FindString(standardNumber.ReplaceAllString(s.Text(), "")); m != "" {
				t.Errorf("%s:%d: cites %q: say the rule itself or link its docs/ page", rel(p), n, strings.TrimSpace(m))
			}
		}
		if err := s.Err(); err != nil {
			t.Errorf("%s: %v", rel(p), err)
		}
		f.Close()
	}
}

// TestCitationPattern shows what citation flags and what it leaves alone,
// on the lines of testdata/citations.txt.
func TestCitationPattern(t *testing.T) {
	b, err := os.ReadFile("testdata/citations.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, got := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		mark, line, ok := strings.Cut(l, " ")
		if !ok || (mark != "+" && mark != "-") {
			continue
		}
		want[line] = mark == "+"
		got[line] = citation.MatchString(standardNumber.ReplaceAllString(line, ""))
	}
	if len(want) < 10 {
		t.Fatalf("read only %d cases from testdata/citations.txt", len(want))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("citation matches (-want +got):\n%s", diff)
	}
}

// TestPerformanceLength keeps docs/performance.md to its size.
func TestPerformanceLength(t *testing.T) {
	b, err := os.ReadFile("performance.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > maxPerformanceLines {
		t.Errorf("docs/performance.md has %d lines, more than %d: keep targets and figures; raw runs go to bench/FINDINGS.md", n, maxPerformanceLines)
	}
}
