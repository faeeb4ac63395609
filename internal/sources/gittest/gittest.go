// Package gittest serves Git repositories on loopback for tests: Debian's
// git http-backend behind a basic-auth token check, with work trees that
// push to it with the git command.
package gittest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const gitHTTPBackend = "/usr/lib/git-core/git-http-backend"

// Server is git http-backend on loopback, behind a basic-auth check of
// token, serving every bare repository under root.
type Server struct {
	// Root holds the bare repositories; URL is the server's base URL.
	Root string
	URL  string
	// Token is the basic-auth password every request needs ("" for none).
	Token string
	// Env is the git command's environment: its own HOME and config.
	Env []string
}

// NewServer starts a server that needs token ("" for none); it stops when
// the test ends. The test is skipped without git http-backend.
func NewServer(t testing.TB, token string) *Server {
	t.Helper()
	if _, err := os.Stat(gitHTTPBackend); err != nil {
		t.Skipf("no git http-backend: %v", err)
	}
	home := t.TempDir()
	gitconfig := "[user]\n\tname = Policy Author\n\temail = author@example.com\n[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(gitconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{Root: t.TempDir(), Token: token}
	s.Env = append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "XDG_CONFIG_HOME="+home)
	backend := &cgi.Handler{
		Path:   gitHTTPBackend,
		Stderr: io.Discard,
		Env:    []string{"GIT_PROJECT_ROOT=" + s.Root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + home},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.Token != "" {
			if _, pass, ok := r.BasicAuth(); !ok || pass != s.Token {
				w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Repo is a bare repository on the server and a work tree that pushes to it.
type Repo struct {
	t testing.TB
	s *Server
	// URL is the repository's URL; Bare its bare repository, Work its work tree.
	URL  string
	Bare string
	Work string
}

// Repo creates the bare repository name and a work tree for it.
func (s *Server) Repo(t testing.TB, name string) *Repo {
	t.Helper()
	bare := filepath.Join(s.Root, name+".git")
	r := &Repo{t: t, s: s, URL: s.URL + "/" + name + ".git", Bare: bare, Work: t.TempDir()}
	r.Run(s.Root, "init", "-q", "--bare", bare)
	r.Run(r.Work, "init", "-q")
	r.Run(r.Work, "remote", "add", "origin", bare)
	return r
}

// Run runs git in dir and returns its trimmed output; failing it fails the test.
func (r *Repo) Run(dir string, args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = r.s.Env
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// Git runs git in the work tree.
func (r *Repo) Git(args ...string) string {
	r.t.Helper()
	return r.Run(r.Work, args...)
}

// Write writes a file of the work tree.
func (r *Repo) Write(name, content string) {
	r.t.Helper()
	p := filepath.Join(r.Work, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// Remove removes a file of the work tree.
func (r *Repo) Remove(name string) {
	r.t.Helper()
	if err := os.Remove(filepath.Join(r.Work, filepath.FromSlash(name))); err != nil {
		r.t.Fatal(err)
	}
}

// Symlink makes name a symbolic link to target in the work tree.
func (r *Repo) Symlink(name, target string) {
	r.t.Helper()
	p := filepath.Join(r.Work, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		r.t.Fatal(err)
	}
}

// Commit commits everything and pushes it to main (forced, so that a
// rewritten history goes out too); it returns the commit's hash.
func (r *Repo) Commit(msg string) string {
	r.t.Helper()
	r.Git("add", "-A")
	r.Git("commit", "-q", "--allow-empty", "-m", msg)
	r.Git("push", "-q", "-f", "origin", "HEAD:refs/heads/main")
	return r.Git("rev-parse", "HEAD")
}

// ImportFiles commits files (name → content) straight into the bare
// repository's main with git fast-import, without a work tree: the fast
// way to a commit of thousands of files. It returns the commit's hash; the
// work tree catches up with Git("pull", ...).
func (r *Repo) ImportFiles(files map[string]string) string {
	r.t.Helper()
	var b strings.Builder
	b.WriteString("commit refs/heads/main\ncommitter Policy Author <author@example.com> 1700000000 +0000\ndata 6\nimport\n")
	if head, err := exec.Command("git", "--git-dir", r.Bare, "rev-parse", "-q", "--verify", "refs/heads/main").Output(); err == nil {
		fmt.Fprintf(&b, "from %s\n", strings.TrimSpace(string(head))) // on top of main, keeping its files
	}
	for name, content := range files {
		fmt.Fprintf(&b, "M 100644 inline %s\ndata %d\n%s\n", name, len(content), content)
	}
	cmd := exec.Command("git", "--git-dir", r.Bare, "fast-import", "--quiet")
	cmd.Env = r.s.Env
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git fast-import: %v\n%s", err, out)
	}
	return r.Run(r.Bare, "rev-parse", "refs/heads/main")
}
