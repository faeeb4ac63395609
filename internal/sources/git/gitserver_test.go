package git

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/policyd/policyd/internal/sources/gittest"
	"go.uber.org/goleak"
)

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

// server and repo are gittest's, under the names these tests use.
type (
	server = gittest.Server
	repo   = gittest.Repo
)

func newServer(t testing.TB, token string) *server { return gittest.NewServer(t, token) }

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
	if s != nil && s.Token != "" && cfg.TokenFile == "" {
		cfg.TokenFile = writeFile(t, "token", s.Token+"\n")
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
