package git

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// Webhook headers: GitHub signs the body, GitLab sends the secret itself.
const (
	HeaderGitHubSignature = "X-Hub-Signature-256"
	HeaderGitLabToken     = "X-Gitlab-Token"
)

// ErrBadSignature is returned by VerifyHook for a webhook that does not
// prove it knows the secret: answer 401 and do nothing.
var ErrBadSignature = errors.New("webhook signature does not match")

// ErrNoWebhookSecret is returned by WebhookSecret when the source has no
// webhook_secret_file: the source takes no webhooks.
var ErrNoWebhookSecret = errors.New("no webhook_secret_file is configured")

// VerifyHook checks a webhook against secret: GitHub's X-Hub-Signature-256
// (sha256=HEX, the HMAC-SHA256 of body) or GitLab's X-Gitlab-Token (the
// secret). Every failure wraps ErrBadSignature.
func VerifyHook(secret []byte, h http.Header, body []byte) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: no secret to check it against", ErrBadSignature)
	}
	if sig := h.Get(HeaderGitHubSignature); sig != "" {
		hexSum, ok := strings.CutPrefix(sig, "sha256=")
		if !ok {
			return fmt.Errorf("%w: %s is not sha256=HEX", ErrBadSignature, HeaderGitHubSignature)
		}
		got, err := hex.DecodeString(hexSum)
		if err != nil {
			return fmt.Errorf("%w: %s is not hexadecimal", ErrBadSignature, HeaderGitHubSignature)
		}
		mac := hmac.New(sha256.New, secret)
		mac.Write(body)
		if !hmac.Equal(got, mac.Sum(nil)) {
			return fmt.Errorf("%w: %s is not the HMAC-SHA256 of the body with the source's secret", ErrBadSignature, HeaderGitHubSignature)
		}
		return nil
	}
	if token := h.Get(HeaderGitLabToken); token != "" {
		// Comparing digests keeps the secret's length out of the timing.
		got, want := sha256.Sum256([]byte(token)), sha256.Sum256(secret)
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			return fmt.Errorf("%w: %s is not the source's secret", ErrBadSignature, HeaderGitLabToken)
		}
		return nil
	}
	return fmt.Errorf("%w: neither %s nor %s is set", ErrBadSignature, HeaderGitHubSignature, HeaderGitLabToken)
}

// WebhookSecret reads webhook_secret_file afresh (surrounding whitespace
// trimmed), so that a rotated secret is used at once.
func (d *Driver) WebhookSecret() ([]byte, error) {
	if d.cfg.WebhookSecretFile == "" {
		return nil, fmt.Errorf("%s: %w", d.Name(), ErrNoWebhookSecret)
	}
	b, err := os.ReadFile(d.cfg.WebhookSecretFile)
	if err != nil {
		return nil, fmt.Errorf("%s: read webhook_secret_file: %w", d.Name(), err)
	}
	s := []byte(strings.TrimSpace(string(b)))
	if len(s) == 0 {
		return nil, fmt.Errorf("%s: webhook_secret_file %s is empty", d.Name(), d.cfg.WebhookSecretFile)
	}
	return s, nil
}

// AllowHook takes one webhook from the source's budget (HookBurst, then
// HookRate a second); false means answer 429 and do nothing.
func (d *Driver) AllowHook() bool { return d.limit.Allow() }
