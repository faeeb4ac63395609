// Package apierror holds the JSON error envelope every HTTP listener answers
// with (docs/api.md). It sits apart so that listeners share the envelope
// without importing each other; each listener keeps its own mapping from its
// errors to a status and a code.
package apierror

import (
	"encoding/json"
	"net/http"
)

// Codes of the envelope, the closed set docs/api.md documents.
const (
	CodeInvalid      = "invalid"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
)

// Envelope is the body of every error response: {"error": {"code",
// "message"}}, and "reason" where a client must tell one refusal apart from
// others of its code (the feed's unknown employee).
type Envelope struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Reason  string `json:"reason,omitempty"`
	} `json:"error"`
}

// New returns the envelope of code and msg.
func New(code, msg string) Envelope {
	var e Envelope
	e.Error.Code, e.Error.Message = code, msg
	return e
}

// Write answers with status and the envelope of code and msg, plus the
// headers that status calls for.
func Write(w http.ResponseWriter, status int, code, msg string) {
	WriteReason(w, status, code, "", msg)
}

// WriteReason is Write with the envelope's reason set ("" leaves it out).
func WriteReason(w http.ResponseWriter, status int, code, reason, msg string) {
	switch status {
	case http.StatusServiceUnavailable:
		// Long enough for an election to finish.
		w.Header().Set("Retry-After", "1")
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="policyd"`)
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	env := New(code, msg)
	env.Error.Reason = reason
	_ = json.NewEncoder(w).Encode(env) // the client may be gone; nothing useful to do
}
