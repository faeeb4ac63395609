package adminapi

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/policyd/policyd/internal/auth"
)

// TestAdminTokensGuardEveryRoute: with a tokens file, every route but the
// probes needs a token, every write needs an admin one, and a refused
// request reaches nothing behind the API. The admin token's name is the
// actor its writes record.
func TestAdminTokensGuardEveryRoute(t *testing.T) {
	tokens := testTokens(t)
	const (
		reader = "Bearer reader-token-0123456789"
		admin  = "Bearer admin-token-0123456789"
	)
	f := newFake(t)
	seedState(t, f)
	// Every backend method panics: a request that gets past the token
	// check without the right role shows as a 500.
	locked := newFake(t)
	locked.panicIn("*")
	for _, route := range New(Config{}, discard(), f).Routes() {
		t.Run(route.Pattern, func(t *testing.T) {
			a := New(Config{Tokens: tokens}, discard(), locked)
			ok := checksFor(route.Pattern, routeTests[route.Pattern])[0]
			send := func(token string) *http.Request {
				r := newRequest(ok.method, ok.target, ok.body, ok.header)
				if token != "" {
					r.Header.Set("Authorization", token)
				}
				return r
			}
			if route.Role < 0 {
				if w := serve(a, send("")); w.Code == http.StatusUnauthorized || w.Code == http.StatusForbidden {
					t.Fatalf("an open route refused a request without a token: %d %s", w.Code, w.Body)
				}
				return
			}
			w := serve(a, send(""))
			if w.Code != http.StatusUnauthorized {
				t.Fatalf("without a token: %d, want 401: %s", w.Code, w.Body)
			}
			checkEnvelope(t, w, "unauthorized", "")
			if got := w.Header().Get("WWW-Authenticate"); got == "" {
				t.Error("a 401 without WWW-Authenticate")
			}
			w = serve(a, send("Bearer wrong-token-0123456789"))
			if w.Code != http.StatusUnauthorized {
				t.Fatalf("with an unknown token: %d, want 401: %s", w.Code, w.Body)
			}
			if route.Role == auth.RoleAdmin {
				w := serve(a, send(reader))
				if w.Code != http.StatusForbidden {
					t.Fatalf("with a read token: %d, want 403: %s", w.Code, w.Body)
				}
				checkEnvelope(t, w, "forbidden", "admin")
			}
		})
	}

	a := New(Config{Tokens: tokens}, discard(), f)
	if w := serve(a, newRequest("GET", "/v1/policies/p1", "", map[string]string{"Authorization": reader})); w.Code != http.StatusOK {
		t.Fatalf("a read with a read token: %d %s", w.Code, w.Body)
	}
	w := serve(a, newRequest("PUT", "/v1/policies/p4", policyBody, map[string]string{"Authorization": admin}))
	if w.Code != http.StatusOK {
		t.Fatalf("a write with an admin token: %d %s", w.Code, w.Body)
	}
	proposedBy("token:ops")(t, f, w)

	// Without tokens again (a reloaded configuration), the API is open.
	a.SetTokens(nil)
	if w := serve(a, newRequest("DELETE", "/v1/policies/p4", "", nil)); w.Code != http.StatusOK {
		t.Fatalf("a write after SetTokens(nil): %d %s", w.Code, w.Body)
	}
}

// testTokens is a tokens file of a read token (reader-token-0123456789,
// named ci) and an admin token (admin-token-0123456789, named ops).
func testTokens(t *testing.T) *auth.AdminTokens {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("read reader-token-0123456789 ci\nadmin admin-token-0123456789 ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.LoadAdminTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}
