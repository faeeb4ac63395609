package sources

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// Config is the engine's part of sources.*.
type Config struct {
	// Debounce coalesces the changes seen within it into one sync;
	// MaxDebounce bounds how long after the first change the sync starts.
	Debounce    time.Duration
	MaxDebounce time.Duration
	// MaxPruneRatio is the share of a source's policies one sync may delete
	// before it is refused until an operator allows it.
	MaxPruneRatio float64
	// MaxEntryBytes bounds one entry of a sync; a larger sync is split, in
	// order, into whole entries.
	MaxEntryBytes int
}

// Defaults of Config.
const (
	DefaultDebounce      = 100 * time.Millisecond
	DefaultMaxDebounce   = time.Second
	DefaultMaxPruneRatio = 0.5
	DefaultMaxEntryBytes = 32 << 20
)

// maxEntryItems keeps a part's events within the store's per-entry
// numbering (a uint16 sequence).
const maxEntryItems = 60000

// Deps is what the engine needs of the node.
type Deps struct {
	Store     *store.Store
	Validator *policy.Validator
	// Propose commits c through Raft from this node while it leads, and
	// returns once this node has applied it.
	Propose func(ctx context.Context, c *command.Command) (*commandv1.Result, error)
	Metrics *Metrics
}

// Engine runs one reconcile loop per source while the node leads.
type Engine struct {
	cfg     Config
	logger  *slog.Logger
	deps    Deps
	drivers []Driver

	mu     sync.Mutex
	status map[string]*Status
}

// Sync results, as policyd_source_syncs_total's result label and
// Status.LastResult.
const (
	ResultCommitted    = "committed"
	ResultUnchanged    = "unchanged"
	ResultInvalid      = "invalid"
	ResultPruneRefused = "prune_refused"
	ResultError        = "error"
)

// Status is what the leader's reconciler knows of a source beyond its
// replicated record: what it last read and how that went.
type Status struct {
	Name             string        `json:"name"`
	Running          bool          `json:"running"`
	ObservedRevision string        `json:"observed_revision,omitempty"`
	LastAttemptAt    time.Time     `json:"last_attempt_at,omitzero"`
	LastResult       string        `json:"last_result,omitempty"`
	LastError        string        `json:"last_error,omitempty"`
	PruneRefused     *PruneRefusal `json:"prune_refused,omitempty"`
	// Note is what the driver says of its last read (a Git ref that was
	// force-pushed).
	Note string `json:"note,omitempty"`
	// Invalid and Conflicts are the objects the last sync left out.
	Invalid   []Outcome `json:"invalid,omitempty"`
	Conflicts []Outcome `json:"conflicts,omitempty"`
}

// PruneRefusal is a sync refused because it would delete too many of the
// source's policies.
type PruneRefusal struct {
	Revision string    `json:"revision"`
	Deletes  int       `json:"deletes"`
	Owned    int       `json:"owned"`
	MaxRatio float64   `json:"max_ratio"`
	At       time.Time `json:"at"`
}

// New builds the engine for drivers; each driver's name must be unique.
func New(cfg Config, logger *slog.Logger, deps Deps, drivers ...Driver) (*Engine, error) {
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.MaxDebounce < cfg.Debounce {
		cfg.MaxDebounce = max(DefaultMaxDebounce, cfg.Debounce)
	}
	if cfg.MaxEntryBytes <= 0 {
		cfg.MaxEntryBytes = DefaultMaxEntryBytes
	}
	if deps.Metrics == nil {
		deps.Metrics, _ = NewMetrics(nil) // unregistered: cannot fail
	}
	e := &Engine{cfg: cfg, logger: logger, deps: deps, drivers: drivers, status: map[string]*Status{}}
	for _, d := range drivers {
		if _, dup := e.status[d.Name()]; dup {
			return nil, fmt.Errorf("sources: %s configured twice", d.Name())
		}
		if err := command.CheckSourceName(d.Name()); err != nil {
			return nil, err
		}
		e.status[d.Name()] = &Status{Name: d.Name()}
		deps.Metrics.Seed(d.Name())
	}
	return e, nil
}

// Names are the configured sources' names.
func (e *Engine) Names() []string {
	out := make([]string, len(e.drivers))
	for i, d := range e.drivers {
		out[i] = d.Name()
	}
	return out
}

