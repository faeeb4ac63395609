package kube

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/sources"
)

// nackedSlowdown is how much less often a NACKed rollout is looked at
// again than a pending one: it changes only when a sidecar goes or a new
// revision comes.
const nackedSlowdown = 5

// maxAttempts bounds the writes of one status when others keep changing
// the object under it.
const maxAttempts = 5

// maxMessage bounds a condition's message (the API allows 32 KiB).
const maxMessage = 1024

// statusWriter writes the outcome of each object's sync and its rollout
// back, each object at most once an interval, and nothing when nothing
// changed.
type statusWriter struct {
	cfg    Config
	client dynamic.Interface
	fleet  sources.Fleet
	logger *slog.Logger
	cached func(kind, name string) *unstructured.Unstructured

	mu      sync.Mutex
	entries map[string]*entry // by sources.Outcome.Object
	wake    chan struct{}
}

// entry is one object's status to write.
type entry struct {
	kind, name string
	out        sources.Outcome
	seq        uint64    // bumped by each report, so a stale evaluation cannot finish it
	due        time.Time // the earliest next evaluation
	lastWrite  time.Time
	final      bool // nothing will change until the next report
	busy       bool // a writer holds it
	written    *unstructured.Unstructured
}

func newStatusWriter(cfg Config, client dynamic.Interface, fleet sources.Fleet, logger *slog.Logger,
	cached func(kind, name string) *unstructured.Unstructured) *statusWriter {
	return &statusWriter{cfg: cfg, client: client, fleet: fleet, logger: logger, cached: cached,
		entries: map[string]*entry{}, wake: make(chan struct{}, 1)}
}

func (w *statusWriter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// report takes the outcomes of a sync; run writes them.
func (w *statusWriter) report(outcomes []sources.Outcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, o := range outcomes {
		kind, name, ok := strings.Cut(o.Object, " ")
		if _, known := resourceOf(kind); !ok || !known {
			w.logger.Warn("kubernetes source: outcome for an object it does not hold", "object", o.Object)
			continue
		}
		e := w.entries[o.Object]
		if e == nil {
			e = &entry{kind: kind, name: name}
			w.entries[o.Object] = e
		}
		e.out = o
		e.seq++
		e.final = false
		e.due = e.lastWrite.Add(w.cfg.StatusInterval)
	}
	w.signal()
}

// observed looks again at an object whose status someone else changed
// after its rollout was final, so that the status converges back.
func (w *statusWriter) observed(object string, u *unstructured.Unstructured) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[object]
	if e == nil || !e.final || e.busy {
		return // not written yet, or being written: the writer reads it anyway
	}
	if e.written != nil && (e.written.GetResourceVersion() == u.GetResourceVersion() ||
		equality.Semantic.DeepEqual(e.written.Object["status"], u.Object["status"])) {
		return // the driver's own write, or a change that left the status alone
	}
	e.final = false
	e.due = e.lastWrite.Add(w.cfg.StatusInterval)
	w.signal()
}

// forget drops a deleted object's pending status.
func (w *statusWriter) forget(object string) {
	w.mu.Lock()
	delete(w.entries, object)
	w.mu.Unlock()
}

// run dispatches due entries to the writers until ctx ends. With every
// entry final it waits for a report and does nothing else.
func (w *statusWriter) run(ctx context.Context) {
	jobs := make(chan *entry)
	var wg sync.WaitGroup
	for range w.cfg.StatusWriters {
		wg.Go(func() {
			for e := range jobs {
				w.evaluate(ctx, e)
				w.signal()
			}
		})
	}
	defer wg.Wait()
	defer close(jobs)

	w.mu.Lock()
	for _, e := range w.entries {
		e.busy = false // held by the writers of an earlier term
	}
	w.mu.Unlock()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		batch, next := w.takeDue(time.Now())
		for i, e := range batch {
			select {
			case jobs <- e:
			case <-ctx.Done():
				w.release(batch[i:])
				return
			}
		}
		var tick <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-tick:
		}
	}
}

// takeDue marks the entries due at now busy and returns them, with the
// time the next one is due (zero when none waits).
func (w *statusWriter) takeDue(now time.Time) (batch []*entry, next time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.entries {
		switch {
		case e.final || e.busy:
		case !e.due.After(now):
			e.busy = true
			batch = append(batch, e)
		case next.IsZero() || e.due.Before(next):
			next = e.due
		}
	}
	return batch, next
}

func (w *statusWriter) release(batch []*entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range batch {
		e.busy = false
	}
}

