package git

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

const gitHTTPBackend = "/usr/lib/git-core/git-http-backend"

// TestMain checks for leaked goroutines once every test's servers are
// closed and go-git's idle client connections are dropped.
func TestMain(m *testing.M) {
	code := m.Run()
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// server is git http-backend on loopback, behind a basic-auth check of
// token, serving every bare repository under root.
type server struct {
	root  string
	url   string
	token string
	env   []string // for the git command
}

func newServer(t testing.TB, token string) *server {
	t.Helper()
	if _, err := os.Stat(gitHTTPBackend); err != nil {
		t.Skipf("no git http-backend: %v", err)
	}
	home := t.TempDir()
	gitconfig := "[user]\n\tname = Policy Author\n\temail = author@example.com\n[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(gitconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &server{root: t.TempDir(), token: token}
	s.env = append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "XDG_CONFIG_HOME="+home)
	backend := &cgi.Handler{
		Path:   gitHTTPBackend,
		Stderr: io.Discard,
		Env:    []string{"GIT_PROJECT_ROOT=" + s.root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + home},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.token != "" {
			if _, pass, ok := r.BasicAuth(); !ok || pass != s.token {
				w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// repo is a bare repository on the server and a work tree that pushes to it.
type repo struct {
	t    testing.TB
	s    *server
	url  string
	bare string
	work string
}

func (s *server) repo(t testing.TB, name string) *repo {
	t.Helper()
	bare := filepath.Join(s.root, name+".git")
	r := &repo{t: t, s: s, url: s.url + "/" + name + ".git", bare: bare, work: t.TempDir()}
	r.run(s.root, "init", "-q", "--bare", bare)
	r.run(r.work, "init", "-q")
	r.run(r.work, "remote", "add", "origin", bare)
	return r
}

func (r *repo) run(dir string, args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = r.s.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func (r *repo) git(args ...string) string {
	r.t.Helper()
	return r.run(r.work, args...)
}

func (r *repo) write(name, content string) {
	r.t.Helper()
	p := filepath.Join(r.work, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *repo) remove(name string) {
	r.t.Helper()
	if err := os.Remove(filepath.Join(r.work, filepath.FromSlash(name))); err != nil {
		r.t.Fatal(err)
	}
}

func (r *repo) symlink(name, target string) {
	r.t.Helper()
	p := filepath.Join(r.work, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		r.t.Fatal(err)
	}
}

// commit commits everything and pushes it to main (forced, so that a
// rewritten history goes out too); it returns the commit's hash.
func (r *repo) commit(msg string) string {
	r.t.Helper()
	r.git("add", "-A")
	r.git("commit", "-q", "--allow-empty", "-m", msg)
	r.git("push", "-q", "-f", "origin", "HEAD:refs/heads/main")
	return r.git("rev-parse", "HEAD")
}

// importFiles commits files (name → content) straight into the bare
// repository's main with git fast-import, without a work tree: the fast
// way to a commit of thousands of files. It returns the commit's hash.
func (r *repo) importFiles(files map[string]string) string {
	r.t.Helper()
	var b strings.Builder
	b.WriteString("commit refs/heads/main\ncommitter Policy Author <author@example.com> 1700000000 +0000\ndata 6\nimport\n")
	for name, content := range files {
		fmt.Fprintf(&b, "M 100644 inline %s\ndata %d\n%s\n", name, len(content), content)
	}
	cmd := exec.Command("git", "--git-dir", r.bare, "fast-import", "--quiet")
	cmd.Env = r.s.env
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git fast-import: %v\n%s", err, out)
	}
	return r.run(r.bare, "rev-parse", "refs/heads/main")
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newDriver makes a driver of cfg with a token file holding the server's
// token, logging into the returned buffer.
func newDriver(t testing.TB, s *server, cfg Config) (*Driver, *logBuffer) {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "policies"
	}
	if cfg.Ref == "" {
		cfg.Ref = "main"
	}
	if s != nil && s.token != "" && cfg.TokenFile == "" {
		cfg.TokenFile = writeFile(t, "token", s.token+"\n")
	}
	logs := &logBuffer{}
	d, err := New(cfg, t.TempDir(), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return d, logs
}

func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
