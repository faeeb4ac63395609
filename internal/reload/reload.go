package reload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/store"
)

// State is what the controller needs from its node: the replicated reload
// state and a way to change it.
type State interface {
	// ReloadState reads the reload state from the local replica.
	ReloadState() (*store.ReloadState, error)
	// Apply commits cmd through Raft from this node, which must be the
	// leader (it never forwards: a deposed leader must not write), and
	// returns once the local replica has applied it. A business error in
	// the result is returned as an error.
	Apply(ctx context.Context, cmd *command.Command) error
}

// Deps are the controller's collaborators.
type Deps struct {
	Kube  kubernetes.Interface
	State State
	// Registry receives the controller's metrics; nil makes a private one.
	Registry prometheus.Registerer
}

// Status states.
const (
	StateRunning   = "running"
	StateStopped   = "stopped"
	StateNotLeader = "not_leader"
	StateDisabled  = "disabled"
)

// Status is the controller's state as GET /v1/reload shows it.
type Status struct {
	// State is running, stopped (by a fatal API error, see Reason),
	// not_leader or disabled.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Synced is true once this term's list, cache update and startup
	// reconciliation are done and the watch is (re)opening.
	Synced          bool      `json:"synced"`
	ResourceVersion string    `json:"resource_version,omitempty"`
	Since           time.Time `json:"since"`
	Namespace       string    `json:"namespace"`
	Selector        string    `json:"selector"`
	ScopeLabel      string    `json:"scope_label"`
	Debounce        string    `json:"debounce"`
}

// Backoff bounds: watch and list errors, and failed restart attempts.
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// Restart reasons recorded with pending restarts.
const (
	reasonChange = "change"
	reasonRelist = "relist"
	reasonMissed = "missed-change"
	fieldManager = "policyd-reload"
	observeChunk = command.MaxReloadObservations
	maxWatchWait = 10 * time.Minute
	minWatchWait = 5 * time.Minute
	maxReasonLen = 512
)

// Controller is the reload controller. Run it once per leadership term.
type Controller struct {
	cfg      config.Reload
	logger   *slog.Logger
	kube     kubernetes.Interface
	state    State
	now      func() time.Time
	m        *metrics
	selector labels.Selector

	statusMu sync.Mutex
	status   Status

	// Per term, touched only by Run's goroutine.
	hashes  map[store.ReloadKey]string
	pending map[store.ReloadKey]store.ReloadPending
}

// New builds a controller; it does not contact the API server.
func New(cfg config.Reload, logger *slog.Logger, deps Deps) (*Controller, error) {
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("reload.selector %q: %w", cfg.Selector, err)
	}
	if deps.Kube == nil || deps.State == nil {
		return nil, errors.New("reload: a Kubernetes client and a State are required")
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	m, err := newMetrics(deps.Registry, cfg.Namespace, cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("reload metrics: %w", err)
	}
	c := &Controller{cfg: cfg, logger: logger, kube: deps.Kube, state: deps.State, now: time.Now, m: m, selector: sel}
	c.status = Status{
		State: StateNotLeader, Since: c.now().UTC(), Namespace: cfg.Namespace, Selector: cfg.Selector,
		ScopeLabel: cfg.ScopeLabel, Debounce: cfg.Debounce.String(),
	}
	return c, nil
}

// Status returns the controller's current status.
func (c *Controller) Status() Status {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	return c.status
}

func (c *Controller) setStatus(f func(s *Status)) {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	f(&c.status)
}

// errFatal marks 401/403 on list or watch: the controller's credentials or
// RBAC are wrong, and retrying would only hammer the API server.
type errFatal struct {
	reason string
	err    error
}

func (e *errFatal) Error() string { return e.err.Error() }
func (e *errFatal) Unwrap() error { return e.err }

