// Package adminapi is the admin REST API: policies, employees, the event
// log (list and Server-Sent Events), cluster status and membership, staged
// rollouts (rollouts.go), health, readiness, metrics and, for the admin
// role, the Go runtime profiles (/debug/pprof/). Every route declares the
// role it needs; every error is apierror's JSON envelope, produced by
// writeError, the one place where errors become HTTP statuses. It reads and
// writes through its Backend and holds no state of its own. See docs/api.md.
package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/apierror"
	"github.com/policyd/policyd/internal/store"
	"github.com/policyd/policyd/internal/tlsfiles"
	"github.com/policyd/policyd/internal/utf8field"
)

// MaxBodyBytes caps every request body.
const MaxBodyBytes = 1 << 20

// Backend is the node the API serves. server.Node implements it.
type Backend interface {
	// Store is the local replica, read directly for local reads.
	Store() *store.Store
	// Validator checks policies and employees before they are proposed.
	Validator() *policy.Validator
	// Propose commits a command through the leader. Errors with an
	// Unavailable() bool method mean "retry later" (503).
	Propose(ctx context.Context, cmd *command.Command) (*commandv1.Result, error)
	// ConsistentRead returns once the local replica holds every write
	// acknowledged before the call.
	ConsistentRead(ctx context.Context) error
	// ReadOwnWrites returns once the local replica holds every write this
	// node has acknowledged, or ctx's error.
	ReadOwnWrites(ctx context.Context) error
	// Join and Remove change Raft membership through the leader.
	Join(ctx context.Context, id, raftAddr string) (uint64, error)
	Remove(ctx context.Context, id string) (uint64, error)
	// Status describes the cluster as this node sees it.
	Status(ctx context.Context) (*ClusterStatus, error)
	// Ready is nil when a leader is known and this node has applied the
	// leader's commit index as of the call; its errors are Unavailable.
	Ready(ctx context.Context) error
	clientsLister
	reloadStatuser
	shadowCounter
	sourcer
	decisionReader
	impactRunner
}

