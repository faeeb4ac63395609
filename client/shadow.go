package client

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// EnforcementShadow marks a shadow policy (Policy.Enforcement): the SDK
// evaluates it beside the enforced set, alone, and counts where it would
// have decided otherwise, but it never blocks (docs/rollouts.md).
const EnforcementShadow = "shadow"

// ShadowCount is one shadow policy's counts.
type ShadowCount struct {
	Policy string
	// WouldBlock counts decisions where the shadow policy denied and the
	// enforced policies allowed; WouldAllow the reverse.
	WouldBlock, WouldAllow uint64
	// Evaluated counts the decisions the shadow policy applied to: a
	// ToolPolicy for its tool (or every tool), a ValidatingPolicy whose
	// match conditions held.
	Evaluated uint64
}

// shadowCounter counts for one shadow policy, on the hot path.
type shadowCounter struct {
	wouldBlock, wouldAllow, evaluated atomic.Uint64
	// reported is what earlier reports carried (Client.mu).
	reported ShadowCount
}

// shadowPolicy is one compiled shadow policy: a ToolPolicy (rule) or a
// ValidatingPolicy (val).
type shadowPolicy struct {
	name string
	spec []byte
	rule *rule
	val  *validator
	n    *shadowCounter
}

// splitShadow returns set's enforced policies and its shadow ones. Without
// shadow policies it returns set itself and allocates nothing.
func splitShadow(set []Policy) (enforced, shadow []Policy) {
	if !slices.ContainsFunc(set, Policy.isShadow) {
		return set, nil
	}
	enforced = make([]Policy, 0, len(set))
	for _, p := range set {
		if p.isShadow() {
			shadow = append(shadow, p)
		} else {
			enforced = append(enforced, p)
		}
	}
	return enforced, shadow
}

func (p Policy) isShadow() bool { return p.Enforcement == EnforcementShadow }

// compileShadow compiles the shadow policies, reusing from prev those whose
// spec has not changed. Kinds the SDK does not evaluate are left out. A
// new one has no counter yet: install gives it one (counterLocked) as it
// puts the set in force, under the lock that shadowReported forgets
// counters under, so a counter is never forgotten while a set about to
// hold its policy is being compiled.
func (c *Client) compileShadow(shadow []Policy, prev []*shadowPolicy) ([]*shadowPolicy, error) {
	var out []*shadowPolicy
	for _, p := range shadow {
		i := slices.IndexFunc(prev, func(sp *shadowPolicy) bool { return sp.name == p.Name })
		if i >= 0 && bytes.Equal(prev[i].spec, p.Spec) && (prev[i].rule != nil) == (p.Kind == KindToolPolicy) {
			out = append(out, prev[i])
			continue
		}
		sp := &shadowPolicy{name: p.Name, spec: p.Spec}
		var err error
		switch p.Kind {
		case KindToolPolicy:
			sp.rule, err = compileRule(p)
		case KindValidatingPolicy:
			sp.val, err = c.cel.compile(p)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("shadow %w", err)
		}
		out = append(out, sp)
	}
	return out, nil
}

// counterLocked is the counter of shadow policy name, kept across sets so
// that a change of the policy's spec does not lose what was not reported.
func (c *Client) counterLocked(name string) *shadowCounter {
	n := c.shadowCounters[name]
	if n == nil {
		if c.shadowCounters == nil {
			c.shadowCounters = map[string]*shadowCounter{}
		}
		n = &shadowCounter{}
		c.shadowCounters[name] = n
	}
	return n
}

// count records one evaluation of a shadow policy that denies (or not)
// against the enforced decision, and reports whether they disagree.
func (n *shadowCounter) count(denies, allowed bool) (disagrees bool) {
	n.evaluated.Add(1)
	switch {
	case denies && allowed:
		n.wouldBlock.Add(1)
	case !denies && !allowed:
		n.wouldAllow.Add(1)
	default:
		return false
	}
	return true
}

// countShadow counts one evaluation of sp and, when disagree is not nil
// and sp decided otherwise than the enforced policies, appends its name.
func countShadow(sp *shadowPolicy, denies, allowed bool, disagree *[]string) {
	if sp.n.count(denies, allowed) && disagree != nil {
		*disagree = append(*disagree, sp.name)
	}
}

// shadowTools evaluates the shadow ToolPolicies that apply to a call of
// tool, each alone, against the enforced decision. disagree, when not
// nil, gets the names of those that decided otherwise.
func shadowTools(shadow []*shadowPolicy, tool string, input map[string]any, allowed bool, disagree *[]string) {
	var in *callInput
	for _, sp := range shadow {
		r := sp.rule
		if r == nil || (r.tool != tool && r.tool != WildcardTool) {
			continue
		}
		denies := false
		if r.action == ActionDeny {
			if in == nil {
				in = &callInput{v: input}
			}
			denies = r.matches(in)
		}
		countShadow(sp, denies, allowed, disagree)
	}
}

