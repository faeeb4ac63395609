package git

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/policyd/policyd/internal/poll"
)

func sign(secret, body string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// TestVerifyHook: GitHub's HMAC and GitLab's token, good and bad.
func TestVerifyHook(t *testing.T) {
	const secret, body = "hook-secret", `{"ref":"refs/heads/main"}`
	tests := []struct {
		name    string
		secret  string
		headers map[string]string
		body    string
		want    string // "" for accepted
	}{
		{"github good", secret, map[string]string{HeaderGitHubSignature: sign(secret, body)}, body, ""},
		{"github other body", secret, map[string]string{HeaderGitHubSignature: sign(secret, body)}, body + " ", "is not the HMAC-SHA256 of the body"},
		{"github other secret", secret, map[string]string{HeaderGitHubSignature: sign("other", body)}, body, "is not the HMAC-SHA256 of the body"},
		{"github sha1", secret, map[string]string{HeaderGitHubSignature: "sha1=abcd"}, body, "is not sha256=HEX"},
		{"github not hex", secret, map[string]string{HeaderGitHubSignature: "sha256=zz"}, body, "is not hexadecimal"},
		{"gitlab good", secret, map[string]string{HeaderGitLabToken: secret}, body, ""},
		{"gitlab bad", secret, map[string]string{HeaderGitLabToken: secret + "x"}, body, "X-Gitlab-Token is not the source's secret"},
		{"gitlab prefix", secret, map[string]string{HeaderGitLabToken: secret[:4]}, body, "is not the source's secret"},
		{"github wins over gitlab", secret, map[string]string{HeaderGitHubSignature: sign("other", body), HeaderGitLabToken: secret}, body, "HMAC"},
		{"no header", secret, nil, body, "neither X-Hub-Signature-256 nor X-Gitlab-Token"},
		{"no secret", "", map[string]string{HeaderGitLabToken: ""}, body, "no secret"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			err := VerifyHook([]byte(tc.secret), h, []byte(tc.body))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrBadSignature) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrBadSignature with %q", err, tc.want)
			}
		})
	}
}

// TestWebhookSecret reads the file afresh, trimmed.
func TestWebhookSecret(t *testing.T) {
	path := writeFile(t, "secret", "  hook-secret\n")
	d, _ := newDriver(t, nil, Config{URL: "https://git.example.com/p.git", WebhookSecretFile: path})
	got, err := d.WebhookSecret()
	if err != nil || string(got) != "hook-secret" {
		t.Fatalf("WebhookSecret() = %q, %v; want hook-secret", got, err)
	}
	none, _ := newDriver(t, nil, Config{URL: "https://git.example.com/p.git"})
	if _, err := none.WebhookSecret(); !errors.Is(err, ErrNoWebhookSecret) {
		t.Errorf("without a file: %v, want ErrNoWebhookSecret", err)
	}
	empty, _ := newDriver(t, nil, Config{URL: "https://git.example.com/p.git", WebhookSecretFile: writeFile(t, "empty", "\n")})
	if _, err := empty.WebhookSecret(); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty file: %v, want 'is empty'", err)
	}
}

// TestAllowHook: HookBurst hooks pass at once, the next is refused.
func TestAllowHook(t *testing.T) {
	d, _ := newDriver(t, nil, Config{URL: "https://git.example.com/p.git"})
	other, _ := newDriver(t, nil, Config{Name: "other", URL: "https://git.example.com/p.git"})
	for i := range HookBurst {
		if !d.AllowHook() {
			t.Fatalf("hook %d refused within the burst", i+1)
		}
	}
	if d.AllowHook() {
		t.Error("a hook past the burst was allowed")
	}
	if !other.AllowHook() {
		t.Error("another source's budget was spent")
	}
}

// watch runs d.Watch in the background, counting changed calls; stop ends
// it and checks that it returned.
func watch(t *testing.T, d *Driver) (calls *atomic.Int64, stop func()) {
	t.Helper()
	calls = &atomic.Int64{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Watch(ctx, func() { calls.Add(1) }) }()
	return calls, func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Watch did not return when its context ended")
		}
	}
}

// TestWatch: changed at start, on every interval, on Hook; nothing left
// running after ctx ends.
func TestWatch(t *testing.T) {
	defer goleak.VerifyNone(t)
	t.Run("interval", func(t *testing.T) {
		d, _ := newDriver(t, nil, Config{URL: "https://git.example.com/p.git", Interval: 10 * time.Millisecond})
		calls, stop := watch(t, d)
		defer stop()
		poll.Eventually(t, "changed on three ticks", func() error {
			if n := calls.Load(); n < 4 {
				return fmt.Errorf("%d calls", n)
			}
			return nil
		})
	})
	t.Run("hook", func(t *testing.T) {
		d, _ := newDriver(t, nil, Config{URL: "https://git.example.com/p.git", Interval: time.Hour})
		d.Hook() // before Watch: covered by its first call
		calls, stop := watch(t, d)
		defer stop()
		poll.Eventually(t, "changed at start", poll.Holds(func() bool { return calls.Load() == 1 }))
		poll.Throughout(t, "no call without a hook", 100*time.Millisecond, func() error {
			if n := calls.Load(); n != 1 {
				return errors.New("called again without a hook")
			}
			return nil
		})
		d.Hook()
		poll.Eventually(t, "changed on the hook", poll.Holds(func() bool { return calls.Load() == 2 }))
		d.Hook()
		d.Hook()
		poll.Eventually(t, "changed on the next hooks", poll.Holds(func() bool { return calls.Load() >= 3 }))
	})
}
