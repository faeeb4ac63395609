package drift

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/policyd/policyd/internal/command"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/store"
)

// Retry is the backoff of failed tasks.
type Retry struct {
	Initial  time.Duration
	Max      time.Duration
	Attempts uint32
	// Timeout bounds one callback POST or patch.
	Timeout time.Duration
}

// DefaultRetry spreads 12 attempts over about 40 minutes.
var DefaultRetry = Retry{Initial: time.Second, Max: 10 * time.Minute, Attempts: 12, Timeout: 10 * time.Second}

// FollowupConfig configures the leader's follow-up worker.
type FollowupConfig struct {
	// AnnotationPrefix is drift.annotation_prefix.
	AnnotationPrefix string
	// Callbacks is the initial drift.callbacks list; see SetCallbacks.
	Callbacks []string
	Retry     Retry
	// Retention and PruneInterval: settled reports last seen more than
	// Retention ago are pruned every PruneInterval (events.retention and
	// events.cleanup_interval).
	Retention     time.Duration
	PruneInterval time.Duration
}

// Followup is the leader's drift worker. Run is a LeaderTask.
type Followup struct {
	cfg    FollowupConfig
	logger *slog.Logger
	st     *store.Store
	prop   Proposer
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	hc     *http.Client

	callbacks atomic.Pointer[[]string]
}

// NewFollowup builds the worker. hc nil uses a client with the retry
// timeout.
func NewFollowup(cfg FollowupConfig, logger *slog.Logger, st *store.Store, prop Proposer, dyn dynamic.Interface, mapper meta.RESTMapper, hc *http.Client) *Followup {
	if cfg.Retry == (Retry{}) {
		cfg.Retry = DefaultRetry
	}
	if hc == nil {
		hc = &http.Client{Timeout: cfg.Retry.Timeout}
	}
	f := &Followup{cfg: cfg, logger: logger, st: st, prop: prop, dyn: dyn, mapper: mapper, hc: hc}
	f.SetCallbacks(cfg.Callbacks)
	return f
}

// SetCallbacks replaces the callback URLs (drift.callbacks, reloaded on
// SIGHUP). It is safe to call at any time; deliveries in progress keep the
// URLs they started with, retries use the new list.
func (f *Followup) SetCallbacks(urls []string) {
	cp := slices.Clone(urls)
	f.callbacks.Store(&cp)
}

// Callbacks returns the current callback URLs.
func (f *Followup) Callbacks() []string { return *f.callbacks.Load() }

// taskState is the leader's memory of one task across attempts. It is lost
// with leadership; the next leader starts from what was recorded.
type taskState struct {
	attempts uint32
	next     time.Time
	running  bool
}

// outcome is what one attempt at a task produced.
type outcome struct {
	task store.DriftTask
	// cmd records the outcome through Raft; nil when there is nothing to
	// record (retry later).
	cmd   *command.Command
	retry bool
	err   error
}

// maxRunning bounds concurrent attempts.
const maxRunning = 8

// Run performs pending tasks until ctx ends (leadership lost).
func (f *Followup) Run(ctx context.Context) {
	sub := f.st.Subscribe()
	defer sub.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan outcome)
	states := map[string]*taskState{}
	running := 0
	prune := time.NewTicker(max(f.cfg.PruneInterval, time.Second))
	defer prune.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-sub.Ready():
			if !ok {
				return
			}
			sub.Next()
		case <-timer.C:
		case <-prune.C:
			f.prune(ctx)
			continue
		case r := <-results:
			running--
			f.settle(ctx, r, states[r.task.Key])
		}
		tasks, err := f.st.DriftTasks()
		if err != nil {
			f.logger.Error("read drift tasks", "err", err)
			timer.Reset(time.Second)
			continue
		}
		now := time.Now()
		next := time.Duration(-1)
		live := map[string]bool{}
		pairBusy := map[string]bool{}
		for _, t := range tasks {
			live[t.Key] = true
			st := states[t.Key]
			if st == nil {
				st = &taskState{}
				states[t.Key] = st
			}
			// Reports of one pair go out in order: a Resolved waits for
			// its Detected.
			if t.PairID != "" {
				if pairBusy[t.PairID] {
					continue
				}
				pairBusy[t.PairID] = true
			}
			if st.running {
				continue
			}
			if wait := st.next.Sub(now); wait > 0 {
				if next < 0 || wait < next {
					next = wait
				}
				continue
			}
			if running >= maxRunning {
				continue
			}
			st.running = true
			running++
			wg.Add(1)
			go func(t store.DriftTask, attempts uint32) {
				defer wg.Done()
				r := f.attempt(ctx, t, attempts)
				select {
				case results <- r:
				case <-ctx.Done():
				}
			}(t, st.attempts)
		}
		for k, st := range states {
			if !live[k] && !st.running {
				delete(states, k)
			}
		}
		if next >= 0 {
			timer.Reset(next)
		}
	}
}

