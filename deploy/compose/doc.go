// Package compose holds a docker-compose deployment of policyd (three nodes,
// a one-shot "seed" that creates the demo employee, and a `policyd watch`
// sidecar on a private network; docker-compose.yml and node<n>.yaml in this
// directory) and, in its tests, checks of those files and the end-to-end
// scenario run against them with the real image: writes reach the sidecar,
// a sidecar without a token is refused, the cluster survives losing its
// leader, and a node cut off from the network catches up once it is back.
//
// Authenticated by default, with demo secrets:
//   - the peer plane with the cluster secret (cluster.secret_file) from
//     demo-secrets/cluster-secret;
//   - sidecars with HS256 JWTs (auth.mode: jwt) signed with
//     demo-secrets/jwt-hmac-secret; the watch sidecar presents
//     demo-secrets/sidecar.jwt, and mint-token.sh mints others;
//   - the admin API is open (auth.allow_open_admin) but published on
//     127.0.0.1 only.
//
// The demo secrets are in git, hence public: demo-secrets/README.md says so
// and how to replace them. They are files rather than generated at start so
// that the demo needs nothing but Docker, and so that the tests can check
// the token against the key. docs/security.md covers rotation.
//
// The scenario needs a Docker engine and docker-compose (v1) or the docker
// compose plugin (v2); it skips, saying why, when `docker info` fails.
package compose