// evaluate computes one object's status and writes it if it changed.
func (w *statusWriter) evaluate(ctx context.Context, e *entry) {
	w.mu.Lock()
	out, seq, written := e.out, e.seq, e.written
	w.mu.Unlock()

	gvr, _ := resourceOf(e.kind)
	res := w.client.Resource(gvr)
	cur := freshest(w.cached(e.kind, e.name), written)
	look := w.look(ctx, out)
	var (
		wrote *unstructured.Unstructured
		err   error
	)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if cur == nil {
			cur, err = res.Get(ctx, e.name, metav1.GetOptions{})
			if err != nil {
				break
			}
		}
		var st v1alpha1.PolicyStatus
		if raw, ok := cur.Object["status"].(map[string]any); ok {
			if err = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st); err != nil {
				err = fmt.Errorf("read status: %w", err)
				break
			}
		}
		want := look.apply(st.DeepCopy(), out)
		if equality.Semantic.DeepEqual(&st, want) {
			break
		}
		var raw map[string]any
		if raw, err = runtime.DefaultUnstructuredConverter.ToUnstructured(want); err != nil {
			err = fmt.Errorf("encode status: %w", err)
			break
		}
		u := cur.DeepCopy()
		u.Object["status"] = raw
		wrote, err = res.UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: "policyd"})
		if apierrors.IsConflict(err) {
			cur, wrote = nil, nil // re-read and apply again
			continue
		}
		break
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	e.busy = false
	now := time.Now()
	if wrote != nil {
		e.written, e.lastWrite = wrote, now
	}
	switch {
	case apierrors.IsNotFound(err):
		if w.entries[out.Object] == e {
			delete(w.entries, out.Object) // deleted: its delete event may come later
		}
		return
	case err != nil:
		if ctx.Err() == nil {
			w.logger.Warn("kubernetes source: write status", "object", out.Object, "err", err)
		}
		e.due = now.Add(w.cfg.StatusInterval) // not final: the next term writes it
		return
	}
	if e.seq != seq {
		e.due = e.lastWrite.Add(w.cfg.StatusInterval) // a newer report came meanwhile
		return
	}
	e.final = look.final
	e.due = now.Add(w.cfg.StatusInterval * time.Duration(look.slowdown))
}

// look is what the fleet says of a committed policy, read once per
// evaluation whatever the retries.
type look struct {
	sidecars *sources.Sidecars // nil when the fleet could not say
	stage    string
	final    bool
	slowdown int
}

func (w *statusWriter) look(ctx context.Context, out sources.Outcome) look {
	l := look{final: true, slowdown: 1}
	if out.State != sources.StateCommitted {
		return l
	}
	sc, err := w.fleet.Reach(ctx, out.Name)
	if err != nil {
		w.logger.Debug("kubernetes source: rollout", "policy", out.Name, "err", err)
		l.final = false
		return l
	}
	l.sidecars = &sc
	l.stage = w.fleet.Staging(out.Name)
	switch {
	case sc.Nacked > 0:
		l.final, l.slowdown = false, nackedSlowdown
	case sc.Acked < sc.Total:
		l.final = false
	}
	if l.stage != "" {
		l.final = false
	}
	return l
}

// apply writes out and l into st, keeping what they do not speak of.
func (l look) apply(st *v1alpha1.PolicyStatus, out sources.Outcome) *v1alpha1.PolicyStatus {
	st.Source = v1alpha1.SourceKubernetes
	st.ObservedGeneration = out.Generation
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: clip(msg), ObservedGeneration: out.Generation,
		})
	}
	switch out.State {
	case sources.StateCommitted:
		st.Revision = int64(out.Revision)
		set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonCommitted, "revision "+strconv.FormatUint(out.Revision, 10))
	case sources.StateInvalid:
		set(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonInvalid, kubeMessage(out.Message))
		return st
	case sources.StateConflict:
		set(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonConflict, out.Message)
		return st
	case sources.StatePruneRefused:
		set(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonPruneRefused, out.Message)
		return st
	default:
		set(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonFailed, out.Message)
		return st
	}
	if l.sidecars == nil {
		return st // the rollout is unknown for now: leave what was said
	}
	sc := l.sidecars
	st.Sidecars = &v1alpha1.Sidecars{Total: int32(sc.Total), Acked: int32(sc.Acked), Nacked: int32(sc.Nacked), Pending: int32(sc.Pending)}
	counts := fmt.Sprintf("%d/%d acked", sc.Acked, sc.Total)
	switch {
	case sc.Nacked > 0:
		set(v1alpha1.ConditionRolledOut, metav1.ConditionFalse, v1alpha1.ReasonNacked,
			fmt.Sprintf("%s, %d nacked: %s", counts, sc.Nacked, sc.FirstNack))
	case sc.Acked < sc.Total:
		set(v1alpha1.ConditionRolledOut, metav1.ConditionFalse, v1alpha1.ReasonPending, counts)
	default:
		set(v1alpha1.ConditionRolledOut, metav1.ConditionTrue, v1alpha1.ReasonAllAcked, counts)
	}
	if l.stage != "" {
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonStaging, "stage "+l.stage)
	} else {
		set(v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.ReasonIdle, "no staged rollout runs")
	}
	return st
}

// freshest is the newer of the cache's copy and the last write's answer:
// the cache may not have seen that write yet.
func freshest(cached, written *unstructured.Unstructured) *unstructured.Unstructured {
	if written == nil {
		return cached
	}
	if cached == nil || cached.GetUID() != written.GetUID() {
		return cached
	}
	c, err1 := strconv.ParseUint(cached.GetResourceVersion(), 10, 64)
	w, err2 := strconv.ParseUint(written.GetResourceVersion(), 10, 64)
	if err1 == nil && err2 == nil && w > c {
		return written
	}
	return cached
}

// clip shortens a message to maxMessage bytes on a rune boundary.
func clip(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	s = s[:maxMessage]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