// ClusterStatus is GET /v1/cluster.
type ClusterStatus struct {
	NodeID string `json:"node_id"`
	// ClusterID names the cluster; "" until its first
	// leader has named it.
	ClusterID    string `json:"cluster_id"`
	State        string `json:"state"`
	LeaderID     string `json:"leader_id"`
	LeaderAddr   string `json:"leader_raft_addr"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	LastIndex    uint64 `json:"last_index"`
	AppliedIndex uint64 `json:"applied_index"`
	LastContact  string `json:"last_contact,omitempty"`
	Digest       string `json:"digest"`
	// CommandVersion is the Raft command encoding writes use: the newest
	// that every registered member reads. Below the release's own during a
	// rolling upgrade, until every node runs the new release.
	CommandVersion uint32         `json:"command_version"`
	Members        []MemberStatus `json:"members"`
}

// MemberStatus is one server in the Raft configuration, with the addresses it
// registered.
type MemberStatus struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
	GRPCAddr string `json:"grpc_addr"`
	Suffrage string `json:"suffrage"`
	Leader   bool   `json:"leader"`
	// CommandVersion is the newest command encoding the member registered
	// it reads; 0 for a node of a release before command versions.
	CommandVersion uint32 `json:"command_version"`
}

// Config configures the API.
type Config struct {
	// Tokens authenticates requests; nil leaves the API open (the config
	// refuses that on a non-loopback address unless explicitly allowed).
	Tokens *auth.AdminTokens
	// Registry receives the HTTP metrics and is served at /metrics.
	Registry *prometheus.Registry
}

// API is the admin HTTP handler.
type API struct {
	cfg     Config
	logger  *slog.Logger
	b       Backend
	mux     *http.ServeMux
	streams context.Context
	stop    context.CancelFunc
	// tokens is cfg.Tokens, swapped by SetTokens on SIGHUP.
	tokens atomic.Pointer[auth.AdminTokens]

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	routes   []Route
	// rolloutAlias logs GET /v1/rollout's deprecation once.
	rolloutAlias sync.Once
	// impactSlot holds the one impact replay this node runs at a time.
	impactSlot chan struct{}
}

// Route is one registered endpoint: its ServeMux pattern ("GET /v1/x") and
// the admin token role it needs (negative: open, no token needed).
type Route struct {
	Pattern string
	Role    auth.Role
}

// Routes lists every registered endpoint in registration order, so tests can
// walk the whole API (an endpoint added without a test entry fails them).
func (a *API) Routes() []Route { return append([]Route(nil), a.routes...) }

// New builds the API over b.
func New(cfg Config, logger *slog.Logger, b Backend) *API {
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	a := &API{cfg: cfg, logger: logger, b: b, mux: http.NewServeMux(), impactSlot: make(chan struct{}, 1)}
	a.tokens.Store(cfg.Tokens)
	a.streams, a.stop = context.WithCancel(context.Background())
	a.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "policyd", Name: "http_requests_total", Help: "Admin API requests by route, method and status code.",
	}, []string{"route", "method", "code"})
	a.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "policyd", Name: "http_request_duration_seconds", Help: "Admin API request latency by route.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"route", "method"})
	cfg.Registry.MustRegister(a.requests, a.latency)

	const open = auth.Role(-1)
	a.route("GET /livez", open, a.livez)
	a.route("GET /healthz", open, a.livez) // an alias of /livez, kept for existing probes
	a.route("GET /readyz", open, a.readyz)
	a.route("GET /metrics", auth.RoleRead, a.metrics)

	policies, employees := a.policies(), a.employees()
	a.route("GET /v1/policies", auth.RoleRead, a.listPolicies)
	a.route("GET /v1/policies/{name}", auth.RoleRead, policies.getHandler(a))
	a.route("PUT /v1/policies/{name}", auth.RoleAdmin, policies.putHandler(a))
	a.route("DELETE /v1/policies/{name}", auth.RoleAdmin, policies.deleteHandler(a))
	a.route("GET /v1/policies/{name}/history", auth.RoleRead, policies.historyHandler(a))
	a.route("GET /v1/policies/{name}/revisions/{rev}", auth.RoleRead, policies.revisionHandler(a))
	a.route("POST /v1/policies/{name}/revert", auth.RoleAdmin, policies.revertHandler(a))
	a.routeShadow()
	a.routeDecisions()
	a.routeImpact()

	a.route("GET /v1/employees", auth.RoleRead, a.listEmployees)
	a.route("GET /v1/employees/{id}", auth.RoleRead, employees.getHandler(a))
	a.route("PUT /v1/employees/{id}", auth.RoleAdmin, employees.putHandler(a))
	a.route("DELETE /v1/employees/{id}", auth.RoleAdmin, employees.deleteHandler(a))
	a.route("GET /v1/employees/{id}/history", auth.RoleRead, employees.historyHandler(a))
	a.route("GET /v1/employees/{id}/revisions/{rev}", auth.RoleRead, employees.revisionHandler(a))
	a.route("POST /v1/employees/{id}/revert", auth.RoleAdmin, employees.revertHandler(a))

	a.route("GET /v1/events", auth.RoleRead, a.listEvents)
	a.route("GET /v1/events/watch", auth.RoleRead, a.watchEvents)

	a.route("GET /v1/cluster", auth.RoleRead, a.clusterStatus)
	a.route("POST /v1/cluster/join", auth.RoleAdmin, a.clusterJoin)
	a.route("DELETE /v1/cluster/members/{id}", auth.RoleAdmin, a.clusterRemove)
	a.route("POST /v1/cluster/transfer-leader", auth.RoleAdmin, a.transferLeader)
	a.route("GET /v1/version", auth.RoleRead, a.version)
	a.route("GET /v1/snapshot", auth.RoleAdmin, a.snapshot)

	a.route("GET /v1/clients", auth.RoleRead, a.listClients)
	a.route("GET /v1/proxy-status", auth.RoleRead, a.proxyStatus)
	a.route("GET /v1/rollout", auth.RoleRead, a.deprecatedRollout)
	a.routeRollouts()
	a.route("GET /v1/reload", auth.RoleRead, a.reloadState)
	a.route("GET /v1/drift", auth.RoleRead, a.listDrift)
	a.routeSources()
	a.routePprof()

	a.mux.HandleFunc("/", a.noRoute)
	return a
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mux.ServeHTTP(w, withRequestID(w, r))
}

// CloseStreams ends every long-lived response (event watches), so that a
// graceful HTTP shutdown does not wait for them.
func (a *API) CloseStreams() { a.stop() }

// SetTokens replaces the admin token set (a reloaded tokens file); requests
// that start after it returns are checked against t. A nil t opens the API,
// like a nil Config.Tokens.
func (a *API) SetTokens(t *auth.AdminTokens) { a.tokens.Store(t) }

// Tokens returns the admin token set in force (nil: auth is off).
func (a *API) Tokens() *auth.AdminTokens { return a.tokens.Load() }

// handlerFunc returns an error instead of writing one, so the status mapping
// lives in writeError alone.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// route registers h at pattern, behind auth (unless need is negative), the
// body limit, panic recovery and metrics.
func (a *API) route(pattern string, need auth.Role, h handlerFunc) {
	method, path, _ := strings.Cut(pattern, " ")
	params := pathParams(path)
	a.routes = append(a.routes, Route{Pattern: pattern, Role: need})
	a.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				a.logger.Error("handler panic", "route", pattern, "panic", p)
				if sw.status == 0 {
					a.writeError(sw, r, fmt.Errorf("internal error"))
				}
			}
			a.requests.WithLabelValues(path, method, strconv.Itoa(sw.code())).Inc()
			a.latency.WithLabelValues(path, method).Observe(time.Since(start).Seconds())
		}()
		// A node certificate from the cluster CA opens the peer plane
		// only (docs/security.md): it gets no admin role.
		if need >= 0 && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && tlsfiles.IsNodeCertificate(r.TLS.PeerCertificates[0]) {
			a.writeError(sw, r, fmt.Errorf("a node certificate is for the peer plane, not the admin API: %w", auth.ErrForbidden))
			return
		}
		var tokenName string
		role := auth.RoleAdmin // auth off: everything is open
		if tok, ok := auth.TokenFrom(r.Context()); ok && need >= 0 {
			// The console authenticated its session in process.
			if err := tok.Allows(need); err != nil {
				a.writeError(sw, r, err)
				return
			}
			tokenName, role = tok.Name, tok.Role
		} else if tokens := a.tokens.Load(); need >= 0 && tokens != nil {
			tok, err := tokens.Authorize(r.Header.Get("Authorization"), need)
			if err != nil {
				a.writeError(sw, r, err)
				return
			}
			tokenName, role = tok.Name, tok.Role
		}
		ctx := context.WithValue(r.Context(), ctxActor, actorOf(r, tokenName))
		r = r.WithContext(context.WithValue(ctx, ctxRole, role))
		if err := checkText(r, params); err != nil {
			a.writeError(sw, r, err)
			return
		}
		r.Body = http.MaxBytesReader(sw, r.Body, MaxBodyBytes)
		if err := h(sw, r); err != nil {
			a.writeError(sw, r, err)
		}
	})
}

// pathParams lists the wildcards of a route's path ("{name}", "{rest...}").
func pathParams(path string) []string {
	var names []string
	for seg := range strings.SplitSeq(path, "/") {
		if name, ok := strings.CutPrefix(seg, "{"); ok {
			names = append(names, strings.TrimSuffix(strings.TrimSuffix(name, "}"), "..."))
		}
	}
	return names
}

// checkText refuses a request whose path parameters or query parameters
// are not valid UTF-8 (the body is checked by readBody).
func checkText(r *http.Request, params []string) error {
	for _, p := range params {
		if !utf8.ValidString(r.PathValue(p)) {
			return badRequest(fmt.Sprintf("path parameter %s is not valid UTF-8", p))
		}
	}
	if err := utf8field.Query(r.URL.Query()); err != nil {
		return badRequest(err.Error())
	}
	return nil
}

// noRoute answers every unmatched request: 405 with Allow when the path
// exists for other methods, else 404, both in the error envelope; 400 for
// a path that is not valid UTF-8.
func (a *API) noRoute(w http.ResponseWriter, r *http.Request) {
	if !utf8.ValidString(r.URL.Path) {
		writeJSON(w, http.StatusBadRequest, apierror.New(apierror.CodeInvalid, "the path is not valid UTF-8"))
		return
	}
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, p := a.mux.Handler(probe); p != "/" && p != "" {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, apierror.New(apierror.CodeInvalid, fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed, ", "))))
		return
	}
	writeJSON(w, http.StatusNotFound, apierror.New(apierror.CodeNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)))
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Flush lets Server-Sent Events through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeRawJSON answers with raw, already-encoded JSON, ended by a newline
// as writeJSON's encoder ends its output.
func writeRawJSON(w http.ResponseWriter, status int, raw []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// Two writes into the response's buffer: raw may be shared, so it is
	// not appended to. The client may be gone; nothing useful to do.
	_, _ = w.Write(raw)
	_, _ = w.Write([]byte{'\n'})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // the client may be gone; nothing useful to do
}

// readBody reads the (size-limited) request body.
func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: apierror.CodeInvalid,
				msg: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
		}
		return nil, fmt.Errorf("read request body: %w", err)
	}
	if len(b) == 0 {
		return nil, badRequest("body: empty; a JSON object is required")
	}
	if err := utf8field.JSON(b); err != nil {
		return nil, badRequest("body: " + err.Error())
	}
	return b, nil
}

// ifMatch parses an If-Match header: absent → nil; a revision number, bare
// or quoted as our ETags are.
func ifMatch(r *http.Request) (*uint64, error) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" {
		return nil, nil
	}
	v, err := strconv.ParseUint(strings.Trim(h, `"`), 10, 64)
	if err != nil {
		return nil, badRequest(fmt.Sprintf("If-Match: %q is not a revision number (0 means: must not exist)", h))
	}
	return &v, nil
}

