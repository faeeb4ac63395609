// Package authz holds examples of deploying `policyd authz` (envoy.yaml, an
// Envoy bootstrap; istio.yaml, an Istio extension provider and
// AuthorizationPolicy; pod.yaml, a Deployment with the sidecar) and, in its
// tests, checks that each file decodes strictly into its schema and points
// at the ports and settings docs/authz.md describes.
package authz
