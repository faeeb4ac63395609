// Package reload is the ConfigMap reload controller (docs/operations.md).
// It runs on the Raft leader only: the server starts Run when the node
// becomes leader and cancels it, waiting for it to return, when leadership is
// lost, so two terms of the loop never overlap on one node.
//
// # Behaviour
//
// It lists the ConfigMaps matching reload.selector in reload.namespace, then
// watches them from the list's resourceVersion. Each ConfigMap's data hash
// (DataHash) is cached per (scope value, ConfigMap name), the scope value
// being the ConfigMap's reload.scope_label label; a ConfigMap without that
// label is ignored, since it names no Deployments. An ADDED event with no
// cached hash only seeds the cache; ADDED or MODIFIED with a different hash
// schedules a restart; DELETED, and edits of labels or annotations only, do
// nothing. A restart patches the pod template of every Deployment matching
// reload.selector plus <scope_label>=<scope value> with
// <prefix>/restartedAt (RFC 3339) and <prefix>/config-hash-<cm>, skipping
// Deployments that already carry the hash (HashAnnotation shortens names
// past the 63-character annotation limit).
//
// Debounce is trailing: a change is restarted reload.debounce after the last
// change of the same key, so several changes inside the window coalesce into
// one restart, the later ones pushing the due time forward. With debounce 0
// a change restarts at once. A failed attempt is retried after 1s, 2s, 4s, …
// capped at 30s; a fresh change resets the attempts.
//
// Watch errors: 410 Gone (etcd compacted past our resourceVersion) relists
// and schedules a restart for every hash that changed meanwhile; other
// errors back off (1s to 30s, jittered, reset by a successful watch) and
// retry; 401 and 403 on list or watch stop the controller until the next
// leadership term, with Status and the configmap_reload_stopped metric
// saying why. The daemon keeps serving. A 403 on a patch is not fatal: it
// is a failed attempt, retried.
//
// Startup reconciliation (each term, after the first list): for every
// Deployment of a ConfigMap's scope, a config-hash annotation that differs
// from the ConfigMap's hash restarts the scope; a restartedAt annotation
// without a hash annotation (written by an older version) triggers one
// repair restart, which records the hash; a Deployment with neither is left
// alone, its baseline being unknown.
//
// # State through Raft (the deliberate deviation from the seed)
//
// The hash cache and the pending-restart queue, with due times and attempt
// counts, are store state written through Raft commands (raftfsm
// ReloadObserve, ReloadRestarted, ReloadRestartFailed). A new hash and the
// restart it calls for are one command, so no leader ever sees one without
// the other. A new leader therefore carries on where the previous one
// stopped: it does not seed from scratch (no restart storm), a restart still
// pending in the debounce window runs at its due time, and a change the old
// leader never recorded shows up as a cache mismatch on the new leader's
// list. The seed's "force pending restarts before stop" and its dropped
// restarts are not needed: configmap_reload_dropped_restarts_total exists
// for dashboards and stays 0. A restart interrupted between its patches and
// its record is redone by the next leader, and the hash check skips the
// Deployments already patched, so each is patched once.
//
// All times the commands carry (due times, restart times) come from the
// leader's wall clock; a new leader's clock decides when inherited restarts
// are due, so clock skew between nodes shifts them by that skew.
//
// Commands are proposed on the local node only, never forwarded: a
// controller whose term has ended cannot record anything through the next
// leader. A partitioned old leader that has not noticed yet steps down
// within raft.leader_lease_timeout; until then it may patch a Deployment the
// new leader patches too: at worst a second rollout of the same data.
//
// # Why a raw list and watch, not an informer
//
// The seed's loop is a list then a watch whose failures each have a
// specified reaction: 410 relists with restart-on-change, 401/403 stops the
// controller, other errors back off from 1s to 30s, and every one of them is
// counted (watch errors, reconnects). A client-go informer hides exactly
// those: its reflector relists on 410 by itself and replays the whole list
// as updates, retries 401/403 for ever with its own backoff, and exposes the
// rest only through a watch-error handler. The controller also needs no
// object cache beyond the hashes, which live in Raft. So it uses the typed
// clientset's List and Watch directly, in one goroutine per leadership term.
// Deployments are read with a List at restart time rather than from an
// informer: restarts are rare, and the skip-if-already-patched check must
// see the current annotations, not a cache that may trail a patch.
//
// # RBAC
//
// In reload.namespace the controller's identity needs:
//
//   - apiGroups: [""]
//     resources: ["configmaps"]
//     verbs: ["get", "list", "watch"]
//   - apiGroups: ["apps"]
//     resources: ["deployments"]
//     verbs: ["get", "list", "patch"]
package reload