func fatal(err error) error {
	switch {
	case apierrors.IsUnauthorized(err):
		return &errFatal{reason: reasonUnauthorized, err: err}
	case apierrors.IsForbidden(err):
		return &errFatal{reason: reasonForbidden, err: err}
	}
	return err
}

// errGone means the watch's resourceVersion was compacted away: relist.
var errGone = errors.New("resource version too old")

// Run runs the controller for one leadership term, until ctx ends. A
// 401/403 stops the controller but not Run, which reports the stop until
// the term ends. waited is how long this node waited to lead (the
// acquire-latency metric); 0 when unknown.
func (c *Controller) Run(ctx context.Context, waited time.Duration) {
	c.m.leaderTransitions.WithLabelValues("acquired").Inc()
	c.m.leaderState.Set(1)
	if waited > 0 {
		c.m.acquireLatency.Observe(waited.Seconds())
	}
	c.m.setStopped("")
	c.setStatus(func(s *Status) {
		s.State, s.Reason, s.Synced, s.ResourceVersion, s.Since = StateRunning, "", false, "", c.now().UTC()
	})
	c.logger.Info("reload controller started", "namespace", c.cfg.Namespace, "selector", c.cfg.Selector, "debounce", c.cfg.Debounce)
	err := c.run(ctx)
	var f *errFatal
	if errors.As(err, &f) {
		c.m.setStopped(f.reason)
		c.setStatus(func(s *Status) {
			s.State, s.Reason, s.Synced, s.Since = StateStopped, f.reason+": "+truncate(f.Error(), maxReasonLen), false, c.now().UTC()
		})
		c.logger.Error("reload controller stopped: the API server refused its credentials; fix its RBAC or kubeconfig, it starts again with the next leadership term",
			"reason", f.reason, "err", f.err)
		// Still the leader: stay stopped, and say so, until the term ends.
		<-ctx.Done()
	}
	c.m.leaderTransitions.WithLabelValues("lost").Inc()
	c.m.leaderState.Set(0)
	c.m.pending.Set(0)
	c.m.setStopped("")
	c.setStatus(func(s *Status) { s.State, s.Reason, s.Synced, s.Since = StateNotLeader, "", false, c.now().UTC() })
	c.logger.Info("reload controller stopped", "cause", context.Cause(ctx))
}

