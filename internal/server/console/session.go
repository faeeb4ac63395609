package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/policyd/policyd/internal/auth"
)

// anonymous is every visitor when auth is off, as the API sees them.
var anonymous = auth.Token{Name: "anonymous", Role: auth.RoleAdmin}

// cookieName is the console's session cookie.
const cookieName = "policyd_console"

// refreshAfter is how stale a session's last-use time may get before the
// cookie is written again: often enough for the idle timeout, rarely
// enough that most responses carry no Set-Cookie.
const refreshAfter = time.Minute

// session is a signed-in visitor.
type session struct {
	Token   auth.Token
	AuthOff bool
	// CSRF is the per-session token every form posts back.
	CSRF string
	// Expires is when the session ends at the latest.
	Expires time.Time
	// Cert is the client certificate's subject when mutual TLS, not a
	// token, authenticates the admin door.
	Cert      string
	tls       *tls.ConnectionState
	requestID string
}

// Admin says whether the session may act: pages show action buttons only
// then, and the API refuses the rest in any case.
func (s *session) Admin() bool { return s != nil && (s.AuthOff || s.Token.Role >= auth.RoleAdmin) }

// claims is the signed content of the cookie.
type claims struct {
	Key    string `json:"k"` // auth.SessionKey.ID; "" in auth-off mode
	ID     string `json:"s"` // random, names the session for CSRF
	Issued int64  `json:"i"` // unix seconds
	Seen   int64  `json:"l"` // unix seconds of the last refresh
}

func newAnonKey() (auth.SessionKey, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return auth.SessionKey{}, fmt.Errorf("console session key: %w", err)
	}
	return auth.NewSessionKey(secret), nil
}

// encode signs cl with k: base64(JSON) "." base64(MAC).
func encode(k auth.SessionKey, cl claims) string {
	body, _ := json.Marshal(cl) // four plain fields cannot fail
	b := base64.RawURLEncoding.EncodeToString(body)
	return b + "." + base64.RawURLEncoding.EncodeToString(k.Sign([]byte(b)))
}

// session verifies the request's cookie and refreshes it when due. It
// returns false when there is no valid, unexpired session.
func (c *Console) session(w http.ResponseWriter, r *http.Request) (*session, bool) {
	tokens := c.cfg.Tokens()
	now := time.Now()
	ck, err := r.Cookie(cookieName)
	if err != nil {
		if tokens != nil {
			return nil, false
		}
		// Auth is off: everyone is the anonymous admin; a session only
		// carries the CSRF token.
		return c.issue(w, r, c.anon, anonymous, true, claims{Issued: now.Unix()}), true
	}
	b, mac, ok := strings.Cut(ck.Value, ".")
	if !ok {
		return c.noSession(w, r, tokens)
	}
	raw, err := base64.RawURLEncoding.DecodeString(b)
	if err != nil {
		return c.noSession(w, r, tokens)
	}
	var cl claims
	if err := json.Unmarshal(raw, &cl); err != nil {
		return c.noSession(w, r, tokens)
	}
	var (
		tok     auth.Token
		key     auth.SessionKey
		authOff = tokens == nil
	)
	if authOff {
		if cl.Key != "" {
			return c.noSession(w, r, tokens)
		}
		tok, key = anonymous, c.anon
	} else {
		if tok, key, ok = tokens.Session(cl.Key); !ok {
			return c.noSession(w, r, tokens)
		}
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || !hmac.Equal(got, key.Sign([]byte(b))) {
		return c.noSession(w, r, tokens)
	}
	issued, seen := time.Unix(cl.Issued, 0), time.Unix(cl.Seen, 0)
	if now.Sub(issued) > c.cfg.SessionTTL || now.Sub(seen) > c.cfg.IdleTimeout || seen.After(now.Add(time.Minute)) {
		return c.noSession(w, r, tokens)
	}
	if now.Sub(seen) >= min(refreshAfter, c.cfg.IdleTimeout/4) {
		return c.issue(w, r, key, tok, authOff, cl), true
	}
	return c.sessionOf(key, tok, authOff, cl, r), true
}

// noSession clears a bad or expired cookie; in auth-off mode it starts a
// new anonymous session instead.
func (c *Console) noSession(w http.ResponseWriter, r *http.Request, tokens *auth.AdminTokens) (*session, bool) {
	if tokens == nil {
		return c.issue(w, r, c.anon, anonymous, true, claims{Issued: time.Now().Unix()}), true
	}
	clearCookie(w, r)
	return nil, false
}

// issue writes the session cookie of cl, seen now; a zero cl.ID starts a
// new session.
func (c *Console) issue(w http.ResponseWriter, r *http.Request, k auth.SessionKey, tok auth.Token, authOff bool, cl claims) *session {
	if cl.ID == "" {
		id := make([]byte, 16)
		_, _ = rand.Read(id) // crypto/rand does not fail on Linux
		cl.ID = base64.RawURLEncoding.EncodeToString(id)
	}
	cl.Key = k.ID
	if authOff {
		cl.Key = ""
	}
	cl.Seen = time.Now().Unix()
	s := c.sessionOf(k, tok, authOff, cl, r)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: encode(k, cl), Path: "/ui/",
		Expires: s.Expires, MaxAge: int(time.Until(s.Expires).Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	return s
}

func (c *Console) sessionOf(k auth.SessionKey, tok auth.Token, authOff bool, cl claims, r *http.Request) *session {
	s := &session{
		Token: tok, AuthOff: authOff,
		CSRF:      base64.RawURLEncoding.EncodeToString(k.Sign([]byte("csrf:" + cl.ID))[:18]),
		Expires:   time.Unix(cl.Issued, 0).Add(c.cfg.SessionTTL),
		requestID: r.Header.Get("X-Request-ID"),
	}
	// Without tokens the API authenticates by the client certificate, so
	// the console's calls carry the browser's.
	if authOff && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		s.tls, s.Cert = r.TLS, r.TLS.PeerCertificates[0].Subject.String()
	}
	return s
}

func clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/ui/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// flash is the query that shows msg once on the next page. It is signed
// for the session, so a link from elsewhere cannot put words on a page.
func (s *session) flash(msg string) string {
	return url.Values{"done": {msg}, "ds": {s.flashSig(msg)}}.Encode()
}

func (s *session) flashSig(msg string) string {
	m := hmac.New(sha256.New, []byte(s.CSRF))
	m.Write([]byte(msg))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:12])
}

