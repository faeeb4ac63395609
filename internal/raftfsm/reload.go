package raftfsm

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/store"
)

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
	maxReloadShort = 256 // hashes, reasons, Deployment names
)

// ReloadObserve builds the command that records ConfigMap hashes and,
// atomically with them, the restarts they call for.
func ReloadObserve(obs []store.ReloadObservation) (*commandv1.Command, error) {
	c := &commandv1.ReloadObserve{}
	for _, o := range obs {
		c.Observations = append(c.Observations, &commandv1.ReloadObservation{
			Scope: o.Scope, Configmap: o.ConfigMap, Hash: o.Hash,
			Schedule: o.Schedule, DueUnixNano: unixNano(o.DueAt), Reason: o.Reason,
		})
	}
	return NewCommand(TypeReloadObserve, c)
}

// ReloadRestarted builds the command that records a completed restart of the
// pending entry scheduled at pendingIndex.
func ReloadRestarted(pendingIndex uint64, r store.ReloadRestart) (*commandv1.Command, error) {
	return NewCommand(TypeReloadRestarted, &commandv1.ReloadRestarted{
		Scope: r.Scope, Configmap: r.ConfigMap, Hash: r.Hash, PendingIndex: pendingIndex,
		Patched: r.Patched, Skipped: r.Skipped, RestartedAtUnixNano: unixNano(r.RestartedAt),
		Attempts: r.Attempts, Reason: r.Reason,
	})
}

// ReloadRestartFailed builds the command that records a failed attempt on
// the pending entry scheduled at pendingIndex, and its retry time.
func ReloadRestartFailed(pendingIndex uint64, e store.ReloadError) (*commandv1.Command, error) {
	msg := strings.ToValidUTF8(e.Error, "\uFFFD") // proto3 strings must be UTF-8
	if len(msg) > MaxReloadError {
		cut := MaxReloadError - len("…")
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return NewCommand(TypeReloadRestartFailed, &commandv1.ReloadRestartFailed{
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

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// checkReloadKey validates a (scope, ConfigMap) key. The scope may be empty
// (a label can have an empty value); neither may hold the NUL that
// separates them in the store's keys.
func checkReloadKey(what, scope, cm, hash string) error {
	if err := checkKeys(what, "configmap", cm, "hash", hash); err != nil {
		return err
	}
	switch {
	case len(scope) > MaxKeyLen:
		return fmt.Errorf("%s: scope is %d bytes, more than %d", what, len(scope), MaxKeyLen)
	case strings.ContainsRune(scope, 0) || strings.ContainsRune(cm, 0):
		return fmt.Errorf("%s: scope or configmap contains NUL", what)
	case len(hash) > maxReloadShort:
		return fmt.Errorf("%s: hash is %d bytes, more than %d", what, len(hash), maxReloadShort)
	}
	return nil
}

func checkNames(what string, names []string) error {
	if len(names) > MaxReloadDeployments {
		return fmt.Errorf("%s: %d deployments, more than %d", what, len(names), MaxReloadDeployments)
	}
	for _, n := range names {
		if n == "" || len(n) > maxReloadShort {
			return fmt.Errorf("%s: deployment name of %d bytes", what, len(n))
		}
	}
	return nil
}

func decodeReloadObserve(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.ReloadObserve
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	n := len(c.GetObservations())
	if n == 0 || n > MaxReloadObservations {
		return nil, fmt.Errorf("reload observe: %d observations, want 1 to %d", n, MaxReloadObservations)
	}
	obs := make([]store.ReloadObservation, 0, n)
	for i, o := range c.GetObservations() {
		what := fmt.Sprintf("reload observe [%d]", i)
		if err := checkReloadKey(what, o.GetScope(), o.GetConfigmap(), o.GetHash()); err != nil {
			return nil, err
		}
		if len(o.GetReason()) > maxReloadShort {
			return nil, fmt.Errorf("%s: reason is %d bytes", what, len(o.GetReason()))
		}
		if o.GetSchedule() && o.GetDueUnixNano() <= 0 {
			return nil, fmt.Errorf("%s: a scheduled restart needs a due time", what)
		}
		obs = append(obs, store.ReloadObservation{
			ReloadKey: store.ReloadKey{Scope: o.GetScope(), ConfigMap: o.GetConfigmap()},
			Hash:      o.GetHash(), Schedule: o.GetSchedule(), DueAt: fromUnixNano(o.GetDueUnixNano()), Reason: o.GetReason(),
		})
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.ObserveReload(m, obs))
	}, nil
}

func decodeReloadRestarted(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.ReloadRestarted
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	const what = "reload restarted"
	if err := checkReloadKey(what, c.GetScope(), c.GetConfigmap(), c.GetHash()); err != nil {
		return nil, err
	}
	if err := checkNames(what, c.GetPatched()); err != nil {
		return nil, err
	}
	if err := checkNames(what, c.GetSkipped()); err != nil {
		return nil, err
	}
	if len(c.GetReason()) > maxReloadShort {
		return nil, fmt.Errorf("%s: reason is %d bytes", what, len(c.GetReason()))
	}
	r := store.ReloadRestart{
		ReloadKey: store.ReloadKey{Scope: c.GetScope(), ConfigMap: c.GetConfigmap()},
		Hash:      c.GetHash(), Patched: c.GetPatched(), Skipped: c.GetSkipped(),
		Attempts: c.GetAttempts(), Reason: c.GetReason(), RestartedAt: fromUnixNano(c.GetRestartedAtUnixNano()),
	}
	if r.Patched == nil {
		r.Patched = []string{}
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.RecordReloadRestart(m, c.GetPendingIndex(), r))
	}, nil
}

func decodeReloadRestartFailed(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.ReloadRestartFailed
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	const what = "reload restart failed"
	if err := checkReloadKey(what, c.GetScope(), c.GetConfigmap(), c.GetHash()); err != nil {
		return nil, err
	}
	if len(c.GetError()) > MaxReloadError {
		return nil, fmt.Errorf("%s: error text is %d bytes, more than %d", what, len(c.GetError()), MaxReloadError)
	}
	e := store.ReloadError{
		ReloadKey: store.ReloadKey{Scope: c.GetScope(), ConfigMap: c.GetConfigmap()},
		Hash:      c.GetHash(), Attempts: c.GetAttempts(), Error: c.GetError(),
		RetryAt: fromUnixNano(c.GetRetryAtUnixNano()), FailedAt: fromUnixNano(c.GetFailedAtUnixNano()),
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.RecordReloadError(m, c.GetPendingIndex(), e))
	}, nil
}
