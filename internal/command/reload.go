package command

import (
	"strings"
	"time"
	"unicode/utf8"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/store"
)

// Reload types (docs/operations.md): the leader's reload controller records
// its hash cache, its pending-restart queue and the outcome of every restart
// attempt. Ignorable: the state is the controller's memory, rebuilt from
// Kubernetes, so a node of an older version that skips them at worst
// restarts a Deployment once more when it leads later; stopping instead
// would take the old replicas down as soon as an upgraded leader with
// reload enabled starts.
const (
	TypeReloadObserve       = IgnoreUnknown | 8
	TypeReloadRestarted     = IgnoreUnknown | 9
	TypeReloadRestartFailed = IgnoreUnknown | 10
)

// ActorReload is the actor of the reload controller (restarts, hash cache).
const ActorReload = "task:reload"

// Bounds on reload commands. They only keep a buggy or hostile proposer from
// writing entries that every replica would have to store; the controller
// stays far below them.
const (
	// MaxReloadObservations is the most ConfigMaps one observe command
	// carries; the controller splits a larger list.
	MaxReloadObservations = 1000
	// MaxReloadDeployments bounds the Deployments named by one restart.
	MaxReloadDeployments = 1000
	// MaxReloadError is the longest error text recorded; longer ones are
	// cut by the builder.
	MaxReloadError = 1024
	MaxReloadShort = 256 // hashes, reasons, Deployment names
)

// ReloadObserve builds the command that records ConfigMap hashes and,
// atomically with them, the restarts they call for.
func ReloadObserve(obs []store.ReloadObservation) (*Command, error) {
	c := &commandv1.ReloadObserve{}
	for _, o := range obs {
		c.Observations = append(c.Observations, &commandv1.ReloadObservation{
			Scope: o.Scope, Configmap: o.ConfigMap, Hash: o.Hash,
			Schedule: o.Schedule, DueUnixNano: unixNano(o.DueAt), Reason: o.Reason,
		})
	}
	return New(c)
}

// ReloadRestarted builds the command that records a completed restart of the
// pending entry scheduled at pendingIndex.
func ReloadRestarted(pendingIndex uint64, r store.ReloadRestart) (*Command, error) {
	return New(&commandv1.ReloadRestarted{
		Scope: r.Scope, Configmap: r.ConfigMap, Hash: r.Hash, PendingIndex: pendingIndex,
		Patched: r.Patched, Skipped: r.Skipped, RestartedAtUnixNano: unixNano(r.RestartedAt),
		Attempts: r.Attempts, Reason: r.Reason,
	})
}

// ReloadRestartFailed builds the command that records a failed attempt on
// the pending entry scheduled at pendingIndex, and its retry time.
func ReloadRestartFailed(pendingIndex uint64, e store.ReloadError) (*Command, error) {
	msg := strings.ToValidUTF8(e.Error, "\uFFFD") // proto3 strings must be UTF-8
	if len(msg) > MaxReloadError {
		cut := MaxReloadError - len("…")
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return New(&commandv1.ReloadRestartFailed{
		Scope: e.Scope, Configmap: e.ConfigMap, Hash: e.Hash, PendingIndex: pendingIndex,
		Attempts: e.Attempts, RetryAtUnixNano: unixNano(e.RetryAt), Error: msg,
		FailedAtUnixNano: unixNano(e.FailedAt),
	})
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