// run is the list-watch loop. It returns nil when ctx ends, or a fatal
// error.
func (c *Controller) run(ctx context.Context) error {
	b := backoff.New(minBackoff, maxBackoff, true)
	rv, err := c.syncWithRetry(ctx, b, true)
	if err != nil || ctx.Err() != nil {
		return err
	}
	connected := false
	for {
		err := c.drain(ctx)
		if err == nil {
			var w watch.Interface
			w, err = c.kube.CoreV1().ConfigMaps(c.cfg.Namespace).Watch(ctx, metav1.ListOptions{
				LabelSelector: c.cfg.Selector, ResourceVersion: rv, AllowWatchBookmarks: true,
				TimeoutSeconds: ptr(int64((minWatchWait + rand.N(maxWatchWait-minWatchWait)).Seconds())),
			})
			if err == nil {
				if connected {
					c.m.watchReconnects.Inc()
				}
				connected = true
				b.Reset()
				opened := time.Now()
				rv, err = c.consume(ctx, w, rv)
				w.Stop()
				// A stream that ends at once, again and again (a broken
				// connection, a proxy), must not become a busy loop.
				if err == nil && time.Since(opened) < minBackoff && !backoff.Sleep(ctx, minBackoff) {
					return nil
				}
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err == nil:
			// The server ended the stream (its timeout): watch again.
			continue
		case isGone(err):
			c.m.watchErrors.Inc()
			c.logger.Info("watch resourceVersion compacted away; relisting", "resource_version", rv)
		case errors.Is(err, errState):
			// A change may have been seen but not recorded, or a restart
			// not recorded: pause, then relist so that every hash is
			// compared again.
			d := b.Next()
			c.logger.Warn("reload state unavailable; relisting", "err", err, "backoff", d)
			if !backoff.Sleep(ctx, d) {
				return nil
			}
		default:
			if err = fatal(err); isFatal(err) {
				return err
			}
			c.m.watchErrors.Inc()
			d := b.Next()
			c.logger.Warn("configmap watch failed; retrying", "err", err, "backoff", d)
			if !backoff.Sleep(ctx, d) {
				return nil
			}
			continue
		}
		if rv, err = c.syncWithRetry(ctx, b, false); err != nil || ctx.Err() != nil {
			return err
		}
	}
}

func isFatal(err error) bool {
	var f *errFatal
	return errors.As(err, &f)
}

func isGone(err error) bool {
	return errors.Is(err, errGone) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// errState marks a failure to read or write the replicated state (Raft
// unavailable, leadership being lost).
var errState = errors.New("reload state")

// syncWithRetry lists and syncs until it succeeds, backing off between
// transient failures. startup selects the term's first sync (missed changes
// are restarted at once, then startup reconciliation) over a relist (changes
// are debounced like watched ones).
func (c *Controller) syncWithRetry(ctx context.Context, b *backoff.Backoff, startup bool) (string, error) {
	for {
		rv, err := c.sync(ctx, startup)
		if err == nil {
			b.Reset()
			c.setStatus(func(s *Status) { s.Synced, s.ResourceVersion = true, rv })
			return rv, nil
		}
		if ctx.Err() != nil {
			return "", nil
		}
		if err = fatal(err); isFatal(err) {
			return "", err
		}
		c.m.watchErrors.Inc()
		d := b.Next()
		c.logger.Warn("configmap list failed; retrying", "err", err, "backoff", d)
		if !backoff.Sleep(ctx, d) {
			return "", nil
		}
	}
}

// refresh reloads the term's view of the replicated state.
func (c *Controller) refresh() error {
	st, err := c.state.ReloadState()
	if err != nil {
		return fmt.Errorf("%w: read: %w", errState, err)
	}
	c.hashes = make(map[store.ReloadKey]string, len(st.Hashes))
	for _, h := range st.Hashes {
		c.hashes[h.ReloadKey] = h.Hash
	}
	c.pending = make(map[store.ReloadKey]store.ReloadPending, len(st.Pending))
	for _, p := range st.Pending {
		c.pending[p.ReloadKey] = p
	}
	c.m.pending.Set(float64(len(c.pending)))
	return nil
}

// apply commits cmd (buildErr is its builder's error) and refreshes the
// view, also after a failure: the command may or may not have been applied.
func (c *Controller) apply(ctx context.Context, cmd *command.Command, buildErr error) error {
	err := buildErr
	if err == nil {
		err = c.state.Apply(ctx, cmd)
	}
	if rerr := c.refresh(); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil && !errors.Is(err, errState) {
		err = fmt.Errorf("%w: %w", errState, err)
	}
	return err
}

// sync lists the ConfigMaps and records every hash that is new or changed.
// A changed hash schedules a restart: at once at a term's start (the change
// happened while no controller was watching), after the debounce on a
// relist. At a term's start it then runs startup reconciliation. It returns
// the list's resourceVersion.
func (c *Controller) sync(ctx context.Context, startup bool) (string, error) {
	if err := c.refresh(); err != nil {
		return "", err
	}
	list, err := c.kube.CoreV1().ConfigMaps(c.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: c.cfg.Selector})
	if err != nil {
		return "", fmt.Errorf("list configmaps in %s: %w", c.cfg.Namespace, err)
	}
	now := c.now()
	obs := map[store.ReloadKey]*store.ReloadObservation{}
	current := map[store.ReloadKey]string{}
	for i := range list.Items {
		cm := &list.Items[i]
		k, ok := c.key(cm)
		if !ok {
			continue
		}
		h := DataHash(cm)
		current[k] = h
		cached, known := c.hashes[k]
		switch {
		case !known:
			obs[k] = &store.ReloadObservation{ReloadKey: k, Hash: h}
		case cached != h && startup:
			obs[k] = &store.ReloadObservation{ReloadKey: k, Hash: h, Schedule: true, DueAt: now, Reason: reasonMissed}
		case cached != h:
			obs[k] = c.change(k, h, now, reasonRelist)
		}
	}
	if startup {
		if err := c.reconcileStartup(ctx, current, obs, now); err != nil {
			return "", err
		}
	}
	keys := make([]store.ReloadKey, 0, len(obs))
	for k := range obs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for chunk := range slices.Chunk(keys, observeChunk) {
		batch := make([]store.ReloadObservation, 0, len(chunk))
		for _, k := range chunk {
			batch = append(batch, *obs[k])
		}
		cmd, err := command.ReloadObserve(batch)
		if err := c.apply(ctx, cmd, err); err != nil {
			return "", err
		}
	}
	for _, o := range obs {
		c.logObservation(o)
	}
	return list.ResourceVersion, nil
}

// reconcileStartup adds a restart to obs for every scope with a Deployment
// whose hash annotation is stale, or that has only the legacy restart
// annotation, unless one is already pending or scheduled.
func (c *Controller) reconcileStartup(ctx context.Context, current map[store.ReloadKey]string, obs map[store.ReloadKey]*store.ReloadObservation, now time.Time) error {
	if len(current) == 0 {
		return nil
	}
	deps, err := c.kube.AppsV1().Deployments(c.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: c.cfg.Selector})
	if err != nil {
		return fmt.Errorf("list deployments in %s for startup reconciliation: %w", c.cfg.Namespace, err)
	}
	for k, h := range current {
		if _, ok := c.pending[k]; ok {
			continue
		}
		if o := obs[k]; o != nil && o.Schedule {
			continue
		}
		action := inSync
		var which string
		for i := range deps.Items {
			d := &deps.Items[i]
			if v, ok := d.Labels[c.cfg.ScopeLabel]; !ok || v != k.Scope {
				continue
			}
			if a := reconcileAction(d.Spec.Template.Annotations, c.cfg.AnnotationPrefix, k.ConfigMap, h); a == drifted || a == legacyRepair && action != drifted {
				action, which = a, d.Name
			}
		}
		if action == inSync {
			continue
		}
		c.logger.Info("startup reconciliation: restarting scope", "scope", k.Scope, "configmap", k.ConfigMap, "reason", action, "deployment", which)
		obs[k] = &store.ReloadObservation{ReloadKey: k, Hash: h, Schedule: true, DueAt: now, Reason: action.String()}
	}
	return nil
}