// queryBool parses a boolean query parameter strictly.
func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest(fmt.Sprintf("%s: %q is not a boolean", name, v))
	}
	return b, nil
}

func queryUint(r *http.Request, name string) (uint64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, badRequest(fmt.Sprintf("%s: %q is not a non-negative integer", name, v))
	}
	return n, nil
}

// maybeConsistent waits for a linearizable read point when ?consistent=true.
func (a *API) maybeConsistent(r *http.Request) error {
	c, err := queryBool(r, "consistent")
	if err != nil {
		return err
	}
	if c {
		return a.b.ConsistentRead(r.Context())
	}
	return a.readOwnWrites(r.Context())
}

// readOwnWrites waits until the local replica holds every write this node
// has acknowledged (Backend.ReadOwnWrites). A write is answered as soon as
// the leader commits and applies it; this node applies it when it learns of
// the commit, within a raft.commit_timeout. A local read never answers with
// less than the client (or any other client of this node) was told was
// written. A node that cannot catch up (cut off after answering) refuses
// with 503 rather than answer from before the write.
func (a *API) readOwnWrites(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readOwnWritesWait)
	defer cancel()
	if err := a.b.ReadOwnWrites(ctx); err != nil {
		return &unavailableError{fmt.Sprintf("this node has not applied a write it acknowledged: %v; retry, or use ?consistent=true", err)}
	}
	return nil
}

// readOwnWritesWait bounds readOwnWrites: far longer than a commit timeout,
// short enough to fail a read rather than hang it.
const readOwnWritesWait = 5 * time.Second

type unavailableError struct{ msg string }

func (e *unavailableError) Error() string     { return e.msg }
func (e *unavailableError) Unavailable() bool { return true }

func (a *API) livez(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func (a *API) readyz(w http.ResponseWriter, r *http.Request) error {
	if err := a.b.Ready(r.Context()); err != nil {
		return err
	}
	// The applied index lets a console show how far each member is.
	writeJSON(w, http.StatusOK, struct {
		Status       string `json:"status"`
		AppliedIndex uint64 `json:"applied_index"`
	}{"ready", a.b.Store().AppliedIndex()})
	return nil
}

func (a *API) metrics(w http.ResponseWriter, r *http.Request) error {
	promhttp.HandlerFor(a.cfg.Registry, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	return nil
}
