// Package auth authenticates callers for every listener: bearer tokens for
// the admin REST API (AdminTokens), and JWTs for sidecars and feed
// connections (JWTVerifier, then Identify against the employee record).
// It only answers "who is this and may they do that"; turning its sentinel
// errors (ErrNoCredentials, ErrBadCredentials, ErrForbidden,
// ErrUnknownEmployee, ErrInactiveEmployee; test with errors.Is) into HTTP
// statuses or gRPC codes is the listener's job. BearerToken parses the
// Authorization header for both. The token rules are in docs/security.md.
package auth
