package e2e

import (
	"archive/zip"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGoInstall installs the binary as a user would, with `go install
// github.com/policyd/policyd/cmd/policyd@version`, from a module proxy on
// disk that holds this tree as that version. go install refuses a module
// whose go.mod has replace directives, which is why internal/third_party/raft is a
// package of the module rather than a replaced one.
func TestGoInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary through go install: not in -short (make check)")
	}
	const module = "github.com/policyd/policyd"
	version := "v0.0.0-" + time.Now().UTC().Format("20060102150405") + "-000000000000"
	proxy := t.TempDir()
	dir := filepath.Join(proxy, module, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": fmt.Appendf(nil, `{"Version":%q,"Time":%q}`, version, time.Now().UTC().Format(time.RFC3339)),
		version + ".mod":  gomod,
		version + ".zip":  moduleZip(t, module+"@"+version),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The go command caches the version it downloads; take it out again,
	// so that the fake version does not outlive the test.
	modcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cache := strings.TrimSpace(string(modcache))
		extracted := filepath.Join(cache, module+"@"+version)
		_ = filepath.Walk(extracted, func(p string, _ os.FileInfo, _ error) error { return os.Chmod(p, 0o755) })
		_ = os.RemoveAll(extracted)
		for _, ext := range []string{".info", ".mod", ".zip", ".ziphash", ".lock", ".partial"} {
			_ = os.Remove(filepath.Join(cache, "cache", "download", module, "@v", version+ext))
		}
	})

	gobin := t.TempDir()
	realProxy, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	install := exec.Command("go", "install", module+"/cmd/policyd@"+version)
	install.Dir = t.TempDir() // outside the module: as a user runs it
	install.Env = append(os.Environ(), "GOBIN="+gobin, "GONOSUMDB="+module, "GOFLAGS=-buildvcs=false",
		"GOPROXY=file://"+filepath.ToSlash(proxy)+","+strings.TrimSpace(string(realProxy)))
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(gobin, "policyd"), "version", "--client").CombinedOutput()
	if err != nil {
		t.Fatalf("policyd version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), version) {
		t.Errorf("policyd version = %q, want the installed version %s", out, version)
	}
}

// moduleZip is the tree's files (tracked, or new and not ignored) as a module zip whose paths start
// with prefix (module@version), as a module proxy serves it.
func moduleZip(t *testing.T, prefix string) []byte {
	t.Helper()
	ls := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = repoRoot
	names, err := ls.Output()
	if err != nil {
		t.Skipf("go install needs the tree's file list from git: %v", err)
	}
	all := strings.Split(strings.TrimRight(string(names), "\x00"), "\x00")
	// A directory with a go.mod of its own (tools/) is another module,
	// which a module zip leaves out.
	var nested []string
	for _, name := range all {
		if d := path.Dir(name); path.Base(name) == "go.mod" && d != "." {
			nested = append(nested, d+"/")
		}
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, name := range all {
		if slices.ContainsFunc(nested, func(d string) bool { return strings.HasPrefix(name, d) }) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(repoRoot, name))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create(prefix + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