// shadowEvaluate evaluates every shadow policy that applies to req, each
// alone, against the enforced decision. An evaluation error counts as a
// denial, as it would if the policy were enforced, but not in EvalErrors.
// disagree, when not nil, gets the names of those that decided otherwise
// (for the decision log).
func (c *Client) shadowEvaluate(ctx context.Context, shadow []*shadowPolicy, in *celInput, allowed bool, disagree *[]string) {
	if in.req.Tool != "" {
		shadowTools(shadow, in.req.Tool, in.req.Input, allowed, disagree)
	}
	for _, sp := range shadow {
		if sp.val == nil {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		vars, err := in.activation()
		if err != nil {
			return
		}
		if applies, d := sp.val.decide(in.size, vars); applies {
			countShadow(sp, d != nil, allowed, disagree)
		}
	}
}

// shadowStatsLocked fills s's shadow counts, cumulative since New.
func (c *Client) shadowStatsLocked(s *Stats) {
	s.Shadow = nil
	s.ShadowWouldBlock, s.ShadowWouldAllow, s.ShadowEvaluated = 0, 0, 0
	for name, n := range c.shadowCounters {
		sc := ShadowCount{Policy: name, WouldBlock: n.wouldBlock.Load(), WouldAllow: n.wouldAllow.Load(), Evaluated: n.evaluated.Load()}
		s.Shadow = append(s.Shadow, sc)
		s.ShadowWouldBlock += sc.WouldBlock
		s.ShadowWouldAllow += sc.WouldAllow
		s.ShadowEvaluated += sc.Evaluated
	}
	slices.SortFunc(s.Shadow, func(a, b ShadowCount) int { return strings.Compare(a.Policy, b.Policy) })
}

// shadowDeltas is what the counters gained since the last report, by
// policy name; nil when nothing did.
func (c *Client) shadowDeltas() []ShadowCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ShadowCount
	for name, n := range c.shadowCounters {
		d := ShadowCount{
			Policy:     name,
			WouldBlock: n.wouldBlock.Load() - n.reported.WouldBlock,
			WouldAllow: n.wouldAllow.Load() - n.reported.WouldAllow,
			Evaluated:  n.evaluated.Load() - n.reported.Evaluated,
		}
		if d.WouldBlock|d.WouldAllow|d.Evaluated != 0 {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b ShadowCount) int { return strings.Compare(a.Policy, b.Policy) })
	if len(out) > maxShadowReportEntries {
		out = out[:maxShadowReportEntries] // the rest go in the next report
	}
	return out
}

// maxShadowReportEntries is the most entries a node takes in one report.
const maxShadowReportEntries = 256

// shadowReported records that the deltas reached a node, and forgets the
// counters of policies no longer held once all their counts are reported.
func (c *Client) shadowReported(deltas []ShadowCount) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range deltas {
		n := c.shadowCounters[d.Policy]
		if n == nil {
			continue
		}
		n.reported.WouldBlock += d.WouldBlock
		n.reported.WouldAllow += d.WouldAllow
		n.reported.Evaluated += d.Evaluated
	}
	held := map[string]bool{}
	for _, sp := range c.shadow {
		held[sp.name] = true
	}
	for name, n := range c.shadowCounters {
		if !held[name] && n.reported.Evaluated == n.evaluated.Load() {
			delete(c.shadowCounters, name)
		}
	}
}

// wsMinShadowInterval is the least interval between reports over the feed:
// a node takes one per sidecar every 5 s and drops the rest, and the feed
// has no answer to tell the client, so a report sent sooner (by
// ShadowReportInterval, or network jitter) would be lost.
const wsMinShadowInterval = 6 * time.Second

// shadowLoop sends the shadow counts gained every interval until ctx ends.
// A report that fails is kept, to go with the next one.
func (c *Client) shadowLoop(ctx context.Context, interval time.Duration, send func(context.Context, []ShadowCount) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		deltas := c.shadowDeltas()
		if len(deltas) == 0 {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, maxHealthTimeout)
		err := send(sctx, deltas)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				c.logger.Debug("shadow report not taken; kept for the next one", "err", err)
			}
			continue
		}
		c.shadowReported(deltas)
	}
}

// feedShadowCounts is deltas as the feed's shadow_report carries them.
func feedShadowCounts(deltas []ShadowCount) []feedv1.ShadowCount {
	out := make([]feedv1.ShadowCount, len(deltas))
	for i, d := range deltas {
		out[i] = feedv1.ShadowCount{Policy: d.Policy, WouldBlock: d.WouldBlock, WouldAllow: d.WouldAllow, Evaluated: d.Evaluated}
	}
	return out
}

// Config.ShadowReportInterval's default, which New applies to a zero
// field, and its least accepted value.
const (
	// DefaultShadowReportInterval is how often shadow-policy counts are
	// reported; MinShadowReportInterval the least accepted. A node takes
	// about one report per 5 s from a sidecar and drops the rest.
	DefaultShadowReportInterval = 10 * time.Second
	MinShadowReportInterval     = time.Second
)