func (c *Controller) logObservation(o *store.ReloadObservation) {
	switch {
	case o.Schedule:
		c.logger.Info("configmap changed; restart scheduled", "scope", o.Scope, "configmap", o.ConfigMap,
			"hash", o.Hash, "due", o.DueAt.UTC().Format(time.RFC3339Nano), "reason", o.Reason)
	default:
		c.logger.Debug("configmap hash seeded", "scope", o.Scope, "configmap", o.ConfigMap, "hash", o.Hash)
	}
}

// key is cm's (scope value, name); false when cm has no scope label.
func (c *Controller) key(cm *corev1.ConfigMap) (store.ReloadKey, bool) {
	scope, ok := cm.Labels[c.cfg.ScopeLabel]
	if !ok {
		c.logger.Debug("ignoring configmap without the scope label", "configmap", cm.Name, "scope_label", c.cfg.ScopeLabel)
		return store.ReloadKey{}, false
	}
	c.m.seedScope(scope)
	return store.ReloadKey{Scope: scope, ConfigMap: cm.Name}, true
}

// change is the observation for a changed hash: a restart due after the
// debounce, replacing (and so pushing forward) any pending one.
func (c *Controller) change(k store.ReloadKey, h string, now time.Time, reason string) *store.ReloadObservation {
	if c.cfg.Debounce > 0 {
		c.m.debounced.WithLabelValues(k.Scope).Inc()
	}
	return &store.ReloadObservation{ReloadKey: k, Hash: h, Schedule: true, DueAt: now.Add(c.cfg.Debounce), Reason: reason}
}

