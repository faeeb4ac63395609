// Package compose holds a docker-compose deployment of policyd (three nodes,
// a one-shot "seed" that creates the demo employee, and a `policyd watch`
// sidecar on a private network) and, in its tests, checks of those files and
// the end-to-end scenario run against them with the real image: writes reach
// the sidecar, a sidecar without a token is refused, the cluster survives
// losing its leader, and a node cut off catches up. The demo secrets in
// demo-secrets/ are public. The scenario skips, saying why, when
// `docker info` fails. See docs/operations.md and docs/security.md.
package compose
