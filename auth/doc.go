// Package auth authenticates callers for every listener: bearer tokens for
// the admin REST API now, and JWT verification for sidecars later.
//
// It only answers "who is this and may they do that"; turning its sentinel
// errors into HTTP statuses or gRPC codes is the listener's job, done in one
// place per server.
package auth