// consume handles watch events and due restarts until the stream ends
// (nil), an error event arrives, or ctx ends. It returns the last
// resourceVersion seen.
func (c *Controller) consume(ctx context.Context, w watch.Interface, rv string) (string, error) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.resetTimer(timer)
		select {
		case <-ctx.Done():
			return rv, nil
		case <-timer.C:
			if err := c.drain(ctx); err != nil {
				return rv, err
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, nil
			}
			if ev.Type == watch.Error {
				return rv, watchError(ev.Object)
			}
			if obj, err := meta.Accessor(ev.Object); err == nil && obj.GetResourceVersion() != "" {
				rv = obj.GetResourceVersion()
				c.setStatus(func(s *Status) { s.ResourceVersion = rv })
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue // DELETED: pods keep running with what they have; BOOKMARK: rv only
			}
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			if err := c.observe(ctx, cm); err != nil {
				return rv, err
			}
			if err := c.drain(ctx); err != nil {
				return rv, err
			}
		}
	}
}

// watchError turns a watch ERROR event into an error; 410 becomes errGone.
func watchError(obj any) error {
	st, ok := obj.(*metav1.Status)
	if !ok {
		return fmt.Errorf("configmap watch: error event %T", obj)
	}
	if st.Code == http.StatusGone || st.Reason == metav1.StatusReasonExpired || st.Reason == metav1.StatusReasonGone {
		return fmt.Errorf("configmap watch: %s: %w", st.Message, errGone)
	}
	return fmt.Errorf("configmap watch: %w", &apierrors.StatusError{ErrStatus: *st})
}

// observe handles one ADDED or MODIFIED ConfigMap.
func (c *Controller) observe(ctx context.Context, cm *corev1.ConfigMap) error {
	k, ok := c.key(cm)
	if !ok {
		return nil
	}
	h := DataHash(cm)
	cached, known := c.hashes[k]
	var o *store.ReloadObservation
	switch {
	case !known:
		// Initial replay or a new ConfigMap: the baseline, no restart.
		o = &store.ReloadObservation{ReloadKey: k, Hash: h}
	case cached == h:
		c.logger.Debug("ignoring unchanged data", "scope", k.Scope, "configmap", k.ConfigMap)
		return nil
	default:
		o = c.change(k, h, c.now(), reasonChange)
	}
	cmd, err := command.ReloadObserve([]store.ReloadObservation{*o})
	if err := c.apply(ctx, cmd, err); err != nil {
		return err
	}
	c.logObservation(o)
	return nil
}

// resetTimer arms t for the earliest pending restart, or an hour from now.
func (c *Controller) resetTimer(t *time.Timer) {
	d := time.Hour
	for _, p := range c.pending {
		d = min(d, p.DueAt.Sub(c.now()))
	}
	t.Reset(max(d, 0))
}

// drain runs every pending restart that is due, earliest first. An error
// means an outcome could not be recorded: the entry stays pending and is
// redone (skipping what was already patched) after the caller backs off.
func (c *Controller) drain(ctx context.Context) error {
	now := c.now()
	var due []store.ReloadPending
	for _, p := range c.pending {
		if !p.DueAt.After(now) {
			due = append(due, p)
		}
	}
	sort.Slice(due, func(i, j int) bool { return due[i].DueAt.Before(due[j].DueAt) })
	for _, p := range due {
		if ctx.Err() != nil {
			return nil
		}
		if err := c.restart(ctx, p); err != nil {
			return fmt.Errorf("record restart of %s: %w", p.ReloadKey, err)
		}
	}
	return nil
}