// flashOf is the request's flash message when this session signed it.
func (s *session) flashOf(r *http.Request) string {
	q := r.URL.Query()
	msg := q.Get("done")
	if msg == "" || !hmac.Equal([]byte(q.Get("ds")), []byte(s.flashSig(msg))) {
		return ""
	}
	return msg
}

// sameOrigin refuses a state-changing request a browser says came from
// another site; the CSRF token is the check that does not depend on the
// browser.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true // not a browser, or an old one: the CSRF token decides
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// checkCSRF compares the form's token with the session's.
func checkCSRF(r *http.Request, s *session) bool {
	got := r.PostFormValue("csrf")
	if got == "" {
		got = r.Header.Get("X-CSRF-Token")
	}
	return got != "" && hmac.Equal([]byte(got), []byte(s.CSRF))
}

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Tokens() == nil {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	msg := ""
	if r.URL.Query().Get("expired") != "" {
		msg = "Your session has ended. Sign in again."
	}
	c.render(w, http.StatusOK, "signin", view{Title: "Sign in", NodeID: c.cfg.NodeID, Problem: msg,
		Data: safeNext(r.URL.Query().Get("next"))})
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	tokens := c.cfg.Tokens()
	if tokens == nil {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !sameOrigin(r) {
		c.render(w, http.StatusForbidden, "signin", view{Title: "Sign in", NodeID: c.cfg.NodeID, Problem: "cross-site sign-in refused"})
		return
	}
	secret := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	tok, key, err := tokens.SignIn(strings.TrimPrefix(secret, "Bearer "))
	if err != nil {
		c.logger.Info("console sign-in refused", "remote", r.RemoteAddr)
		c.render(w, http.StatusUnauthorized, "signin", view{Title: "Sign in", NodeID: c.cfg.NodeID,
			Problem: "That token is not valid.", Data: next})
		return
	}
	c.issue(w, r, key, tok, false, claims{Issued: time.Now().Unix()})
	c.logger.Info("console sign-in", "token", tok.Name, "role", tok.Role.String(), "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	if s, ok := c.session(w, r); ok && sameOrigin(r) && checkCSRF(r, s) {
		clearCookie(w, r)
	}
	http.Redirect(w, r, "/ui/signin", http.StatusSeeOther)
}

// safeNext keeps a post-sign-in redirect on the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/ui/"
	}
	return next
}
