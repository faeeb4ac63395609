// Package shadow holds a node's aggregate of the shadow-policy counts its
// sidecars report (docs/rollouts.md): per policy and per scope of the
// reporting sidecar, in memory, since the node started. The discovery
// service and the feed hand reports in; the admin API and the peer RPC
// read them. Reports are untrusted input, so each is bounded: a rate per
// sidecar, a number of entries, one entry per policy, a largest count,
// and only the shadow
// policies the sidecar is actually served.
package shadow

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/policyd/policyd/internal/policy"
)

// Limits of a report.
const (
	// DefaultMinInterval is the least time between two reports a node takes
	// from one sidecar; one that comes sooner is dropped.
	DefaultMinInterval = 5 * time.Second
	// MaxEntries is the most counts one report may carry.
	MaxEntries = 256
	// MaxCount is the largest count an entry may carry.
	MaxCount = 1_000_000
	// maxKeys bounds the (policy, scope) pairs held; past it new pairs
	// are dropped and counted.
	maxKeys = 500_000
	// maxSidecars bounds the rate limiter's memory; past it, entries older
	// than the interval are swept.
	maxSidecars = 4096
)

// Reasons a report, or one entry of it, is ignored
// (policyd_shadow_reports_rejected_total{reason}).
const (
	ReasonRateLimited    = "rate_limited"     // the whole report
	ReasonTooManyEntries = "too_many_entries" // the whole report
	ReasonAbsurdCount    = "absurd_count"     // the whole report
	ReasonDuplicate      = "duplicate_policy" // the whole report: a policy named twice
	ReasonUnknownPolicy  = "unknown_policy"   // one entry: no such policy
	ReasonNotApplicable  = "not_applicable"   // one entry: not a shadow policy the sidecar is served
	ReasonFull           = "aggregate_full"   // one entry: too many (policy, scope) pairs held
)

// Errors Report returns for a report ignored as a whole.
var (
	ErrRateLimited = errors.New("shadow report rate limited: at most one per sidecar every 5s")
	ErrInvalid     = errors.New("shadow report invalid")
)

// Count is one entry of a report.
type Count struct {
	Policy     string
	WouldBlock uint64
	WouldAllow uint64
	Evaluated  uint64
}

// Report is one sidecar's report.
type Report struct {
	// Member identifies the sidecar for the rate limit: its discovery
	// client_address, or its feed connection.
	Member string
	// Identity is the sidecar's; its counts are aggregated under its
	// scope "org/team/employee".
	Identity policy.Identity
	Counts   []Count
	// Served reports whether the sidecar is served shadow policy name;
	// Exists whether a policy of that name exists at all.
	Served func(name string) bool
	Exists func(name string) bool
}

// ScopeCount is a policy's counts from the sidecars of one scope.
type ScopeCount struct {
	Scope      string
	WouldBlock uint64
	WouldAllow uint64
	Evaluated  uint64
}

// Config sets the rate limit; zero is DefaultMinInterval.
type Config struct {
	MinInterval time.Duration
}

type key struct{ policy, scope string }

// Aggregator is the node's aggregate. Safe for concurrent use.
type Aggregator struct {
	nodeID string
	cfg    Config
	logger *slog.Logger
	now    func() time.Time

	mu     sync.Mutex
	counts map[key]*ScopeCount
	last   map[string]time.Time // per member: the last report taken
	swept  time.Time            // when last was last swept

	rejected      *prometheus.CounterVec
	disagreements *prometheus.CounterVec
}

// New returns an empty aggregate whose metrics are registered with reg
// (nil: not registered).
func New(cfg Config, logger *slog.Logger, nodeID string, reg prometheus.Registerer) (*Aggregator, error) {
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	labels := prometheus.Labels{"node": nodeID}
	a := &Aggregator{
		nodeID: nodeID, cfg: cfg, logger: logger, now: time.Now,
		counts: map[key]*ScopeCount{},
		last:   map[string]time.Time{},
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_shadow_reports_rejected_total", ConstLabels: labels,
			Help: "Shadow reports (rate_limited, too_many_entries, absurd_count, duplicate_policy) or report entries (unknown_policy, not_applicable, aggregate_full) ignored.",
		}, []string{"reason"}),
		disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_shadow_disagreements_total", ConstLabels: labels,
			Help: "Decisions where a shadow policy would have denied while the enforced set allowed (would_block), or the reverse (would_allow), as reported by this node's sidecars.",
		}, []string{"policy", "kind"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{a.rejected, a.disagreements} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register shadow metrics: %w", err)
			}
		}
	}
	return a, nil
}