// Driver returns the named source's driver; nil if none is configured.
func (e *Engine) Driver(name string) Driver {
	for _, d := range e.drivers {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// Status returns a copy of the named source's status; ok is false for a
// source that is not configured.
func (e *Engine) Status(name string) (Status, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.status[name]
	if !ok {
		return Status{}, false
	}
	return *st, true
}

func (e *Engine) update(name string, fn func(*Status)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fn(e.status[name])
}

// Run reconciles every source until ctx ends: one leadership term.
func (e *Engine) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, d := range e.drivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.run(ctx, d)
		}()
	}
	wg.Wait()
}

// run is one source's loop: changes from the driver and sync requests
// through the log wake it, it waits out the debounce, and syncs; a failed
// sync is retried with backoff.
func (e *Engine) run(ctx context.Context, d Driver) {
	name := d.Name()
	e.update(name, func(s *Status) { s.Running = true })
	defer e.update(name, func(s *Status) { s.Running = false })

	wake := make(chan struct{}, 1)
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	sub := e.deps.Store.Subscribe()
	defer sub.Close()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if err := d.Watch(ctx, signal); err != nil && ctx.Err() == nil {
			e.logger.Error("source watch stopped", "source", name, "err", err)
			e.update(name, func(s *Status) { s.LastResult, s.LastError = ResultError, err.Error() })
		}
	}()
	defer func() { <-watchDone }()

	lastRequest := e.requestIndex(name)
	retry := backoff.New(500*time.Millisecond, 30*time.Second, true)
	var retryC <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-retryC:
		case _, ok := <-sub.Ready():
			if !ok {
				return
			}
			if !e.requested(sub.Next(), name, &lastRequest) {
				continue
			}
		}
		if !e.debounce(ctx, wake) {
			return
		}
		retryC = nil
		if err := e.sync(ctx, d); err != nil {
			if ctx.Err() != nil {
				return
			}
			wait := retry.Next()
			e.logger.Warn("source sync failed; retrying", "source", name, "in", wait, "err", err)
			retryC = time.After(wait)
			continue
		}
		retry.Reset()
	}
}

// requested reports whether changes hold a new sync request for name, or
// a change of a staged rollout.
func (e *Engine) requested(changes []store.Change, name string, last *uint64) bool {
	hit, rolled := false, false
	for _, c := range changes {
		if c.Resync {
			hit = true
			continue
		}
		for _, ec := range c.Entities {
			switch {
			case ec.Type == store.EntitySource && ec.ID == name:
				hit = true
			case ec.Type == store.EntityRollout:
				// A rollout that ended may have been this source's: its
				// policies' revisions, or a staged change, are due.
				rolled = true
			}
		}
	}
	if rolled {
		return true
	}
	if !hit {
		return false
	}
	idx := e.requestIndex(name)
	if idx == *last {
		return false
	}
	*last = idx
	return true
}

func (e *Engine) requestIndex(name string) uint64 {
	rec, err := e.deps.Store.Source(name)
	if err != nil {
		return 0
	}
	return rec.RequestIndex
}

// debounce waits until no change arrived for cfg.Debounce, or
// cfg.MaxDebounce after it began; false if ctx ended.
func (e *Engine) debounce(ctx context.Context, wake <-chan struct{}) bool {
	limit := time.NewTimer(e.cfg.MaxDebounce)
	defer limit.Stop()
	quiet := time.NewTimer(e.cfg.Debounce)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-limit.C:
			return true
		case <-quiet.C:
			return true
		case <-wake:
			quiet.Reset(e.cfg.Debounce)
		}
	}
}

// SyncNow runs one sync of the named source at once, as the loop would;
// for tests and for the loop's callers.
func (e *Engine) SyncNow(ctx context.Context, name string) error {
	d := e.Driver(name)
	if d == nil {
		return fmt.Errorf("source %q: not configured", name)
	}
	return e.sync(ctx, d)
}

// noter is a driver with a remark on its last read.
type noter interface{ LastNote() string }

// errConflictRace is a sync the FSM refused because an owner changed
// between the plan and the commit.
var errConflictRace = errors.New("an owner changed under the sync")