// settle records an attempt's outcome and schedules a retry.
func (f *Followup) settle(ctx context.Context, r outcome, st *taskState) {
	if st == nil {
		st = &taskState{}
	}
	st.running = false
	st.attempts++
	if r.err != nil {
		f.logger.Warn("drift follow-up failed", "task", r.task.Key, "attempt", st.attempts, "retry", r.retry, "err", r.err)
	}
	if r.cmd != nil {
		if err := f.propose(ctx, r.cmd); err != nil {
			f.logger.Warn("recording drift follow-up failed; will retry", "task", r.task.Key, "err", err)
			r.retry = true
		}
	}
	if r.retry {
		st.next = time.Now().Add(f.retryAfter(st.attempts))
	}
}

// retryAfter is the wait after attempts failed attempts (the first
// retry, too, waits Retry.Initial).
func (f *Followup) retryAfter(attempts uint32) time.Duration {
	return backoff.Exp(max(attempts, 1), f.cfg.Retry.Initial, f.cfg.Retry.Max)
}

func (f *Followup) propose(ctx context.Context, cmd *command.Command) error {
	cmd.Actor = command.ActorDrift
	res, err := f.prop.Propose(ctx, cmd)
	if err == nil {
		err = command.ResultErr(res)
	}
	return err
}

// attempt performs one try at a task; attempts is how many came before.
func (f *Followup) attempt(ctx context.Context, t store.DriftTask, attempts uint32) outcome {
	if t.ReportID != "" {
		return f.deliver(ctx, t, attempts)
	}
	err := f.patch(ctx, t)
	final := err == nil || attempts+1 >= f.cfg.Retry.Attempts || errors.Is(err, errPermanent)
	if !final {
		return outcome{task: t, retry: true, err: err}
	}
	cmd, cerr := command.CompleteDriftTasks([]string{t.Key})
	if cerr != nil {
		return outcome{task: t, err: errors.Join(err, cerr)}
	}
	return outcome{task: t, cmd: cmd, err: err}
}

// errPermanent marks a failure that retrying cannot fix.
var errPermanent = errors.New("permanent")

// deliver POSTs a report to every callback URL it has not reached yet.
func (f *Followup) deliver(ctx context.Context, t store.DriftTask, attempts uint32) outcome {
	rec, err := f.st.DriftReport(t.ReportID)
	if errors.Is(err, store.ErrNotFound) {
		cmd, cerr := command.RecordDriftDelivery(t.ReportID, nil, true)
		return outcome{task: t, cmd: cmd, err: cerr}
	}
	if err != nil {
		return outcome{task: t, retry: true, err: err}
	}
	done := map[string]bool{}
	for _, d := range rec.Deliveries {
		if d.State == store.DeliveryDelivered || d.State == store.DeliveryFailed {
			done[d.URL] = true
		}
	}
	var ds []store.URLDelivery
	var errs []error
	pending := false
	for _, u := range f.Callbacks() {
		if done[u] {
			continue
		}
		err := f.post(ctx, u, rec.Report)
		d := store.URLDelivery{URL: u, State: store.DeliveryDelivered, Attempts: attempts + 1}
		switch {
		case err == nil:
		case errors.Is(err, errPermanent) || attempts+1 >= f.cfg.Retry.Attempts:
			d.State, d.Error = store.DeliveryFailed, err.Error()
			errs = append(errs, err)
		default:
			d.State, d.Error = store.DeliveryRetrying, err.Error()
			errs = append(errs, err)
			pending = true
		}
		ds = append(ds, d)
	}
	if ctx.Err() != nil {
		return outcome{task: t, retry: true, err: ctx.Err()}
	}
	cmd, err := command.RecordDriftDelivery(t.ReportID, ds, !pending)
	if err != nil {
		return outcome{task: t, err: err}
	}
	return outcome{task: t, cmd: cmd, retry: pending, err: errors.Join(errs...)}
}

