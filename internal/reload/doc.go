// Package reload is the ConfigMap reload controller: on the Raft leader
// only, it lists and watches the ConfigMaps of reload.selector and, when
// one's data changes, patches the pod template of the Deployments of its
// scope so that they restart. The server starts Run when the node becomes
// leader and cancels it, waiting for it to return, when leadership is lost,
// so two terms never overlap on one node. Its hash cache and pending
// restarts are store state written through Raft commands, so a new leader
// carries on; the package keeps no state of its own. The rules, RBAC and
// metrics are in docs/operations.md.
package reload
