// Package auth authenticates callers for every listener: bearer tokens for
// the admin REST API, and JWTs for sidecars and feed connections.
//
// It only answers "who is this and may they do that"; turning its sentinel
// errors into HTTP statuses or gRPC codes is the listener's job, done in one
// place per server. BearerToken parses the Authorization header for both.
//
// # Admin tokens
//
// AdminTokens holds static bearer tokens with a role each (read or admin),
// loaded from a file; see LoadAdminTokens.
//
// # Sidecar JWTs
//
// JWTVerifier checks a sidecar's JWT. A deployment signs either with a shared
// secret (HS256) or with key pairs (RS256 with RSA keys of at least 2048
// bits, ES256 with EC P-256 keys), never both. Each algorithm is bound to its
// key type, so a public key can never be used as an HMAC secret, and "none"
// is always refused. Public keys come from a PEM file ("PUBLIC KEY" or "RSA
// PUBLIC KEY" blocks), a JSON Web Key Set file, or both; a token with a kid
// is checked against the JWKS keys with that kid and the keys without one.
// Key files are re-read, at most once a second and only from Verify, when
// their content changes, so keys rotate without a restart; a version that
// does not parse keeps the previous keys and logs a warning. The HMAC secret
// must be at least 32 bytes; it is read at start and again by
// JWTVerifier.Reload (SIGHUP), which also re-reads the key files at once.
//
// AdminTokens is immutable; a reload loads a new set (LoadAdminTokens) and the
// listener swaps it in, so a request is checked against one whole file
// version.
//
// A token must carry exp and may carry nbf and iat, all checked with the
// configured leeway for clock skew; iss and aud are checked when configured.
// Its claims are sub (the employee ID) and org, both required, and team,
// optional. Tokens longer than MaxTokenLen are refused before decoding.
//
// The employee record, not the token, is authoritative: Identify looks the
// employee up, refuses an unknown or inactive one, refuses a token whose org
// differs from the record's, and returns the identity from the record. The
// token's team claim is not a gate: the record decides the team, so a
// sidecar whose employee moved team keeps connecting, and is served its new
// team, until its token is refreshed. An org is a tenant: a token naming the
// employee's old org is refused (and the listeners revoke the connections
// open when the org changes).
//
// # Errors
//
//   - ErrNoCredentials: no bearer token (401).
//   - ErrBadCredentials: an unknown admin token, or a JWT that fails
//     verification for any reason (401).
//   - ErrForbidden: an admin token's role is too low, or a JWT's org does
//     not match the employee record (403).
//   - ErrUnknownEmployee: a valid JWT names no employee (401).
//   - ErrInactiveEmployee: a valid JWT names an employee who is not active
//     (403).
//
// Each is returned wrapped, with context; test for them with errors.Is.
package auth