// sync reads the source, plans against the store and commits the plan;
// a sync the FSM refuses because an owner changed meanwhile is planned
// again.
func (e *Engine) sync(ctx context.Context, d Driver) error {
	name := d.Name()
	start := time.Now()
	e.update(name, func(s *Status) { s.LastAttemptAt = start })
	obs, err := d.Observe(ctx)
	if err != nil {
		e.finish(name, start, ResultError, func(s *Status) { s.LastError = err.Error() })
		return fmt.Errorf("observe %s: %w", name, err)
	}
	e.update(name, func(s *Status) {
		s.ObservedRevision = obs.Revision
		if n, ok := d.(noter); ok {
			s.Note = n.LastNote()
		}
	})
	for try := 0; ; try++ {
		err = e.commit(ctx, d, obs, start)
		if !errors.Is(err, errConflictRace) || try == 2 {
			return err
		}
	}
}

// commit plans obs and proposes the plan, then reports each object's
// outcome to the driver.
func (e *Engine) commit(ctx context.Context, d Driver, obs *Observation, start time.Time) error {
	name := d.Name()
	rec, err := e.deps.Store.Source(name)
	if err != nil {
		return err
	}
	current, err := e.deps.Store.ListPolicies(store.PolicyFilter{})
	if err != nil {
		return fmt.Errorf("read policies: %w", err)
	}
	ro, err := readRollouts(e.deps.Store, name)
	if err != nil {
		return err
	}
	pl := plan(name, obs, current, e.deps.Validator, ro)

	if obs.Atomic && len(pl.invalid) > 0 {
		msg := fmt.Sprintf("revision %s refused: %s", obs.Revision, describe(pl.invalid))
		d.Report(ctx, pl.outcomes())
		e.finish(name, start, ResultInvalid, func(s *Status) {
			s.LastError, s.Invalid, s.Conflicts = msg, pl.invalid, pl.conflicts
		})
		return nil
	}
	if len(pl.deletes) > 0 && !rec.AllowPrune && float64(len(pl.deletes)) > e.cfg.MaxPruneRatio*float64(pl.owned) {
		ref := &PruneRefusal{Revision: obs.Revision, Deletes: len(pl.deletes), Owned: pl.owned, MaxRatio: e.cfg.MaxPruneRatio, At: time.Now()}
		msg := fmt.Sprintf("sync would delete %d of the %d policies %s owns, more than sources.max_prune_ratio %g; run policyd sources sync %s --allow-prune if that is meant",
			ref.Deletes, ref.Owned, name, ref.MaxRatio, name)
		out := pl.outcomes()
		for i := range out {
			if out[i].State == StateCommitted && pl.changed[out[i].Name] {
				out[i].State, out[i].Message = StatePruneRefused, msg
			}
		}
		d.Report(ctx, out)
		e.logger.Warn("source sync refused", "source", name, "deletes", ref.Deletes, "owned", ref.Owned)
		e.finish(name, start, ResultPruneRefused, func(s *Status) {
			s.LastError, s.PruneRefused, s.Invalid, s.Conflicts = msg, ref, pl.invalid, pl.conflicts
		})
		return nil
	}
	empty := len(pl.puts) == 0 && len(pl.deletes) == 0 && len(pl.staged) == 0
	// An unchanged Git commit still records its revision; an unchanged
	// Kubernetes list does not (its resourceVersion moves with every
	// status write), nor does anything with no grant to use up.
	if empty && !rec.AllowPrune && (!obs.Atomic || rec.Revision == obs.Revision) {
		d.Report(ctx, pl.outcomes())
		e.finish(name, start, ResultUnchanged, func(s *Status) {
			s.LastError, s.PruneRefused, s.Invalid, s.Conflicts = "", nil, pl.invalid, pl.conflicts
		})
		return nil
	}
	var request uint64
	if rec.AllowPrune {
		request = rec.RequestIndex
	}
	var parts []*commandv1.SyncSource
	if len(pl.puts)+len(pl.deletes) > 0 || len(pl.staged) == 0 {
		parts = e.split(name, obs.Revision, request, pl)
	}
	actor := command.ActorSource(name, obs.Revision)
	for _, part := range parts {
		c, err := command.SyncSource(part)
		if err != nil {
			return err
		}
		c.Actor = actor
		c.OriginatedAtUnixNano = start.UnixNano()
		res, err := e.deps.Propose(ctx, c)
		if err == nil {
			err = command.ResultErr(res)
		}
		if errors.Is(err, store.ErrConflict) {
			e.logger.Info("source sync raced a write; planning again", "source", name, "err", err)
			return errConflictRace
		}
		if err != nil {
			out := pl.outcomes()
			for i := range out {
				if out[i].State == StateCommitted && pl.changed[out[i].Name] {
					out[i].State, out[i].Message = StateFailed, err.Error()
				}
			}
			d.Report(ctx, out)
			e.finish(name, start, ResultError, func(s *Status) { s.LastError = err.Error() })
			return fmt.Errorf("commit %s: %w", name, err)
		}
		for _, p := range part.GetPuts() {
			pl.revision[p.GetName()] = res.GetIndex()
		}
	}
	out := pl.outcomes()
	byName := make(map[string]*Outcome, len(out))
	for i := range out {
		byName[out[i].Name] = &out[i]
	}
	if err := e.startStaged(ctx, name, actor, pl, byName); err != nil {
		return err
	}
	d.Report(ctx, out)
	e.logger.Info("source synced", "source", name, "revision", obs.Revision, "staged", len(pl.staged),
		"puts", len(pl.puts), "deletes", len(pl.deletes), "entries", len(parts))
	e.finish(name, start, ResultCommitted, func(s *Status) {
		s.LastError, s.PruneRefused, s.Invalid, s.Conflicts = "", nil, pl.invalid, pl.conflicts
	})
	return nil
}

