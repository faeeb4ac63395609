package feed

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/apierror"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/utf8field"
)

// catchUpWait is how long a handshake waits for this node to catch up
// (with the client's ?since=, with the writes it acknowledged, or with the
// cluster before it refuses an identity) before it is refused with 503
// (errBehind, errNotCurrent): long enough for a follower to learn a commit,
// short enough to send the sidecar to another node soon.
const catchUpWait = 2 * time.Second

// Handshake errors beyond auth's sentinels.
var (
	// errInvalid: the request is not a usable feed handshake (400).
	errInvalid = errors.New("invalid feed request")
	// errMethod: not a GET (405).
	errMethod = errors.New("method not allowed")
	// errClosing: the node is shutting down (503).
	errClosing = errors.New("feed is shutting down")
	// errBehind: the client holds a version this node has not applied and
	// did not apply within sinceWait (503). An init from here would take
	// the sidecar back to an older set: a policy deleted since, a grant
	// revoked since, would be in force again until the node caught up.
	errBehind = errors.New("this node is behind the client's version")
	// errNotCurrent: this node could not confirm, within catchUpWait, that
	// it holds the writes it acknowledged, or the cluster's, before it
	// would refuse the identity (503). A refusal from a replica a commit
	// behind would revoke a sidecar whose employee was just created.
	errNotCurrent = errors.New("this node cannot confirm it is up to date")
)

// statusOf is the one mapping from handshake errors to the HTTP status, the
// error envelope's code and its reason ("" for none).
func statusOf(err error) (status int, code, reason string) {
	switch {
	case errors.Is(err, errInvalid):
		return http.StatusBadRequest, apierror.CodeInvalid, ""
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed, apierror.CodeInvalid, ""
	case errors.Is(err, errClosing), errors.Is(err, errBehind), errors.Is(err, errNotCurrent):
		return http.StatusServiceUnavailable, apierror.CodeUnavailable, ""
	case errors.Is(err, auth.ErrUnknownEmployee):
		// A 401 as before the reason existed, so that an older SDK still
		// stops; a newer one retries for a while (feedv1).
		return http.StatusUnauthorized, apierror.CodeUnauthorized, feedv1.ReasonUnknownEmployee
	case errors.Is(err, auth.ErrNoCredentials), errors.Is(err, auth.ErrBadCredentials):
		return http.StatusUnauthorized, apierror.CodeUnauthorized, ""
	case errors.Is(err, auth.ErrInactiveEmployee), errors.Is(err, auth.ErrForbidden):
		return http.StatusForbidden, apierror.CodeForbidden, ""
	default:
		return http.StatusInternalServerError, apierror.CodeInternal, ""
	}
}

// reject answers a handshake that is refused before the upgrade.
func (h *Hub) reject(w http.ResponseWriter, r *http.Request, err error) {
	status, code, reason := statusOf(err)
	switch status {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", http.MethodGet)
	case http.StatusInternalServerError:
		h.logger.Warn("feed handshake failed", "peer", r.RemoteAddr, "err", err)
	}
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		h.logger.Debug("feed handshake refused", "peer", r.RemoteAddr, "status", status, "err", err)
	}
	apierror.WriteReason(w, status, code, reason, err.Error())
}

// handshake is an admitted request.
type handshake struct {
	ident policy.Identity
	since uint64
	caps  policyset.Caps
	// viaSubprotocol: the token came as bearer.<jwt>.
	viaSubprotocol bool
}

// ServeHTTP upgrades GET /ws/policies. Everything that can refuse the
// connection (the request's shape, the token, the employee record) is
// checked before the upgrade, so a refusal is an HTTP status.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hs, err := h.admit(r)
	if err != nil {
		h.reject(w, r, err)
		return
	}
	hj := &hijacker{ResponseWriter: w}
	ws, err := websocket.Accept(hj, r, &websocket.AcceptOptions{
		// Selected when the client offers it, which it must when it sends
		// its token as a subprotocol: the token is never echoed.
		Subprotocols: []string{feedv1.Subprotocol},
		// No ambient credentials (cookies): every connection presents its token, so
		// a cross-site page gains nothing (docs/sidecars.md).
		InsecureSkipVerify: true,
	})
	if err != nil {
		// Accept has answered already.
		h.logger.Debug("feed upgrade failed", "peer", r.RemoteAddr, "err", err)
		return
	}
	h.serve(newConn(h, ws, hj.wire, r.RemoteAddr, hs.ident, hs.caps), hs.since)
}

