// Package feed is the WebSocket policy feed, GET /ws/policies on the HTTP
// listener: it authenticates each connection before the upgrade and pushes
// it the policies that apply to its identity as they are committed, resumes
// with ?since=, serves staged-rollout candidates, revokes employees, and
// keeps idle connections cheap (one epoll poller on Linux). It owns the
// hub of connections and their send queues; the wire types are api/feed/v1,
// the policy index internal/server/policyset. Errors become HTTP statuses in
// one place, statusOf. See docs/sidecars.md.
package feed
