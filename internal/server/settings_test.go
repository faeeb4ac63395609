package server

import (
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
)

func writeTokens(t *testing.T, path string, lines ...string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReloadSettings applies run-time settings in process: admin tokens,
// the log level, a registered hook, and the report of keys that need a
// restart. (tests/e2e/sighup_test.go does the same through SIGHUP on a
// real process.)
func TestReloadSettings(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	const (
		oldTok = "old-admin-token-0123456789"
		newTok = "new-admin-token-0123456789"
	)
	writeTokens(t, tokens, "admin "+oldTok+" old")
	cfg := testConfig(t, "node1")
	cfg.Raft.Bootstrap = true
	cfg.Auth.AdminTokensFile = tokens
	level := &slog.LevelVar{}
	level.Set(slog.LevelWarn)
	var hooked []string
	n := startNode(t, cfg, func(n *Node) {
		n.SetLogLevel(level)
		n.AddSettingsHook(SettingsHook{Name: "test", Keys: []string{"drift.callbacks"}, Apply: func(c config.Config) ([]string, []string, error) {
			hooked = c.Drift.Callbacks
			return []string{"drift.callbacks"}, nil, nil
		}})
	})
	a := apiFor(t, n)
	status := func(tok string) int {
		t.Helper()
		return a.do(http.MethodGet, "/v1/policies", nil, map[string]string{"Authorization": "Bearer " + tok}).status
	}
	poll.Eventually(t, "the node to lead", func() error {
		if !n.IsLeader() {
			return errors.New("not leader")
		}
		return nil
	}, poll.Within(10*time.Second))

	if got := status(oldTok); got != http.StatusOK {
		t.Fatalf("old token before reload: %d", got)
	}

	t.Run("tokens, log level, hook and restart-only keys", func(t *testing.T) {
		writeTokens(t, tokens, "admin "+newTok+" new")
		next := cfg
		next.Log.Level = "debug"
		next.Drift.Callbacks = []string{"https://hooks.example/drift"}
		next.Raft.ElectionTimeout = 2 * time.Second
		next.Feed.SendBuffer = 128
		applied, needRestart, err := n.ApplySettings(next)
		if err != nil {
			t.Fatalf("Reload: %v", err)
		}
		if diff := cmp.Diff([]string{"auth.admin_tokens_file", "drift.callbacks", "log.level"}, applied); diff != "" {
			t.Errorf("applied (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"feed.send_buffer", "raft.election_timeout"}, needRestart); diff != "" {
			t.Errorf("needRestart (-want +got):\n%s", diff)
		}
		if got := status(newTok); got != http.StatusOK {
			t.Errorf("token added to the file: %d after reload", got)
		}
		if got := status(oldTok); got != http.StatusUnauthorized {
			t.Errorf("token removed from the file: %d after reload, want 401", got)
		}
		if level.Level() != slog.LevelDebug {
			t.Errorf("log level %v after reload, want debug", level.Level())
		}
		if !slices.Equal(hooked, next.Drift.Callbacks) {
			t.Errorf("hook saw callbacks %v", hooked)
		}
		// A pending restart is reported again on the next reload.
		_, needRestart, _ = n.ApplySettings(next)
		if !slices.Contains(needRestart, "raft.election_timeout") {
			t.Errorf("second reload forgot the pending restart: %v", needRestart)
		}
	})

	t.Run("a broken tokens file keeps the previous tokens", func(t *testing.T) {
		writeTokens(t, tokens, "superuser "+oldTok)
		_, _, err := n.ApplySettings(cfg)
		if err == nil || !strings.Contains(err.Error(), "auth.admin_tokens_file") {
			t.Fatalf("Reload with a broken tokens file = %v, want an error naming the key", err)
		}
		if got := status(newTok); got != http.StatusOK {
			t.Errorf("after a failed reload the previous token gets %d", got)
		}
		if level.Level() != slog.LevelWarn {
			t.Errorf("the other settings were not applied: log level %v, want warn", level.Level())
		}
	})

	t.Run("turning admin auth off needs a restart", func(t *testing.T) {
		next := cfg
		next.Auth.AdminTokensFile = ""
		_, needRestart, err := n.ApplySettings(next)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(needRestart, "auth.admin_tokens_file") {
			t.Errorf("needRestart %v, want auth.admin_tokens_file", needRestart)
		}
		if got := status("no-such-token-0123456789"); got != http.StatusUnauthorized {
			t.Errorf("an unknown token gets %d: admin auth was turned off by a reload", got)
		}
	})

	t.Run("an invalid configuration changes nothing", func(t *testing.T) {
		next := cfg
		next.Log.Level = "loud"
		if _, _, err := n.ApplySettings(next); err == nil {
			t.Fatal("Reload of an invalid configuration succeeded")
		}
	})
}