// admit checks a handshake request and resolves its identity.
func (h *Hub) admit(r *http.Request) (handshake, error) {
	var hs handshake
	if h.ctx.Err() != nil {
		return hs, errClosing
	}
	req, err := parseRequest(r, h.deps.Verifier != nil)
	if err != nil {
		return hs, err
	}
	hs.since, hs.viaSubprotocol, hs.caps = req.since, req.viaSubprotocol, req.caps
	// The token is verified before anything waits; the employee record is
	// read only once this node holds the writes it acknowledged, as a
	// local read is, so that a sidecar started right after its employee
	// was created (or reactivated) through this node is not refused by a
	// replica a commit behind.
	var claims *auth.Claims
	if h.deps.Verifier != nil {
		c, err := h.deps.Verifier.Verify(req.token)
		if err != nil {
			return hs, err
		}
		claims = &c
	}
	if err := h.ownWrites(r); err != nil {
		return hs, err
	}
	if hs.ident, err = h.identify(r, claims, req.employee); err != nil {
		return hs, err
	}
	// After the token is verified, so that a bad token is a 401 whatever
	// subprotocols were offered.
	if err := checkSubprotocol(r, hs.viaSubprotocol); err != nil {
		return hs, err
	}

	if hs.since > h.deps.Store.AppliedIndex() {
		return hs, h.resumeAhead(r, &hs)
	}
	return hs, nil
}

// ownWrites waits up to catchUpWait for the local replica to hold every
// write this node has acknowledged (Deps.OwnWrites).
func (h *Hub) ownWrites(r *http.Request) error {
	if h.deps.OwnWrites == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), catchUpWait)
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	if err := h.deps.OwnWrites(ctx); err != nil {
		if h.ctx.Err() != nil {
			return errClosing
		}
		return fmt.Errorf("%w: it has not applied the writes it acknowledged within %v (%w); try another node", errNotCurrent, catchUpWait, err)
	}
	return nil
}

// identify resolves the connection's identity: from verified claims
// (auth.mode jwt) or ?employee= (none). A refusal for the record's sake
// (unknown, inactive, another org) is confirmed first: the node waits for a
// consistent read (Deps.CaughtUp) and reads the record again, so that a
// replica behind the cluster (the employee created or reactivated through
// another node) never refuses; the discovery stream reads the record after
// the same wait. This costs a read only on the refusal path.
func (h *Hub) identify(r *http.Request, claims *auth.Claims, employee string) (policy.Identity, error) {
	id, err := h.lookup(claims, employee)
	if !refusesRecord(err) || h.deps.CaughtUp == nil {
		return id, err
	}
	ctx, cancel := context.WithTimeout(r.Context(), catchUpWait)
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	if cerr := h.deps.CaughtUp(ctx); cerr != nil {
		if h.ctx.Err() != nil {
			return id, errClosing
		}
		h.logger.Info("feed handshake: cannot confirm a refusal of the employee record", "peer", r.RemoteAddr, "refusal", err, "err", cerr)
		// The refusal is text only: wrapped, it would map the answer to
		// its 401 instead of the retryable 503.
		return id, fmt.Errorf("%w (%w) before refusing the connection (%v); try another node", errNotCurrent, cerr, err) //nolint:errorlint // see above
	}
	return h.lookup(claims, employee)
}

// lookup resolves claims, or ?employee= when claims is nil, from the
// employee record as this node holds it.
func (h *Hub) lookup(claims *auth.Claims, employee string) (policy.Identity, error) {
	if claims != nil {
		return auth.Identify(*claims, h.deps.Store.FindEmployee)
	}
	return h.identifyByQuery(employee)
}

// refusesRecord reports whether err refuses a connection for what the
// employee record says (or that there is none), as against its token.
func refusesRecord(err error) bool {
	return errors.Is(err, auth.ErrUnknownEmployee) || errors.Is(err, auth.ErrInactiveEmployee) || errors.Is(err, auth.ErrForbidden)
}

