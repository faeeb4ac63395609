package raftfsm

import (
	"fmt"
	"strings"
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

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
	if err := command.CheckKeys(what, "configmap", cm, "hash", hash); err != nil {
		return err
	}
	switch {
	case len(scope) > command.MaxKeyLen:
		return fmt.Errorf("%s: scope is %d bytes, more than %d", what, len(scope), command.MaxKeyLen)
	case strings.ContainsRune(scope, 0) || strings.ContainsRune(cm, 0):
		return fmt.Errorf("%s: scope or configmap contains NUL", what)
	case len(hash) > command.MaxReloadShort:
		return fmt.Errorf("%s: hash is %d bytes, more than %d", what, len(hash), command.MaxReloadShort)
	}
	return nil
}

func checkNames(what string, names []string) error {
	if len(names) > command.MaxReloadDeployments {
		return fmt.Errorf("%s: %d deployments, more than %d", what, len(names), command.MaxReloadDeployments)
	}
	for _, n := range names {
		if n == "" || len(n) > command.MaxReloadShort {
			return fmt.Errorf("%s: deployment name of %d bytes", what, len(n))
		}
	}
	return nil
}

func prepareReloadObserve(m store.Meta, c *commandv1.ReloadObserve) (func(*store.Batch) *commandv1.Result, error) {
	n := len(c.GetObservations())
	if n == 0 || n > command.MaxReloadObservations {
		return nil, fmt.Errorf("reload observe: %d observations, want 1 to %d", n, command.MaxReloadObservations)
	}
	obs := make([]store.ReloadObservation, 0, n)
	for i, o := range c.GetObservations() {
		what := fmt.Sprintf("reload observe [%d]", i)
		if err := checkReloadKey(what, o.GetScope(), o.GetConfigmap(), o.GetHash()); err != nil {
			return nil, err
		}
		if len(o.GetReason()) > command.MaxReloadShort {
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

func prepareReloadRestarted(m store.Meta, c *commandv1.ReloadRestarted) (func(*store.Batch) *commandv1.Result, error) {
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
	if len(c.GetReason()) > command.MaxReloadShort {
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

func prepareReloadRestartFailed(m store.Meta, c *commandv1.ReloadRestartFailed) (func(*store.Batch) *commandv1.Result, error) {
	const what = "reload restart failed"
	if err := checkReloadKey(what, c.GetScope(), c.GetConfigmap(), c.GetHash()); err != nil {
		return nil, err
	}
	if len(c.GetError()) > command.MaxReloadError {
		return nil, fmt.Errorf("%s: error text is %d bytes, more than %d", what, len(c.GetError()), command.MaxReloadError)
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
