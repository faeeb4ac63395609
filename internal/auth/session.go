package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
)

// SessionKey signs the console's sessions of one admin token. It is derived
// from the token alone, so every node holding the same tokens file verifies
// a session another node issued, and removing the token ends its sessions.
type SessionKey struct {
	// ID names the token in a session without revealing it.
	ID  string
	key []byte
}

// Sign returns the MAC of msg under the key.
func (k SessionKey) Sign(msg []byte) []byte {
	m := hmac.New(sha256.New, k.key)
	m.Write(msg)
	return m.Sum(nil)
}

// derive returns the purpose-bound HMAC of a token's digest.
func derive(digest [sha256.Size]byte, purpose string) []byte {
	m := hmac.New(sha256.New, digest[:])
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

func sessionKey(digest [sha256.Size]byte) SessionKey {
	return SessionKey{ID: hex.EncodeToString(derive(digest, "policyd console session id")[:12]),
		key: derive(digest, "policyd console session key")}
}

// NewSessionKey is the session key of a secret that is not an admin token
// (the console's own, when auth is off).
func NewSessionKey(secret []byte) SessionKey { return sessionKey(sha256.Sum256(secret)) }

// SignIn checks a pasted token (no "Bearer " prefix) and returns its
// identity and session key; ErrBadCredentials when it is not known.
func (t *AdminTokens) SignIn(secret string) (Token, SessionKey, error) {
	tok, err := t.Authorize("Bearer "+secret, RoleRead)
	if err != nil {
		return Token{}, SessionKey{}, err
	}
	return tok, sessionKey(sha256.Sum256([]byte(secret))), nil
}

// Session finds the token whose session key has id; false when no token
// of the current set has it (the token was removed or rotated).
func (t *AdminTokens) Session(id string) (Token, SessionKey, bool) {
	if t == nil {
		return Token{}, SessionKey{}, false
	}
	for _, e := range t.entries {
		k := sessionKey(e.digest)
		if subtle.ConstantTimeCompare([]byte(k.ID), []byte(id)) == 1 {
			return e.token, k, true
		}
	}
	return Token{}, SessionKey{}, false
}

type tokenKey struct{}

// WithToken returns ctx carrying an identity already authenticated in
// process (the console's session), which the admin API then uses instead
// of an Authorization header. Remote callers cannot set a context.
func WithToken(ctx context.Context, t Token) context.Context {
	return context.WithValue(ctx, tokenKey{}, t)
}

// TokenFrom returns the identity WithToken put in ctx.
func TokenFrom(ctx context.Context) (Token, bool) {
	t, ok := ctx.Value(tokenKey{}).(Token)
	return t, ok
}
