// Package console is the operator's web console at /ui/ on the admin
// listener: server-rendered html/template pages over the admin API, a
// little JavaScript from files for the live views (Server-Sent Events),
// and sessions signed with a key derived from the admin token. It reads
// and acts through the admin API in process (adminclient over inProcess),
// so what a page shows is what the REST API answers, and the API checks
// every action's role and audits it. See docs/console.md.
package console

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/auth"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Config configures the console.
type Config struct {
	// Tokens returns the admin token set in force; nil means auth is off
	// and every visitor is the anonymous admin (loopback only).
	Tokens func() *auth.AdminTokens
	// SessionTTL ends a session this long after sign-in (default 8h).
	SessionTTL time.Duration
	// IdleTimeout ends a session not used for this long (default 1h).
	IdleTimeout time.Duration
	// NodeID names the node serving the console.
	NodeID string
	// Probe asks a member's admin address whether it is ready, and its
	// applied index; nil shows every member as ready.
	Probe func(ctx context.Context, httpAddr string) (applied uint64, err error)
	// LivePeriod is how often a live view re-renders (default 2s).
	LivePeriod time.Duration
}

// Console is the /ui/ handler.
type Console struct {
	cfg    Config
	logger *slog.Logger
	api    http.Handler
	mux    *http.ServeMux
	pages  map[string]*template.Template
	// anon signs the sessions of auth-off mode: this node's own key, as
	// there is no token to derive one from.
	anon   auth.SessionKey
	assets map[string]asset
	// liveSlots bounds the live views open at once: each relays for as
	// long as its browser stays.
	liveSlots       chan struct{}
	liveOverviewHub overviewHub
	// streams ends every live view when the node shuts down.
	streams     context.Context
	stopStreams context.CancelFunc
}

// maxLive is how many live views one node serves at once.
const maxLive = 128

// New builds the console over api, the admin API's handler.
func New(cfg Config, logger *slog.Logger, api http.Handler) (*Console, error) {
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 8 * time.Hour
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = time.Hour
	}
	if cfg.LivePeriod <= 0 {
		cfg.LivePeriod = 2 * time.Second
	}
	if cfg.Tokens == nil {
		cfg.Tokens = func() *auth.AdminTokens { return nil }
	}
	c := &Console{cfg: cfg, logger: logger, api: api, mux: http.NewServeMux(), liveSlots: make(chan struct{}, maxLive)}
	c.liveOverviewHub.c = c
	c.streams, c.stopStreams = context.WithCancel(context.Background())
	var err error
	if c.anon, err = newAnonKey(); err != nil {
		return nil, err
	}
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	if c.assets, err = loadAssets(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	c.mux.HandleFunc("GET /ui/assets/{file}", c.serveAsset)
	c.mux.HandleFunc("GET /ui/signin", c.signInPage)
	c.mux.HandleFunc("POST /ui/signin", c.signIn)
	c.mux.HandleFunc("POST /ui/signout", c.signOut)

	c.page("GET /ui/{$}", c.overview)
	c.page("GET /ui/sidecars", c.sidecars)
	c.page("GET /ui/policies", c.policies)
	c.page("GET /ui/policies/{name}", c.policy)
	c.page("GET /ui/policies/{name}/revert", c.revertConfirm)
	c.action("POST /ui/policies/{name}/revert", c.revert)
	c.page("GET /ui/rollouts", c.rollouts)
	c.page("GET /ui/rollouts/{id}", c.rollout)
	c.page("GET /ui/rollouts/{id}/{action}", c.rolloutConfirm)
	c.action("POST /ui/rollouts/{id}/{action}", c.rolloutAction)
	c.page("GET /ui/drift", c.drift)
	c.page("GET /ui/reload", c.reload)
	c.page("GET /ui/sources", c.sources)
	c.page("GET /ui/events", c.events)
	c.live("GET /ui/live/overview", c.liveOverview)
	c.live("GET /ui/live/events", c.liveEvents)
	c.mux.HandleFunc("/ui/", c.notFound)
}

// CloseStreams ends every live view, so that a graceful HTTP shutdown does
// not wait for them.
func (c *Console) CloseStreams() { c.stopStreams() }

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No inline script or style anywhere: the pages load console.css and
	// console.js from 'self' only.
	h.Set("Content-Security-Policy", "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	if r.URL.Path == "/ui" {
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
		return
	}
	defer func() {
		if p := recover(); p != nil {
			c.logger.Error("console handler panic", "path", r.URL.Path, "panic", p)
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	}()
	c.mux.ServeHTTP(w, r)
}

// view is what every page template gets.
type view struct {
	Title   string
	Nav     string
	S       *session
	NodeID  string
	Flash   string
	Problem string
	Data    any
}

// pageFunc renders one page's data, or an error for the error page.
type pageFunc func(r *http.Request, s *session, api *adminclient.Client) (tmpl, title string, data any, err error)