// resumeAhead decides a resume from a version this node has not applied.
// Either this node lags the cluster (the client came from a node further
// ahead): it gets up to catchUpWait to catch up, and the client is then sent
// elsewhere (errBehind) rather than back in time, since an init from here
// would put back in force what was deleted after this node's state. Or the
// cluster itself never committed that version: the client's set belongs to
// a history that is gone (a restore from a backup, which starts the new
// history far above it: store.StartHistory), and init replaces it. A
// consistent read tells the two apart: once the node holds everything
// committed before the handshake, a since still ahead was never committed.
func (h *Hub) resumeAhead(r *http.Request, hs *handshake) error {
	ctx, cancel := context.WithTimeout(r.Context(), catchUpWait)
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	var err error
	if h.deps.CaughtUp != nil {
		err = h.deps.CaughtUp(ctx)
	} else {
		err = h.deps.Store.WaitApplied(ctx, hs.since)
	}
	applied := h.deps.Store.AppliedIndex()
	switch {
	case h.ctx.Err() != nil:
		return errClosing
	case err != nil && applied < hs.since:
		h.logger.Info("feed resume ahead of this node, refused", "peer", r.RemoteAddr, "since", hs.since, "applied", applied, "err", err)
		return fmt.Errorf("%w: it holds version %d, this node has applied %d and could not catch up within %v (%w); try another node",
			errBehind, hs.since, applied, catchUpWait, err)
	case applied < hs.since:
		h.logger.Warn("feed resume from a version this cluster never committed (restored from an older backup?): sending init",
			"peer", r.RemoteAddr, "since", hs.since, "applied", applied)
		hs.since = 0
	}
	return nil
}

// request is what a handshake asks for, read from the request alone.
type request struct {
	since    uint64
	caps     policyset.Caps // ?capabilities=
	employee string         // ?employee= (auth.mode none)
	token    string         // the JWT (auth.mode jwt)
	// viaSubprotocol: the token came as bearer.<jwt>.
	viaSubprotocol bool
}

// parseRequest checks the shape of a handshake request (method, upgrade
// headers, ?since=) and reads its credential: the token when withToken
// (auth.mode jwt), else ?employee=, which identifyByQuery checks. It looks
// nothing up and verifies nothing, so that the parsing of what a client
// controls can be fuzzed without a hub; admit is its only caller.
func parseRequest(r *http.Request, withToken bool) (request, error) {
	var req request
	if r.Method != http.MethodGet {
		return req, fmt.Errorf("%w: %s %s: only GET", errMethod, r.Method, r.URL.Path)
	}
	if err := checkUpgrade(r); err != nil {
		return req, err
	}
	q := r.URL.Query()
	if err := utf8field.Query(q); err != nil {
		return req, fmt.Errorf("%w: %w", errInvalid, err)
	}
	if s := q.Get(feedv1.QuerySince); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return req, fmt.Errorf("%w: %s=%q is not a version (a Raft index)", errInvalid, feedv1.QuerySince, s)
		}
		req.since = v
	}
	// Unknown values are ignored: a newer client may declare more.
	req.caps = policyset.ParseCaps(strings.Split(q.Get(feedv1.QueryCapabilities), ","))
	if !withToken {
		req.employee = q.Get(feedv1.QueryEmployee)
		return req, nil
	}
	var err error
	req.token, req.viaSubprotocol, err = requestToken(r)
	return req, err
}

// requestToken reads the JWT from "Authorization: Bearer <jwt>" or, when
// there is no Authorization header, from a bearer.<jwt> subprotocol.
func requestToken(r *http.Request) (token string, viaSubprotocol bool, err error) {
	if hdr := r.Header.Get("Authorization"); hdr != "" {
		t, err := auth.BearerToken(hdr)
		if err != nil {
			return "", false, err
		}
		return t, false, nil
	}
	for _, p := range headerTokens(r.Header, "Sec-WebSocket-Protocol") {
		if len(p) > len(feedv1.SubprotocolPrefix) && strings.EqualFold(p[:len(feedv1.SubprotocolPrefix)], feedv1.SubprotocolPrefix) {
			return p[len(feedv1.SubprotocolPrefix):], true, nil
		}
	}
	return "", false, fmt.Errorf("%w: send Authorization: Bearer <jwt>, or the subprotocol %s<jwt>",
		auth.ErrNoCredentials, feedv1.SubprotocolPrefix)
}