// post sends one report. 2xx is success; 4xx other than 408 and 429 is a
// permanent refusal.
func (f *Followup) post(ctx context.Context, url string, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Retry.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("callback %s: %w: %w", url, errPermanent, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.hc.Do(req)
	if err != nil {
		return fmt.Errorf("callback %s: %w", url, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c >= 400 && c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooManyRequests:
		return fmt.Errorf("callback %s: %w: status %d", url, errPermanent, c)
	default:
		return fmt.Errorf("callback %s: status %d", url, c)
	}
}

// patch writes an annotation effect onto the current object. It re-reads
// the object and writes with its resourceVersion as a precondition, so a
// concurrent writer makes it retry rather than be overwritten.
func (f *Followup) patch(ctx context.Context, t store.DriftTask) error {
	var e admission.Effect
	if err := json.Unmarshal(t.Effect, &e); err != nil {
		return fmt.Errorf("decode %s effect: %w: %w", t.Kind, errPermanent, err)
	}
	ref := e.Parent
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return fmt.Errorf("%s effect: %w: %w", t.Kind, errPermanent, err)
	}
	mapping, err := f.mapper.RESTMapping(gv.WithKind(ref.Kind).GroupKind(), gv.Version)
	if err != nil {
		return fmt.Errorf("%s effect: map %s: %w", t.Kind, ref.Kind, err)
	}
	var r dynamic.ResourceInterface = f.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		r = f.dyn.Resource(mapping.Resource).Namespace(ref.Namespace)
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Retry.Timeout)
	defer cancel()
	for range 5 {
		cur, err := r.Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // gone: nothing to record
		}
		if err != nil {
			return fmt.Errorf("%s: get %s %s/%s: %w", t.Kind, ref.Kind, ref.Namespace, ref.Name, err)
		}
		if ref.UID != "" && string(cur.GetUID()) != ref.UID {
			return nil // re-created since: the effect was about the old one
		}
		ann, changed := e.Annotate(f.cfg.AnnotationPrefix, cur)
		if !changed {
			return nil
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": cur.GetResourceVersion(),
			"annotations":     mergePatchAnnotations(cur.GetAnnotations(), ann),
		}})
		if err != nil {
			return fmt.Errorf("%s: encode patch: %w", t.Kind, err)
		}
		_, err = r.Patch(ctx, ref.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "policyd-drift"})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: patch %s %s/%s: %w", t.Kind, ref.Kind, ref.Namespace, ref.Name, err)
		}
		f.logger.Debug("drift annotation patched", "task", t.Key, "object", ref.Namespace+"/"+ref.Name)
		return nil
	}
	return fmt.Errorf("%s: %s %s/%s keeps changing", t.Kind, ref.Kind, ref.Namespace, ref.Name)
}

// mergePatchAnnotations is the merge patch turning old into new: changed
// and added keys, and removed ones as null.
func mergePatchAnnotations(old, new map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range new {
		if ov, ok := old[k]; !ok || ov != v {
			out[k] = v
		}
	}
	for k := range old {
		if _, ok := new[k]; !ok {
			out[k] = nil
		}
	}
	return out
}

// prune proposes deleting settled reports older than the retention.
func (f *Followup) prune(ctx context.Context) {
	if f.cfg.Retention <= 0 {
		return
	}
	for {
		cmd, err := command.PruneDrift(time.Now().Add(-f.cfg.Retention))
		if err != nil {
			f.logger.Error("encode drift prune", "err", err)
			return
		}
		cmd.Actor = command.ActorDrift
		res, err := f.prop.Propose(ctx, cmd)
		if err != nil {
			f.logger.Warn("drift report pruning failed; retrying next interval", "err", err)
			return
		}
		if res.GetRevision() < store.MaxPrunePerBatch {
			return
		}
	}
}