// page registers a signed-in page.
func (c *Console) page(pattern string, fn pageFunc) {
	c.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s, ok := c.session(w, r)
		if !ok {
			http.Redirect(w, r, "/ui/signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		tmpl, title, data, err := fn(r, s, c.client(s))
		if err != nil {
			c.renderError(w, r, s, err)
			return
		}
		c.render(w, http.StatusOK, tmpl, view{Title: title, Nav: navOf(tmpl), S: s, NodeID: c.cfg.NodeID,
			Flash: s.flashOf(r), Data: data})
	})
}

// actionFunc does one state-changing request and returns where to go next.
type actionFunc func(r *http.Request, s *session, api *adminclient.Client) (redirect string, err error)

// action registers a state-changing form. The console checks the session
// and its CSRF token; the API checks the role (a read token's POST gets
// the API's 403) and audits the change under the token's name.
func (c *Console) action(pattern string, fn actionFunc) {
	c.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		s, ok := c.session(w, r)
		if !ok {
			c.render(w, http.StatusUnauthorized, "signin", view{Title: "Sign in", NodeID: c.cfg.NodeID,
				Problem: "Sign in to do that.", Data: "/ui/"})
			return
		}
		if !sameOrigin(r) || !checkCSRF(r, s) {
			c.logger.Warn("console: request refused without a valid CSRF token", "path", r.URL.Path, "token", s.Token.Name)
			c.renderError(w, r, s, errForbidden)
			return
		}
		to, err := fn(r, s, c.client(s))
		if err != nil {
			c.renderError(w, r, s, err)
			return
		}
		http.Redirect(w, r, to, http.StatusSeeOther)
	})
}

var errForbidden = errors.New("refused: the form's CSRF token is missing or wrong, or the request came from another site; reload the page and try again")

// client is an admin API client acting as s, in process.
func (c *Console) client(s *session) *adminclient.Client {
	cl, err := adminclient.New(adminclient.Config{
		Servers:    []string{"http://console.invalid"},
		HTTPClient: &http.Client{Transport: identityTransport{inProcess{api: c.api}, s}},
		UserAgent:  "policyd-console",
	})
	if err != nil {
		panic(err) // the one server URL above is constant and valid
	}
	return cl
}

// identityTransport puts the session's identity in each request's context,
// so the API authorizes and audits the signed-in token.
type identityTransport struct {
	next http.RoundTripper
	s    *session
}

func (t identityTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if !t.s.AuthOff {
		ctx = auth.WithToken(ctx, t.s.Token)
	} else if t.s.tls != nil {
		ctx = withTLS(ctx, t.s.tls)
	}
	// A RoundTripper must not change the request it is given.
	req = req.Clone(ctx)
	if t.s.requestID != "" {
		req.Header.Set("X-Request-ID", t.s.requestID)
	}
	return t.next.RoundTrip(req)
}

// render executes a page into a buffer first, so a template error is a
// clean 500 instead of half a page.
func (c *Console) render(w http.ResponseWriter, status int, tmpl string, v view) {
	t, ok := c.pages[tmpl]
	if !ok {
		c.logger.Error("console: no template", "template", tmpl)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		c.logger.Error("console: render", "template", tmpl, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// renderError shows an API error on the error page with the API's status.
func (c *Console) renderError(w http.ResponseWriter, r *http.Request, s *session, err error) {
	status, msg := http.StatusBadGateway, err.Error()
	var ae *adminclient.Error
	switch {
	case errors.As(err, &ae):
		status, msg = ae.Status, ae.Message
	case errors.Is(err, errNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errBadRequest):
		status = http.StatusBadRequest
	case errors.Is(err, errForbidden):
		status = http.StatusForbidden
	case errors.Is(err, adminclient.ErrUnavailable):
		status = http.StatusServiceUnavailable
	}
	if status == http.StatusUnauthorized {
		http.Redirect(w, r, "/ui/signin?expired=1", http.StatusSeeOther)
		return
	}
	c.render(w, status, "error", view{Title: http.StatusText(status), S: s, NodeID: c.cfg.NodeID,
		Problem: msg, Data: status})
}

var (
	errNotFound   = errors.New("not found")
	errBadRequest = errors.New("bad request")
)

func badRequestf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	s, _ := c.session(w, r)
	c.renderError(w, r, s, fmt.Errorf("%w: no page at %s", errNotFound, r.URL.Path))
}

// navOf names the menu entry a template belongs to.
func navOf(tmpl string) string {
	switch tmpl {
	case "policy", "revert":
		return "policies"
	case "rollout", "rollout_action":
		return "rollouts"
	}
	return tmpl
}

// parsePages parses each page with the layout into its own set, so page
// templates may all define "content".
func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/fragments.html")
	if err != nil {
		return nil, fmt.Errorf("console templates: %w", err)
	}
	files, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console templates: %w", err)
	}
	pages := make(map[string]*template.Template)
	for _, f := range files {
		name := f[len("templates/") : len(f)-len(".html")]
		if name == "layout" || name == "fragments" {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(templateFS, f)
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", f, err)
		}
		pages[name] = t
	}
	return pages, nil
}
