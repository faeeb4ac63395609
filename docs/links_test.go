package docs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"

	"github.com/google/go-cmp/cmp"
)

// maxReadmeLines holds the README to the project rule: a front door of about
// 300 lines, with the reference material in docs/.
const maxReadmeLines = 320

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional <target> and title.
	inlineLink = regexp.MustCompile(`\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refDefinition matches a reference-style link definition: [id]: target.
	refDefinition = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	// codeSpan matches an inline code span, whose brackets are not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// heading matches an ATX heading and captures its text.
	heading = regexp.MustCompile(`^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$`)
	// scheme marks an absolute URL (https:, mailto:), which is not checked.
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// TestLinks checks every relative link, and every #anchor into a Markdown
// file, in README.md and docs/*.md against the repository's files.
func TestLinks(t *testing.T) {
	repo := os.DirFS("..")
	pages, err := fs.Glob(repo, "docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("glob docs/*.md: %v (found %d)", err, len(pages))
	}
	files := append([]string{"README.md"}, pages...)
	c := newChecker(repo)
	links := 0
	for _, f := range files {
		problems, n, err := c.check(f)
		if err != nil {
			t.Fatal(err)
		}
		links += n
		for _, p := range problems {
			t.Error(p)
		}
	}
	// A parser that found nothing would pass vacuously.
	if links < 20 {
		t.Errorf("found only %d relative links in %d files; is the link parser broken?", links, len(files))
	}
}

// TestReadmeLength enforces the README's size.
func TestReadmeLength(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, more than %d: it is the front door; move reference material to docs/", n, maxReadmeLines)
	}
}

// TestChecker shows that the checker catches each kind of broken link and
// leaves alone what is not a link.
func TestChecker(t *testing.T) {
	repo := fstest.MapFS{
		"docs/b.md": {Data: []byte("# Page B\n\n## Health: /healthz and /readyz\n\n## Setup\n\n## Setup\n\n" +
			"## `policyd watch`\n\n## 10,000 + 10,000 sidecars\n\n```yaml\n# not a heading\n```\n")},
		"config.yaml":  {Data: []byte("a: 1\n")},
		"deploy/x.go":  {Data: []byte("package x\n")},
		"docs/doc.txt": {Data: []byte("x\n")},
	}
	tests := []struct {
		name string
		page string
		want []string
	}{
		{name: "file", page: "[b](b.md) [up](../config.yaml) [dir](../deploy/) ![img](doc.txt)"},
		{name: "anchors", page: "[a](b.md#health-healthz-and-readyz) [b](b.md#setup-1) [c](b.md#policyd-watch) [d](b.md#10000--10000-sidecars) [e](#here)\n\n# Here"},
		{name: "link text with code", page: "[`docs/b.md`](b.md) and [`x`](nope.md)", want: []string{
			`docs/a.md:1: nope.md: no such file docs/nope.md`}},
		{name: "external and code", page: "[x](https://example.com/nope) [m](mailto:a@b) `[c](nope.md)`\n\n```\n[d](nope.md)\n```\n"},
		{name: "reference definition", page: "[b][ref]\n\n[ref]: missing.md\n", want: []string{
			`docs/a.md:3: missing.md: no such file docs/missing.md`}},
		{name: "missing file", page: "text\n[x](c.md)", want: []string{
			`docs/a.md:2: c.md: no such file docs/c.md`}},
		{name: "missing anchor", page: "[x](b.md#setup-2) [y](b.md#not-a-heading) [z](#nowhere)", want: []string{
			`docs/a.md:1: b.md#setup-2: no heading "setup-2" in docs/b.md`,
			`docs/a.md:1: b.md#not-a-heading: no heading "not-a-heading" in docs/b.md`,
			`docs/a.md:1: #nowhere: no heading "nowhere" in docs/a.md`,
		}},
		{name: "outside the repository", page: "[x](../../etc/passwd)", want: []string{
			`docs/a.md:1: ../../etc/passwd: leaves the repository`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys := fstest.MapFS{"docs/a.md": {Data: []byte(tt.page)}}
			for k, v := range repo {
				fsys[k] = v
			}
			got, _, err := newChecker(fsys).check("docs/a.md")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSlug(t *testing.T) {
	tests := map[string]string{
		"Set-up: two commands":                      "set-up-two-commands",
		"Health: /healthz and /readyz":              "health-healthz-and-readyz",
		"After a crash: state.db is rebuilt":        "after-a-crash-statedb-is-rebuilt",
		"Propagation to 10,000 + 10,000 sidecars":   "propagation-to-10000--10000-sidecars",
		"`policyd watch` and the [SDK](../client/)": "policyd-watch-and-the-sdk",
		"Design choices where the design left room": "design-choices-where-the-design-left-room",
		"**Bold** _under_score_ Ünïcode":            "bold-_under_score_-ünïcode",
	}
	for in, want := range tests {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

// checker resolves links against a repository's files, caching each
// Markdown file's anchors.
type checker struct {
	fsys    fs.FS
	anchors map[string]map[string]bool
}

func newChecker(fsys fs.FS) *checker {
	return &checker{fsys: fsys, anchors: map[string]map[string]bool{}}
}

// check returns one line per broken link in file, and the number of relative
// links it checked.
func (c *checker) check(file string) (problems []string, checked int, err error) {
	src, err := fs.ReadFile(c.fsys, file)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", file, err)
	}
	links, anchors := parse(string(src))
	c.anchors[file] = anchors
	for _, l := range links {
		if l.target == "" || scheme.MatchString(l.target) || strings.HasPrefix(l.target, "//") {
			continue
		}
		checked++
		if msg := c.resolve(file, l.target); msg != "" {
			problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", file, l.line, l.target, msg))
		}
	}
	return problems, checked, nil
}

// resolve says what is wrong with target, a link in file, or "" if nothing.
func (c *checker) resolve(file, target string) string {
	p, anchor, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(p)
	if err != nil {
		return err.Error()
	}
	dest := file
	if p != "" {
		if path.IsAbs(p) {
			return "an absolute path; use one relative to the file"
		}
		dest = path.Join(path.Dir(file), p)
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "leaves the repository"
		}
		if _, err := fs.Stat(c.fsys, dest); errors.Is(err, fs.ErrNotExist) {
			return "no such file " + dest
		} else if err != nil {
			return err.Error()
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	anchors, ok := c.anchors[dest]
	if !ok {
		src, err := fs.ReadFile(c.fsys, dest)
		if err != nil {
			return err.Error()
		}
		_, anchors = parse(string(src))
		c.anchors[dest] = anchors
	}
	if !anchors[anchor] {
		return fmt.Sprintf("no heading %q in %s", anchor, dest)
	}
	return ""
}

type link struct {
	line   int
	target string
}

// parse returns the links of a Markdown document outside code, and the
// anchors GitHub gives its headings.
func parse(src string) ([]link, map[string]bool) {
	var links []link
	anchors := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			s := slug(m[1])
			if n := seen[s]; n > 0 {
				anchors[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				anchors[s] = true
			}
			seen[s]++
		}
		text := codeSpan.ReplaceAllString(line, "code")
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			links = append(links, link{line: i + 1, target: m[1]})
		}
		if m := refDefinition.FindStringSubmatch(text); m != nil {
			links = append(links, link{line: i + 1, target: m[1]})
		}
	}
	return links, anchors
}

// slug is GitHub's anchor for a heading: its text (a link's text, a code
// span's content) in lower case, without punctuation, spaces made hyphens.
func slug(h string) string {
	h = inlineLink.ReplaceAllStringFunc(h, func(s string) string {
		return s[1:strings.Index(s, "](")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), unicode.IsMark(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
