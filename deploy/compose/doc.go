// Package compose holds a docker-compose deployment of policyd (three nodes
// and a `policyd watch` sidecar on a private network; docker-compose.yml and
// node<n>.yaml in this directory) and, in its test, the end-to-end scenario
// run against it with the real image: writes reach the sidecar, the cluster
// survives losing its leader, and a node cut off from the network catches up
// once it is back.
//
// The test needs a Docker engine and docker-compose (v1) or the docker
// compose plugin (v2); it skips, saying why, when `docker info` fails.
package compose