// restart performs one attempt of a pending restart and records its
// outcome through Raft.
func (c *Controller) restart(ctx context.Context, p store.ReloadPending) error {
	patched, skipped, failed, err := c.patchScope(ctx, p)
	now := c.now()
	if err == nil {
		c.m.restarts.WithLabelValues(p.Scope).Add(float64(len(patched)))
		c.logger.Info("restarted deployments", "scope", p.Scope, "configmap", p.ConfigMap, "hash", p.Hash,
			"patched", patched, "skipped", skipped, "attempts", p.Attempts, "reason", p.Reason)
		cmd, err := command.ReloadRestarted(p.Index, store.ReloadRestart{
			ReloadKey: p.ReloadKey, Hash: p.Hash, Patched: patched, Skipped: skipped,
			Attempts: p.Attempts, Reason: p.Reason, RestartedAt: now,
		})
		return c.apply(ctx, cmd, err)
	}
	if ctx.Err() != nil {
		return nil // the term ended mid-attempt; the next leader redoes it
	}
	attempts := p.Attempts + 1
	retryAt := now.Add(backoff.Exp(attempts, minBackoff, maxBackoff))
	c.m.errors.WithLabelValues(p.Scope).Add(float64(max(failed, 1)))
	c.m.retries.WithLabelValues(p.Scope).Inc()
	c.logger.Warn("restart failed; retrying", "scope", p.Scope, "configmap", p.ConfigMap, "attempts", attempts,
		"retry_at", retryAt.UTC().Format(time.RFC3339Nano), "err", err)
	cmd, err := command.ReloadRestartFailed(p.Index, store.ReloadError{
		ReloadKey: p.ReloadKey, Hash: p.Hash, Attempts: attempts, Error: err.Error(), RetryAt: retryAt, FailedAt: now,
	})
	return c.apply(ctx, cmd, err)
}

// patchScope patches every Deployment of p's scope that does not already
// carry p's hash. An attempt is complete only if none failed.
func (c *Controller) patchScope(ctx context.Context, p store.ReloadPending) (patched, skipped []string, failed int, err error) {
	sel := c.selector.Add(mustRequirement(c.cfg.ScopeLabel, p.Scope))
	deps := c.kube.AppsV1().Deployments(c.cfg.Namespace)
	list, err := deps.List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("list deployments %s in %s: %w", sel, c.cfg.Namespace, err)
	}
	hashKey := HashAnnotation(c.cfg.AnnotationPrefix, p.ConfigMap)
	body, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{
			RestartedAtAnnotation(c.cfg.AnnotationPrefix): c.now().UTC().Format(time.RFC3339),
			hashKey: p.Hash,
		},
	}}}})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("encode restart patch: %w", err)
	}
	patched, skipped = []string{}, []string{}
	var errs []error
	for i := range list.Items {
		d := &list.Items[i]
		if d.Spec.Template.Annotations[hashKey] == p.Hash {
			skipped = append(skipped, d.Name) // reconciled by an earlier attempt or leader
			continue
		}
		if _, err := deps.Patch(ctx, d.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
			errs = append(errs, fmt.Errorf("patch deployment %s/%s: %w", c.cfg.Namespace, d.Name, err))
			continue
		}
		patched = append(patched, d.Name)
	}
	if len(errs) > 0 {
		return patched, skipped, len(errs), errors.Join(errs...)
	}
	return patched, skipped, 0, nil
}

func mustRequirement(key, value string) labels.Requirement {
	r, err := labels.NewRequirement(key, selection.Equals, []string{value})
	if err != nil {
		// key comes from validated config and value from a label the API
		// server accepted; both are valid label parts.
		panic(fmt.Sprintf("reload: label requirement %s=%s: %v", key, value, err))
	}
	return *r
}

func ptr[T any](v T) *T { return &v }

// truncate cuts an error text shown in the status.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
