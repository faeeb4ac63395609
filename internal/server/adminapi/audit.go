package adminapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/policyd/policyd/internal/command"
)

// RequestIDHeader carries a request's id both ways: a sane incoming value
// (printable ASCII, at most 128 bytes) is kept, else one is generated, and
// every response returns it.
const RequestIDHeader = "X-Request-Id"

type ctxKey int

const (
	ctxRequestID ctxKey = iota
	ctxActor
	ctxRole // the caller's auth.Role; admin when auth is off
)

// withRequestID sets the request's id on the response and in its context.
func withRequestID(w http.ResponseWriter, r *http.Request) *http.Request {
	id := r.Header.Get(RequestIDHeader)
	if !command.ValidRequestID(id) {
		id = newRequestID()
	}
	w.Header().Set(RequestIDHeader, id)
	return r.WithContext(context.WithValue(r.Context(), ctxRequestID, id))
}

// newRequestID is 16 random bytes in hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

// requestID is the id withRequestID gave r.
func requestID(r *http.Request) string {
	id, _ := r.Context().Value(ctxRequestID).(string)
	return id
}

// actorOf names who is making an authenticated request: the admin token
// that authorized it ("token:NAME"), else the verified client certificate's
// subject ("cert:SUBJECT"), else "anonymous" (an open API).
func actorOf(r *http.Request, tokenName string) string {
	switch {
	case tokenName != "":
		return "token:" + tokenName
	case r.TLS != nil && len(r.TLS.PeerCertificates) > 0:
		return "cert:" + r.TLS.PeerCertificates[0].Subject.String()
	}
	return "anonymous"
}

// actor is the actor route put in r's context.
func actor(r *http.Request) string {
	a, _ := r.Context().Value(ctxActor).(string)
	return a
}