// finish records a sync's result in the status and the metrics.
func (e *Engine) finish(name string, start time.Time, result string, fn func(*Status)) {
	e.update(name, func(s *Status) {
		s.LastResult = result
		fn(s)
	})
	owned := -1
	if rec, err := e.deps.Store.Source(name); err == nil {
		owned = rec.Policies
	}
	e.deps.Metrics.observe(name, result, time.Since(start), owned)
}

// split cuts a plan into entries of at most cfg.MaxEntryBytes, puts first,
// in order; each is whole, and the last records the revision.
func (e *Engine) split(name, revision string, request uint64, pl *syncPlan) []*commandv1.SyncSource {
	var parts []*commandv1.SyncSource
	cur := &commandv1.SyncSource{Source: name, Revision: revision, Request: request}
	size, items := 0, 0
	next := func(n int) {
		if items > 0 && (size+n > e.cfg.MaxEntryBytes || items >= maxEntryItems) {
			parts = append(parts, cur)
			cur = &commandv1.SyncSource{Source: name, Revision: revision}
			size, items = 0, 0
		}
		size += n
		items++
	}
	for _, p := range pl.puts {
		next(proto.Size(p) + 8)
		cur.Puts = append(cur.Puts, p)
		if pl.adopt[p.GetName()] {
			cur.Adopt = append(cur.Adopt, p.GetName())
		}
	}
	for _, n := range pl.deletes {
		next(len(n) + 8)
		cur.Deletes = append(cur.Deletes, n)
	}
	parts = append(parts, cur)
	for i, p := range parts {
		p.Part, p.Parts = uint32(i), uint32(len(parts))
	}
	return parts
}

// syncPlan is what one observation changes.
type syncPlan struct {
	puts    []*commandv1.Policy
	deletes []string
	adopt   map[string]bool
	// changed names the policies the plan puts or deletes; revision holds
	// each declared policy's revision (the current one until committed).
	changed  map[string]bool
	revision map[string]uint64
	declared []Declared
	// staged are the changes that go out as staged rollouts (spec.rollout).
	staged []staged
	// owned is how many policies the source owns before the sync.
	owned     int
	invalid   []Outcome
	conflicts []Outcome
}

