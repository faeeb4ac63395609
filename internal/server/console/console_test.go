package console

import (
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/auth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	adminSecret = "admin-secret-0123456789abcdef"
	readSecret  = "read-secret-0123456789abcdef"
)

// fakeAPI stands in for the admin API in these unit tests: it answers the
// routes the pages read with empty lists, and checks the in-process
// identity's role on writes as the real API does. The real API is behind
// the console in internal/server's browser tests.
type fakeAPI struct {
	writes []string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok, ok := auth.TokenFrom(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if r.Method != http.MethodGet {
		if ok && tok.Role < auth.RoleAdmin {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"code":"forbidden","message":"token has role read"}}`))
			return
		}
		f.writes = append(f.writes, r.Method+" "+r.URL.Path)
		_, _ = w.Write([]byte(`{"revision":9}`))
		return
	}
	answers := map[string]string{
		"/v1/cluster":  `{"node_id":"n1","cluster_id":"c1","leader_id":"n1","members":[{"id":"n1","http_addr":"127.0.0.1:1","leader":true,"suffrage":"Voter"}]}`,
		"/v1/clients":  `{"clients":[],"total":0,"counts":{"pending":0,"acked":0,"nacked":0,"stale":0}}`,
		"/v1/rollouts": `{"rollouts":[]}`,
		"/v1/drift":    `{"reports":[]}`,
		"/v1/sources":  `{"sources":[]}`,
		"/v1/reload":   `{"controller":{"state":"disabled"}}`,
		"/v1/policies": `{"policies":[]}`,
		"/v1/events":   `{"events":[]}`,
	}
	body, found := answers[r.URL.Path]
	if !found {
		w.WriteHeader(http.StatusNotFound)
		body = `{"error":{"code":"not_found","message":"no such thing"}}`
	}
	_, _ = w.Write([]byte(body))
}

func tokens(t *testing.T) *auth.AdminTokens {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("admin "+adminSecret+" ops\nread "+readSecret+" viewer\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := auth.LoadAdminTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func newConsole(t *testing.T, tk *auth.AdminTokens, api http.Handler, mutate ...func(*Config)) *Console {
	t.Helper()
	cfg := Config{Tokens: func() *auth.AdminTokens { return tk }, NodeID: "n1"}
	for _, m := range mutate {
		m(&cfg)
	}
	c, err := New(cfg, slog.New(slog.DiscardHandler), api)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// cookieFor signs a session of secret, issued and last seen at the times
// given.
func cookieFor(t *testing.T, tk *auth.AdminTokens, secret string, issued, seen time.Time) *http.Cookie {
	t.Helper()
	_, k, err := tk.SignIn(secret)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Cookie{Name: cookieName, Value: encode(k, claims{Key: k.ID, ID: "sid", Issued: issued.Unix(), Seen: seen.Unix()})}
}

func get(c *Console, path string, ck *http.Cookie) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if ck != nil {
		r.AddCookie(ck)
	}
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	return w
}

func TestSessions(t *testing.T) {
	tk := tokens(t)
	c := newConsole(t, tk, &fakeAPI{})
	now := time.Now()
	good := cookieFor(t, tk, adminSecret, now, now)
	tampered := *good
	tampered.Value = strings.Replace(good.Value, ".", ".A", 1)
	body, _, _ := strings.Cut(good.Value, ".")
	other := tokens(t) // the same secrets in another set: sessions move between nodes
	for _, tc := range []struct {
		name   string
		cookie *http.Cookie
		want   int
	}{
		{"no cookie", nil, http.StatusSeeOther},
		{"valid", good, http.StatusOK},
		{"tampered signature", &tampered, http.StatusSeeOther},
		{"body without signature", &http.Cookie{Name: cookieName, Value: body}, http.StatusSeeOther},
		{"garbage", &http.Cookie{Name: cookieName, Value: "%%%.!!!"}, http.StatusSeeOther},
		{"past the session TTL", cookieFor(t, tk, adminSecret, now.Add(-9*time.Hour), now), http.StatusSeeOther},
		{"idle past the idle timeout", cookieFor(t, tk, adminSecret, now.Add(-2*time.Hour), now.Add(-61*time.Minute)), http.StatusSeeOther},
		{"seen in the future", cookieFor(t, tk, adminSecret, now, now.Add(time.Hour)), http.StatusSeeOther},
		{"signed by another node's copy of the tokens", cookieFor(t, other, readSecret, now, now), http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := get(c, "/ui/", tc.cookie)
			if w.Code != tc.want {
				t.Fatalf("GET /ui/: %d, want %d (Location %s)", w.Code, tc.want, w.Header().Get("Location"))
			}
			if tc.want == http.StatusSeeOther && !strings.HasPrefix(w.Header().Get("Location"), "/ui/signin") {
				t.Errorf("redirects to %q, want the sign-in page", w.Header().Get("Location"))
			}
		})
	}

	t.Run("a removed token ends its sessions", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte("read "+readSecret+" viewer\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		rotated, err := auth.LoadAdminTokens(path)
		if err != nil {
			t.Fatal(err)
		}
		c := newConsole(t, rotated, &fakeAPI{})
		if w := get(c, "/ui/", good); w.Code != http.StatusSeeOther {
			t.Fatalf("the admin token's session after its removal: %d", w.Code)
		}
	})
}

func TestSignIn(t *testing.T) {
	tk := tokens(t)
	c := newConsole(t, tk, &fakeAPI{})
	for _, tc := range []struct {
		name, token, next, origin string
		tls                       bool
		wantStatus                int
		wantLocation              string
	}{
		{name: "admin", token: adminSecret, next: "/ui/policies", wantStatus: http.StatusSeeOther, wantLocation: "/ui/policies"},
		{name: "read, with Bearer pasted", token: "Bearer " + readSecret, wantStatus: http.StatusSeeOther, wantLocation: "/ui/"},
		{name: "under TLS", token: adminSecret, tls: true, wantStatus: http.StatusSeeOther, wantLocation: "/ui/"},
		{name: "a next off the console", token: adminSecret, next: "//evil.example/ui/", wantStatus: http.StatusSeeOther, wantLocation: "/ui/"},
		{name: "wrong token", token: "not-a-token-at-all-0000", wantStatus: http.StatusUnauthorized},
		{name: "empty", token: "", wantStatus: http.StatusUnauthorized},
		{name: "from another site", token: adminSecret, origin: "http://evil.example", wantStatus: http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			form := url.Values{"token": {tc.token}, "next": {tc.next}}
			r := httptest.NewRequest(http.MethodPost, "/ui/signin", strings.NewReader(form.Encode()))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			w := httptest.NewRecorder()
			c.ServeHTTP(w, r)
			if w.Code != tc.wantStatus || w.Header().Get("Location") != tc.wantLocation {
				t.Fatalf("%d %q, want %d %q", w.Code, w.Header().Get("Location"), tc.wantStatus, tc.wantLocation)
			}
			cookies := w.Result().Cookies()
			if tc.wantStatus != http.StatusSeeOther {
				if len(cookies) != 0 {
					t.Errorf("a refused sign-in set %v", cookies)
				}
				return
			}
			if len(cookies) != 1 {
				t.Fatalf("cookies %v", cookies)
			}
			ck := cookies[0]
			got := []any{ck.Name, ck.Path, ck.HttpOnly, ck.SameSite, ck.Secure}
			want := []any{cookieName, "/ui/", true, http.SameSiteStrictMode, tc.tls}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("cookie (-want +got):\n%s", diff)
			}
			if ck.MaxAge <= 0 || ck.MaxAge > int((8*time.Hour).Seconds()) {
				t.Errorf("Max-Age %d", ck.MaxAge)
			}
			if w := get(c, "/ui/", ck); w.Code != http.StatusOK {
				t.Errorf("the new session: %d", w.Code)
			}
		})
	}
}

func TestActions(t *testing.T) {
	tk := tokens(t)
	now := time.Now()
	admin, reader := cookieFor(t, tk, adminSecret, now, now), cookieFor(t, tk, readSecret, now, now)
	csrfOf := func(ck *http.Cookie) string {
		c := newConsole(t, tk, &fakeAPI{})
		s, ok := c.session(httptest.NewRecorder(), func() *http.Request {
			r := httptest.NewRequest(http.MethodGet, "/ui/", nil)
			r.AddCookie(ck)
			return r
		}())
		if !ok {
			t.Fatal("no session")
		}
		return s.CSRF
	}
	for _, tc := range []struct {
		name       string
		cookie     *http.Cookie
		csrf       string
		origin     string
		site       string
		wantStatus int
		wantWrites int
	}{
		{name: "admin with the CSRF token", cookie: admin, csrf: csrfOf(admin), wantStatus: http.StatusSeeOther, wantWrites: 1},
		{name: "admin without it", cookie: admin, wantStatus: http.StatusForbidden},
		{name: "admin with another session's", cookie: admin, csrf: csrfOf(reader), wantStatus: http.StatusForbidden},
		{name: "admin from another origin", cookie: admin, csrf: csrfOf(admin), origin: "http://evil.example", wantStatus: http.StatusForbidden},
		{name: "admin, a cross-site fetch", cookie: admin, csrf: csrfOf(admin), site: "cross-site", wantStatus: http.StatusForbidden},
		{name: "read token with its CSRF token", cookie: reader, csrf: csrfOf(reader), wantStatus: http.StatusForbidden},
		{name: "no session", csrf: "x", wantStatus: http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &fakeAPI{}
			c := newConsole(t, tk, api)
			form := url.Values{"to": {"3"}}
			if tc.csrf != "" {
				form.Set("csrf", tc.csrf)
			}
			r := httptest.NewRequest(http.MethodPost, "/ui/rollouts/r1/abort", strings.NewReader(form.Encode()))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tc.cookie != nil {
				r.AddCookie(tc.cookie)
			}
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			if tc.site != "" {
				r.Header.Set("Sec-Fetch-Site", tc.site)
			}
			w := httptest.NewRecorder()
			c.ServeHTTP(w, r)
			if w.Code != tc.wantStatus || len(api.writes) != tc.wantWrites {
				t.Fatalf("%d with writes %v, want %d and %d writes", w.Code, api.writes, tc.wantStatus, tc.wantWrites)
			}
		})
	}
}

func TestHeadersAndPages(t *testing.T) {
	tk := tokens(t)
	c := newConsole(t, tk, &fakeAPI{})
	now := time.Now()
	ck := cookieFor(t, tk, readSecret, now, now)
	for _, path := range []string{"/ui/", "/ui/sidecars", "/ui/policies", "/ui/rollouts", "/ui/drift", "/ui/reload", "/ui/sources", "/ui/events", "/ui/signin", "/ui/nope"} {
		t.Run(path, func(t *testing.T) {
			w := get(c, path, ck)
			h := w.Header()
			if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Errorf("CSP %q", csp)
			}
			if h.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("no nosniff")
			}
			if path == "/ui/nope" {
				if w.Code != http.StatusNotFound {
					t.Errorf("unknown page: %d", w.Code)
				}
				return
			}
			if w.Code != http.StatusOK || h.Get("Cache-Control") != "no-store" {
				t.Errorf("%d, Cache-Control %q", w.Code, h.Get("Cache-Control"))
			}
			if strings.Contains(w.Body.String(), "<script>") || strings.Contains(w.Body.String(), " style=") {
				t.Errorf("inline script or style in %s", path)
			}
		})
	}
	t.Run("assets", func(t *testing.T) {
		w := get(c, "/ui/assets/console.js", nil)
		if w.Code != http.StatusOK || !strings.Contains(w.Header().Get("Content-Type"), "javascript") || w.Header().Get("ETag") == "" {
			t.Fatalf("%d %v", w.Code, w.Header())
		}
		r := httptest.NewRequest(http.MethodGet, "/ui/assets/console.js", nil)
		r.Header.Set("If-None-Match", w.Header().Get("ETag"))
		w2 := httptest.NewRecorder()
		c.ServeHTTP(w2, r)
		if w2.Code != http.StatusNotModified {
			t.Errorf("revalidation: %d", w2.Code)
		}
	})
	t.Run("auth off", func(t *testing.T) {
		c := newConsole(t, nil, &fakeAPI{})
		w := get(c, "/ui/", nil)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `id="auth-off"`) {
			t.Fatalf("%d; banner shown: %v", w.Code, strings.Contains(w.Body.String(), "auth-off"))
		}
		if len(w.Result().Cookies()) != 1 {
			t.Errorf("no anonymous session cookie for the CSRF token")
		}
	})
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                     "/ui/",
		"/ui/policies?org=a":   "/ui/policies?org=a",
		"//evil.example/ui/":   "/ui/",
		"https://evil.example": "/ui/",
		"/ui/\\evil":           "/ui/",
		"/v1/policies":         "/ui/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzSessionCookie: no cookie value panics the console, and none but a
// signed one opens a session.
func FuzzSessionCookie(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, "tokens")
	if err := os.WriteFile(path, []byte("admin "+adminSecret+" ops\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	tk, err := auth.LoadAdminTokens(path)
	if err != nil {
		f.Fatal(err)
	}
	_, k, _ := tk.SignIn(adminSecret)
	now := time.Now()
	good := encode(k, claims{Key: k.ID, ID: "sid", Issued: now.Unix(), Seen: now.Unix()})
	f.Add(good)
	f.Add("")
	f.Add(".")
	f.Add("e30.AAAA")
	body, _ := json.Marshal(claims{Key: k.ID, ID: "x", Issued: now.Unix(), Seen: now.Unix()})
	f.Add(string(body) + ".sig")
	c, err := New(Config{Tokens: func() *auth.AdminTokens { return tk }}, slog.New(slog.DiscardHandler), &fakeAPI{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, value string) {
		r := httptest.NewRequest(http.MethodGet, "/ui/", nil)
		r.Header.Set("Cookie", cookieName+"="+value)
		_, ok := c.session(httptest.NewRecorder(), r)
		if ok && value != good {
			b, mac, _ := strings.Cut(value, ".")
			if _, gmac, _ := strings.Cut(good, "."); mac != gmac || b == "" {
				t.Fatalf("a session from an unsigned cookie %q", value)
			}
		}
	})
}

func TestFlashIsSigned(t *testing.T) {
	tk := tokens(t)
	c := newConsole(t, tk, &fakeAPI{})
	now := time.Now()
	ck := cookieFor(t, tk, adminSecret, now, now)
	r := httptest.NewRequest(http.MethodGet, "/ui/", nil)
	r.AddCookie(ck)
	s, ok := c.session(httptest.NewRecorder(), r)
	if !ok {
		t.Fatal("no session")
	}
	for _, tc := range []struct {
		name, query string
		shown       bool
	}{
		{"signed for the session", s.flash("Reverted."), true},
		{"unsigned", "done=" + url.QueryEscape("Your token leaked: sign in at evil.example"), false},
		{"signed for another message", "done=Other&" + strings.SplitN(s.flash("Reverted."), "&", 2)[1], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := get(c, "/ui/rollouts?"+tc.query, ck)
			if got := strings.Contains(w.Body.String(), `id="flash"`); got != tc.shown {
				t.Errorf("flash shown: %v, want %v", got, tc.shown)
			}
		})
	}
}

// eventLog serves /v1/cluster and /v1/events over events with the given
// ids, reading forward as the API does, and counts the events it served.
type eventLog struct {
	ids    []uint64
	served int
}

func (l *eventLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	last := l.ids[len(l.ids)-1]
	if r.URL.Path == "/v1/cluster" {
		_ = json.NewEncoder(w).Encode(map[string]any{"applied_index": last})
		return
	}
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	page := adminclient.EventPage{Events: []adminclient.Event{}}
	for _, id := range l.ids {
		if id > after && len(page.Events) < limit {
			page.Events = append(page.Events, adminclient.Event{ID: id})
			page.LastID = id
		}
	}
	l.served += len(page.Events)
	_ = json.NewEncoder(w).Encode(page)
}

func TestNewestEvents(t *testing.T) {
	dense := make([]uint64, 5000)
	for i := range dense {
		dense[i] = uint64(i + 1)
	}
	// Sparse: 150 events, 100 of them far below the applied index.
	var sparse []uint64
	for i := range 100 {
		sparse = append(sparse, uint64(10+i))
	}
	for i := range 50 {
		sparse = append(sparse, uint64(100_000+i*10))
	}
	for _, tc := range []struct {
		name      string
		ids       []uint64
		want      []uint64 // newest first
		maxServed int
	}{
		{"dense: one window", dense, []uint64{5000, 4999, 4998}, 1024},
		// Three windows: the API reads forward only, so each wider one reads
		// at most one page (here all 50) of what the narrower one had.
		{"sparse: widened to the start", sparse, []uint64{100_490, 100_480}, len(sparse) + 2*50},
		{"fewer than asked", []uint64{3, 7}, []uint64{7, 3}, 2},
		// 2,000 of 5,000: the first window holds 1,024, the second reads
		// from 0 and stops at the page that reaches the first's start.
		{"dense: widened once", dense, []uint64{5000, 4999}, 1024 + 4000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &eventLog{ids: tc.ids}
			c := newConsole(t, nil, l)
			n := map[string]int{"sparse: widened to the start": 120, "dense: widened once": 2000}[tc.name]
			if n == 0 {
				n = len(tc.want)
			}
			got, end, err := newestEvents(t.Context(), c.client(&session{AuthOff: true}), adminclient.EventFilter{}, n)
			if err != nil {
				t.Fatal(err)
			}
			if end != tc.ids[len(tc.ids)-1] {
				t.Errorf("read to %d, want %d", end, tc.ids[len(tc.ids)-1])
			}
			if len(got) != n {
				t.Fatalf("%d events, want %d", len(got), n)
			}
			for i, id := range tc.want {
				if got[i].ID != id {
					t.Errorf("event %d is %d, want %d", i, got[i].ID, id)
				}
			}
			if n == 120 && got[119].ID != 40 {
				t.Errorf("the oldest of 120 is %d, want 40", got[119].ID)
			}
			if l.served > tc.maxServed {
				t.Errorf("served %d events, at most %d: a wider window re-read a narrower one", l.served, tc.maxServed)
			}
		})
	}
}