// checkSubprotocol refuses a token sent as bearer.<jwt> without the feed's
// subprotocol offered: the server would have nothing to select but the
// token, and must never echo it.
func checkSubprotocol(r *http.Request, viaSubprotocol bool) error {
	if viaSubprotocol && !offersSubprotocol(r, feedv1.Subprotocol) {
		return fmt.Errorf("%w: a token sent as the %s<jwt> subprotocol needs the %q subprotocol offered too",
			errInvalid, feedv1.SubprotocolPrefix, feedv1.Subprotocol)
	}
	return nil
}

// identifyByQuery resolves ?employee= (auth.mode none, local development).
func (h *Hub) identifyByQuery(id string) (policy.Identity, error) {
	if id == "" {
		return policy.Identity{}, fmt.Errorf("%w: auth.mode is none: name the employee with ?%s=<id>",
			auth.ErrNoCredentials, feedv1.QueryEmployee)
	}
	emp, err := h.deps.Store.FindEmployee(id)
	switch {
	case err != nil:
		return policy.Identity{}, fmt.Errorf("look up employee %q: %w", id, err)
	case emp == nil:
		return policy.Identity{}, fmt.Errorf("employee %q: %w", id, auth.ErrUnknownEmployee)
	case !emp.Active():
		return policy.Identity{}, fmt.Errorf("employee %q has status %q: %w", id, emp.Status, auth.ErrInactiveEmployee)
	}
	return emp.Identity(), nil
}

// checkUpgrade refuses requests that are not a WebSocket handshake the
// library would accept, so that they get the error envelope too.
func checkUpgrade(r *http.Request) error {
	switch {
	case !r.ProtoAtLeast(1, 1):
		return fmt.Errorf("%w: a WebSocket handshake needs HTTP/1.1, not %s", errInvalid, r.Proto)
	case !hasToken(r.Header, "Connection", "upgrade") || !hasToken(r.Header, "Upgrade", "websocket"):
		return fmt.Errorf("%w: %s is a WebSocket endpoint: send a WebSocket upgrade request", errInvalid, feedv1.Path)
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return fmt.Errorf("%w: Sec-WebSocket-Version %q is not supported, only 13", errInvalid, r.Header.Get("Sec-WebSocket-Version"))
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return fmt.Errorf("%w: want exactly one Sec-WebSocket-Key", errInvalid)
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
		return fmt.Errorf("%w: Sec-WebSocket-Key is not 16 base64-encoded bytes", errInvalid)
	}
	return nil
}

func offersSubprotocol(r *http.Request, want string) bool {
	return hasToken(r.Header, "Sec-WebSocket-Protocol", want)
}

func hasToken(h http.Header, key, token string) bool {
	for _, t := range headerTokens(h, key) {
		if strings.EqualFold(t, token) {
			return true
		}
	}
	return false
}

// headerTokens splits every value of a comma-separated header.
func headerTokens(h http.Header, key string) []string {
	var out []string
	for _, v := range h[textproto.CanonicalMIMEHeaderKey(key)] {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}

// serve sets up an upgraded connection and returns: from then on the
// connection runs on short-lived goroutines (see conn).
func (h *Hub) serve(c *conn, since uint64) {
	mode, ident, ok := h.attach(c, since)
	if !ok {
		// The hub closed during the handshake.
		c.closeWith(websocket.StatusGoingAway, "server shutting down", nil)
		c.finish()
		return
	}
	h.logger.Info("feed connection opened", "conn", c.addr, "employee", ident.Employee,
		"org", ident.Org, "team", ident.Team, "since", since, "sync", mode)
	if c.start(h.connPoller()) {
		// The first messages (or the close) are written on this
		// goroutine, which exists already.
		c.drain()
	}
}

// detach removes an ended connection from the hub.
func (h *Hub) detach(c *conn) {
	h.mu.Lock()
	h.unindexLocked(c)
	delete(h.live, c)
	ident := c.ident
	h.mu.Unlock()
	h.metrics.connections.Dec()
	h.logger.Info("feed connection closed", "conn", c.addr, "employee", ident.Employee,
		"org", ident.Org, "code", int(c.closeCode), "reason", c.closeReason,
		"duration", time.Since(c.connectedAt).Round(time.Millisecond))
	h.wg.Done()
}