// plan compares what obs declares with the current policies: a valid
// object whose policy differs is put; one owned by another (the API or
// another source) is a conflict unless it asks to adopt; a policy the
// source owns that it no longer declares is deleted, unless the read was
// partial or the object is there but invalid (its last good version stays).
func plan(name string, obs *Observation, current []*policy.Policy, v *policy.Validator, ro rollouts) *syncPlan {
	pl := &syncPlan{adopt: map[string]bool{}, changed: map[string]bool{}, revision: map[string]uint64{}}
	byName := make(map[string]*policy.Policy, len(current))
	for _, p := range current {
		byName[p.Name] = p
		if p.Source == name {
			pl.owned++
		}
	}
	keep := map[string]bool{}
	for _, oe := range obs.Invalid {
		pl.invalid = append(pl.invalid, Outcome{Object: oe.Object, Name: oe.Name, State: StateInvalid, Message: objectMessage(oe)})
		if oe.Name != "" {
			keep[oe.Name] = true
		}
	}
	for _, d := range obs.Policies {
		p := d.Policy
		keep[p.Name] = true
		out := Outcome{Object: d.Object, Name: p.Name, Generation: d.Generation}
		if err := v.Policy(p); err != nil {
			out.State, out.Message = StateInvalid, err.Error()
			pl.invalid = append(pl.invalid, out)
			continue
		}
		pb, err := command.PolicyMessage(p)
		if err != nil {
			out.State, out.Message = StateInvalid, err.Error()
			pl.invalid = append(pl.invalid, out)
			continue
		}
		cur := byName[p.Name]
		if cur != nil && cur.Source != name && !d.Adopt {
			owner := cur.Source
			if owner == "" {
				owner = "the API"
			}
			out.State, out.Message = StateConflict, fmt.Sprintf("policy %s is owned by %s; set %s to take it over", p.Name, owner, adoptHint(name))
			pl.conflicts = append(pl.conflicts, out)
			continue
		}
		if cur != nil {
			pl.revision[p.Name] = cur.Revision
		}
		if r := ro.active[p.Name]; r != nil {
			// A running rollout stages it: the FSM refuses other writes of
			// it until the rollout ends, and the next sync looks again.
			pl.declared = append(pl.declared, d)
			continue
		}
		if cur != nil && cur.Source == name && same(cur, pb) {
			pl.declared = append(pl.declared, d)
			continue
		}
		if d.Rollout != nil && (cur == nil || cur.Source == name) {
			if last := ro.last[p.Name]; last != nil && !store.RolloutActive(last.GetState()) &&
				last.GetState() != store.RolloutCompleted && sameCandidate(last, pb) {
				out.State = StateFailed
				out.Message = fmt.Sprintf("staged rollout %s of this change ended %s (%s); change the object to try again",
					last.GetId(), last.GetState(), last.GetHaltReason())
				pl.invalid = append(pl.invalid, out)
				continue
			}
			r, err := declaredRollout(name, d, pb)
			if err != nil {
				out.State, out.Message = StateInvalid, err.Error()
				pl.invalid = append(pl.invalid, out)
				continue
			}
			pl.declared = append(pl.declared, d)
			pl.staged = append(pl.staged, staged{d: d, pb: pb, r: r})
			pl.changed[p.Name] = true
			continue
		}
		pl.declared = append(pl.declared, d)
		pl.puts = append(pl.puts, pb)
		pl.changed[p.Name] = true
		if cur != nil && cur.Source != name {
			pl.adopt[p.Name] = true
		}
	}
	if !obs.Complete {
		return pl
	}
	for _, p := range current {
		if p.Source == name && !keep[p.Name] && ro.active[p.Name] == nil {
			pl.deletes = append(pl.deletes, p.Name)
			pl.changed[p.Name] = true
		}
	}
	return pl
}

func adoptHint(name string) string {
	if name == Kubernetes {
		return `the annotation policyd.io/adopt: "true"`
	}
	return "adopt: true in the document"
}

// same reports whether the stored policy cur holds what pb would put.
func same(cur *policy.Policy, pb *commandv1.Policy) bool {
	sc := pb.GetScope()
	return cur.Kind == pb.GetKind() &&
		cur.Scope == policy.Scope{Org: sc.GetOrg(), Team: sc.GetTeam(), Employee: sc.GetEmployee()} &&
		policy.CanonicalEnforcement(cur.Enforcement) == pb.GetEnforcement() &&
		maps.Equal(cur.Labels, pb.GetLabels()) &&
		bytes.Equal(cur.Spec, pb.GetSpec())
}

// outcomes is every object's outcome: the valid ones committed (at their
// revision), then the invalid and conflicting ones.
func (pl *syncPlan) outcomes() []Outcome {
	out := make([]Outcome, 0, len(pl.declared)+len(pl.invalid)+len(pl.conflicts))
	for _, d := range pl.declared {
		out = append(out, Outcome{Object: d.Object, Name: d.Policy.Name, Generation: d.Generation,
			State: StateCommitted, Revision: pl.revision[d.Policy.Name]})
	}
	out = append(out, pl.invalid...)
	return append(out, pl.conflicts...)
}

func objectMessage(oe ObjectError) string {
	if oe.Field != "" {
		return oe.Field + ": " + oe.Message
	}
	return oe.Message
}

// describe names the first invalid objects for a status line.
func describe(invalid []Outcome) string {
	const show = 3
	var b bytes.Buffer
	for i, o := range invalid {
		if i == show {
			fmt.Fprintf(&b, "; and %d more", len(invalid)-show)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(o.Object + ": " + o.Message)
	}
	return b.String()
}
