package adminapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/policyd/policyd/auth"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/store"
)

// apiError is an error with an explicit status, for request problems the
// handlers find themselves.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(msg string) error {
	return &apiError{status: http.StatusBadRequest, code: "invalid", msg: msg}
}

// Envelope is the body of every error response policyd's HTTP listener
// sends: {"error": {"code", "message"}} (DESIGN part 9).
type Envelope struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func errorBody(code, msg string) Envelope {
	var e Envelope
	e.Error.Code, e.Error.Message = code, msg
	return e
}

// WriteError answers with status and the error envelope, plus the headers
// that status calls for. The admin API and the WebSocket feed's refused
// handshakes both answer through it.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	switch status {
	case http.StatusServiceUnavailable:
		// Long enough for an election to finish.
		w.Header().Set("Retry-After", "1")
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="policyd"`)
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, errorBody(code, msg))
}

// statusOf is the one mapping from errors to HTTP status and envelope code.
func statusOf(err error) (int, string) {
	var ae *apiError
	var unavailable interface{ Unavailable() bool }
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.code
	case errors.Is(err, policy.ErrInvalid):
		return http.StatusBadRequest, "invalid"
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, store.ErrConflict):
		return http.StatusConflict, "conflict"
	case errors.Is(err, auth.ErrNoCredentials), errors.Is(err, auth.ErrBadCredentials):
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, auth.ErrForbidden):
		return http.StatusForbidden, "forbidden"
	case errors.As(err, &unavailable) && unavailable.Unavailable(),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, "unavailable"
	default:
		return http.StatusInternalServerError, "internal"
	}
}

func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code := statusOf(err)
	switch {
	case status == http.StatusServiceUnavailable:
		// Expected during elections and start-up (readiness probes); not
		// worth a warning per request.
		a.logger.Debug("request unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
	case status >= 500:
		a.logger.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	WriteError(w, status, code, err.Error())
}
