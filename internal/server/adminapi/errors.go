package adminapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/apierror"
	"github.com/policyd/policyd/internal/sources"
	"github.com/policyd/policyd/internal/store"
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
	return &apiError{status: http.StatusBadRequest, code: apierror.CodeInvalid, msg: msg}
}

// statusOf is the one mapping from errors to HTTP status and envelope code.
func statusOf(err error) (int, string) {
	var ae *apiError
	var unavailable interface{ Unavailable() bool }
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.code
	case errors.Is(err, policy.ErrInvalid):
		return http.StatusBadRequest, apierror.CodeInvalid
	case errors.Is(err, store.ErrNotFound), errors.Is(err, sources.ErrNotConfigured):
		return http.StatusNotFound, apierror.CodeNotFound
	case errors.Is(err, sources.ErrHookRefused):
		return http.StatusUnauthorized, apierror.CodeUnauthorized
	case errors.Is(err, sources.ErrRateLimited):
		return http.StatusTooManyRequests, apierror.CodeUnavailable
	case errors.Is(err, store.ErrConflict):
		return http.StatusConflict, apierror.CodeConflict
	case errors.Is(err, auth.ErrNoCredentials), errors.Is(err, auth.ErrBadCredentials):
		return http.StatusUnauthorized, apierror.CodeUnauthorized
	case errors.Is(err, auth.ErrForbidden):
		return http.StatusForbidden, apierror.CodeForbidden
	case errors.As(err, &unavailable) && unavailable.Unavailable(),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, apierror.CodeUnavailable
	default:
		return http.StatusInternalServerError, apierror.CodeInternal
	}
}

func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code := statusOf(err)
	msg := err.Error()
	switch {
	case status == http.StatusServiceUnavailable:
		// Expected during elections and start-up (readiness probes); not
		// worth a warning per request.
		a.logger.Debug("request unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
	case status >= 500:
		a.logger.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "request_id", requestID(r), "err", err)
	}
	var ae *apiError
	if status == http.StatusInternalServerError && !errors.As(err, &ae) {
		// An error nothing above expects is this node's fault, and its
		// text can name files and addresses: the client gets the request
		// id, which the warning above is logged with.
		msg = "internal error (request id " + requestID(r) + ")"
	}
	apierror.Write(w, status, code, msg)
}