// Report takes in one report: ErrRateLimited or ErrInvalid when it is
// ignored as a whole, else nil, its entries for unknown policies or
// policies the sidecar is not served being ignored one by one. Every
// ignored report or entry is counted.
func (a *Aggregator) Report(r Report) error {
	now := a.now()
	a.mu.Lock()
	if t, ok := a.last[r.Member]; ok && now.Sub(t) < a.cfg.MinInterval {
		a.mu.Unlock()
		a.rejected.WithLabelValues(ReasonRateLimited).Inc()
		return ErrRateLimited
	}
	if len(a.last) >= maxSidecars && now.Sub(a.swept) >= a.cfg.MinInterval {
		// At most once an interval: with more sidecars than maxSidecars
		// reporting, a sweep per report would cost O(sidecars) each.
		a.swept = now
		for m, t := range a.last {
			if now.Sub(t) >= a.cfg.MinInterval {
				delete(a.last, m)
			}
		}
	}
	// Taken even if invalid: a flood of bad reports is limited as well.
	a.last[r.Member] = now
	a.mu.Unlock()

	if len(r.Counts) > MaxEntries {
		a.rejected.WithLabelValues(ReasonTooManyEntries).Inc()
		return fmt.Errorf("%w: %d entries, at most %d", ErrInvalid, len(r.Counts), MaxEntries)
	}
	seen := make(map[string]struct{}, len(r.Counts))
	for _, c := range r.Counts {
		// Per entry bounds hold per policy only if a policy has one entry:
		// 256 entries of one name would add 256 times MaxCount.
		if _, dup := seen[c.Policy]; dup {
			a.rejected.WithLabelValues(ReasonDuplicate).Inc()
			return fmt.Errorf("%w: policy %.64q named more than once", ErrInvalid, c.Policy)
		}
		seen[c.Policy] = struct{}{}
		if c.WouldBlock > MaxCount || c.WouldAllow > MaxCount || c.Evaluated > MaxCount ||
			c.WouldBlock+c.WouldAllow > c.Evaluated {
			a.rejected.WithLabelValues(ReasonAbsurdCount).Inc()
			return fmt.Errorf("%w: policy %.64q: counts %d/%d/%d: each at most %d, and would_block + would_allow at most evaluated",
				ErrInvalid, c.Policy, c.WouldBlock, c.WouldAllow, c.Evaluated, MaxCount)
		}
	}
	scope := r.Identity.String()
	ok := make([]Count, 0, len(r.Counts))
	for _, c := range r.Counts {
		switch {
		case r.Served(c.Policy):
			ok = append(ok, c)
		case r.Exists(c.Policy):
			a.rejected.WithLabelValues(ReasonNotApplicable).Inc()
		default:
			a.rejected.WithLabelValues(ReasonUnknownPolicy).Inc()
		}
	}
	a.mu.Lock()
	for _, c := range ok {
		k := key{c.Policy, scope}
		sc := a.counts[k]
		if sc == nil {
			if len(a.counts) >= maxKeys {
				a.rejected.WithLabelValues(ReasonFull).Inc()
				continue
			}
			sc = &ScopeCount{Scope: scope}
			a.counts[k] = sc
		}
		sc.WouldBlock += c.WouldBlock
		sc.WouldAllow += c.WouldAllow
		sc.Evaluated += c.Evaluated
		if c.WouldBlock > 0 {
			a.disagreements.WithLabelValues(c.Policy, "would_block").Add(float64(c.WouldBlock))
		}
		if c.WouldAllow > 0 {
			a.disagreements.WithLabelValues(c.Policy, "would_allow").Add(float64(c.WouldAllow))
		}
	}
	a.mu.Unlock()
	return nil
}

// Local is policy name's counts on this node, by scope in order.
func (a *Aggregator) Local(name string) []ScopeCount {
	a.mu.Lock()
	var out []ScopeCount
	for k, sc := range a.counts {
		if k.policy == name {
			out = append(out, *sc)
		}
	}
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y ScopeCount) int { return strings.Compare(x.Scope, y.Scope) })
	return out
}
