package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// State is the client's connection state (see docs/sidecars.md).
type State string

// States.
const (
	// StateConnecting: no set received yet. Everything is blocked.
	StateConnecting State = "connecting"
	// StateReady: connected and synced. Policies are enforced.
	StateReady State = "ready"
	// StateDisconnected: the connection was lost. Cached policies are
	// enforced for Config.Grace, then everything is blocked.
	StateDisconnected State = "disconnected"
	// StateRevoked: access was revoked. Everything is blocked, for good.
	StateRevoked State = "revoked"
)

// Reasons IsBlocked gives when everything is blocked.
const (
	ReasonConnecting   = "Waiting for initial policy sync. All requests blocked."
	ReasonDisconnected = "Connection to policy server lost. All requests blocked."
	ReasonRevoked      = "Access revoked. All requests blocked."
	ReasonStopped      = "Policy client stopped. All requests blocked."
)

var (
	// ErrRevoked is wrapped by the error Run returns when access was
	// revoked; the message carries the server's reason.
	ErrRevoked = errors.New("access revoked")
	// ErrAlreadyRun is returned by a second call to Run.
	ErrAlreadyRun = errors.New("client: Run may be called only once")
)

// Stats are counters for observability and tests.
type Stats struct {
	// Connects counts streams opened (gRPC) and handshakes completed (ws).
	Connects uint64
	// FullSyncs counts whole sets received: discovery responses with
	// policies, feed init messages.
	FullSyncs uint64
	// Unchanged counts discovery responses saying the client is current.
	Unchanged uint64
	// Deltas counts feed upsert and delete messages applied.
	Deltas uint64
	// Rejected counts sets and messages rejected (NACKed over gRPC).
	Rejected uint64
	// Server is the node of the current (or last) connection.
	Server string
	// LastContact is when the last message arrived from a server (Clock).
	LastContact time.Time
	// Shadow is each shadow policy's counts since New, by name; the
	// totals over them follow (see ShadowCount).
	Shadow                                              []ShadowCount
	ShadowWouldBlock, ShadowWouldAllow, ShadowEvaluated uint64
}

// view is what the hot path reads: immutable, swapped atomically.
type view struct {
	state State
	block string // non-empty: block everything with this reason
	rules *ruleSet
	// validators are the compiled ValidatingPolicies, in name order.
	validators []*validator
	// shadow are the compiled shadow policies, evaluated apart; nil
	// when there are none, which costs the hot path one check.
	shadow []*shadowPolicy
	// version is the policy-set version of the set in force.
	version string
}

// Client follows a policyd cluster and enforces the policies it receives.
// Create it with New, run it with Run; every other method is safe for
// concurrent use, before, during and after Run.
type Client struct {
	cfg    Config
	logger *slog.Logger
	view   atomic.Pointer[view]
	ran    atomic.Bool
	cel    *celCompiler

	evalErrors atomic.Uint64
	// dlog records decisions; nil when Config.DecisionLog is.
	dlog *decisionLog

	readyOnce sync.Once
	readyCh   chan struct{} // closed when first ready
	doneCh    chan struct{} // closed when Run returns

	mu           sync.Mutex
	state        State
	graceExpired bool
	stopped      bool
	revokeReason string
	graceGen     uint64
	graceTimer   Timer
	policies     []Policy // in force, sorted by name
	rules        *ruleSet
	validators   []*validator
	shadow       []*shadowPolicy
	// shadowCounters counts per shadow policy name, kept until reported.
	shadowCounters map[string]*shadowCounter
	version        string // policy-set version of the set in force
	haveSet        bool   // a set has been put in force
	index          uint64 // ws: Raft index of the last message received
	stats          Stats
}

// New validates cfg and returns a client in state connecting. logger may be
// nil (no logs).
func New(cfg Config, logger *slog.Logger) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cc, err := newCELCompiler(cfg.CELCostLimit, cfg.CELEnvOptions...)
	if err != nil {
		return nil, fmt.Errorf("client config: CEL env options: %w", err)
	}
	c := &Client{
		cfg:     cfg,
		logger:  logger.With("client_address", cfg.ClientAddress, "transport", cfg.Transport),
		readyCh: make(chan struct{}),
		doneCh:  make(chan struct{}),
		state:   StateConnecting,
		rules:   emptyRules,
		cel:     cc,
	}
	if cfg.DecisionLog != nil {
		if c.dlog, err = newDecisionLog(*cfg.DecisionLog, cfg.Clock); err != nil {
			return nil, fmt.Errorf("client config: %w", err)
		}
		c.dlog.setIdentity(&c.cfg, cfg.Token)
	}
	c.publish()
	return c, nil
}

// Run connects and follows the cluster, failing over between Servers, until
// ctx ends (it then returns nil) or access is revoked (it returns an error
// wrapping ErrRevoked). Every goroutine it starts has ended when it returns.
// After Run returns the client blocks everything. Run may be called once.
func (c *Client) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	defer close(c.doneCh)
	var tr transport
	if c.cfg.Transport == TransportWS {
		w := newWSTransport(c)
		defer w.close()
		tr = w
	} else {
		tr = &grpcTransport{c: c}
	}
	attempt := 0
	// unknownSince is when the first refusal of an unknown identity since
	// the last sync came (zero: none); unknownUntil ends its grace.
	var unknownSince, unknownUntil time.Time
	for i := 0; ; i++ {
		server := c.cfg.Servers[i%len(c.cfg.Servers)]
		synced, err := tr.session(ctx, server)
		if ctx.Err() != nil {
			c.stop()
			return nil
		}
		if synced {
			unknownSince = time.Time{}
		}
		var ae *authError
		var re *revokedError
		unknown := false
		switch {
		case errors.As(err, &re):
			return c.revoke(re.reason)
		case errors.As(err, &ae) && !c.cfg.RetryUnauthorized:
			if !ae.unknown {
				return c.revoke(ae.msg)
			}
			unknown = true
			now := time.Now()
			if unknownSince.IsZero() {
				unknownSince, unknownUntil = now, now.Add(c.cfg.UnknownIdentityGrace)
				c.logger.Warn("the server knows no such employee yet: retrying until the grace ends",
					"server", server, "err", err, "grace", c.cfg.UnknownIdentityGrace)
			}
			if !now.Before(unknownUntil) {
				return c.revoke(fmt.Sprintf("%s (still unknown after %v)", ae.msg, now.Sub(unknownSince).Round(time.Millisecond)))
			}
		}
		if synced {
			attempt = 0
		}
		c.lost()
		d := backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)
		if unknown {
			// One more try when the grace ends, not a backoff later.
			d = max(min(d, time.Until(unknownUntil)), 0)
		}
		level := slog.LevelInfo // a streak of failed attempts is reported once at Warn
		if attempt == 0 {
			level = slog.LevelWarn
		}
		attempt++
		c.logger.Log(ctx, level, "policy server connection ended", "server", server, "err", err, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			c.stop()
			return nil
		case <-t.C:
		}
	}
}

// WaitReady blocks until the client is first ready (nil), is revoked or
// stopped before that, or ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	select {
	case <-c.readyCh:
		return nil
	default:
	}
	select {
	case <-c.readyCh:
		return nil
	case <-c.doneCh:
		if c.State() == StateRevoked {
			return ErrRevoked
		}
		return errors.New("client stopped before it was ready")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// IsBlocked reports whether a call of tool with input must be blocked, and
// why. See docs/sidecars.md for the exact semantics.
func (c *Client) IsBlocked(tool string, input map[string]any) (reason string, blocked bool) {
	v := c.view.Load()
	if v.block != "" {
		return v.block, true
	}
	r := toolDeny(c.logger, v.rules, tool, input)
	if v.shadow != nil {
		shadowTools(v.shadow, tool, input, r == nil, nil)
	}
	if r != nil {
		return r.denial(), true
	}
	return "", false
}

// toolDeny returns the first deny rule of rs matching the call, or nil after
// logging the audit rules that match it.
func toolDeny(logger *slog.Logger, rs *ruleSet, tool string, input map[string]any) *rule {
	tr := rs.rulesFor(tool)
	if len(tr.deny) == 0 && len(tr.audit) == 0 {
		return nil
	}
	in := callInput{v: input}
	for _, r := range tr.deny {
		if r.matches(&in) {
			return r
		}
	}
	if len(tr.audit) == 0 || !logger.Enabled(context.Background(), slog.LevelInfo) {
		return nil
	}
	for _, r := range tr.audit {
		if r.matches(&in) {
			logger.Info("audit: tool call matched policy", "policy", r.name, "tool", tool, "reason", r.reason)
		}
	}
	return nil
}

// denial is the reason a deny rule gives.
func (r *rule) denial() string {
	if r.reason != "" {
		return r.reason
	}
	return "blocked by policy " + r.name
}

// ShouldBlockAll reports whether every call must be blocked: while
// connecting, after Grace in disconnected, when revoked, and once Run has
// returned.
func (c *Client) ShouldBlockAll() bool { return c.view.Load().block != "" }

// State returns the current state.
func (c *Client) State() State { return c.view.Load().state }

// Policies returns the set in force, sorted by name (read-only values).
func (c *Client) Policies() []Policy {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.policies)
}

// Version returns the policy-set version of the set in force ("" before the
// first one).
func (c *Client) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// Stats returns a snapshot of the counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	c.shadowStatsLocked(&s)
	return s
}

// publish rebuilds the hot-path view. Call with c.mu held (or before the
// client is shared).
func (c *Client) publish() {
	v := &view{state: c.state, rules: c.rules, validators: c.validators, shadow: c.shadow, version: c.version}
	switch {
	case c.state == StateRevoked:
		v.block = ReasonRevoked
		if c.revokeReason != "" {
			v.block = fmt.Sprintf("Access revoked (%s). All requests blocked.", c.revokeReason)
		}
	case c.stopped:
		v.block = ReasonStopped
	case c.state == StateConnecting:
		v.block = ReasonConnecting
	case c.state == StateDisconnected && c.graceExpired:
		v.block = ReasonDisconnected
	}
	c.view.Store(v)
	if c.state == StateReady {
		c.readyOnce.Do(func() { close(c.readyCh) }) // after the view: WaitReady's caller sees ready
	}
}

// setState moves to state to with c.mu held and returns the callback to run
// once it is released (nil when nothing changed).
func (c *Client) setState(to State) func() {
	from := c.state
	if from == to || from == StateRevoked {
		return nil
	}
	c.state = to
	c.logger.Info("policy client state", "from", from, "to", to)
	if to == StateReady {
		c.graceExpired = false
		c.stopGrace()
	}
	if cb := c.cfg.OnStateChange; cb != nil {
		return func() { cb(from, to) }
	}
	return nil
}

func run(f func()) {
	if f != nil {
		f()
	}
}

// stopGrace cancels a pending grace timer; c.mu held.
func (c *Client) stopGrace() {
	c.graceGen++
	if c.graceTimer != nil {
		c.graceTimer.Stop()
		c.graceTimer = nil
	}
}

// lost records that the connection ended: ready → disconnected, with the
// grace timer started.
func (c *Client) lost() {
	c.mu.Lock()
	if c.state != StateReady {
		c.mu.Unlock()
		return
	}
	cb := c.setState(StateDisconnected)
	c.stopGrace()
	gen := c.graceGen
	c.graceTimer = c.cfg.Clock.AfterFunc(c.cfg.Grace, func() { c.graceElapsed(gen) })
	c.publish()
	c.mu.Unlock()
	run(cb)
}

func (c *Client) graceElapsed(gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.graceGen || c.state != StateDisconnected {
		return
	}
	c.graceExpired = true
	c.graceTimer = nil
	c.publish()
	c.logger.Warn("grace period over while disconnected: blocking all requests", "grace", c.cfg.Grace)
}

// synced records a successful sync: → ready when a set is held.
func (c *Client) synced() {
	c.mu.Lock()
	cb := c.setState(StateReady)
	c.publish()
	c.mu.Unlock()
	run(cb)
}

// revoke moves to revoked and returns the error for Run.
func (c *Client) revoke(reason string) error {
	c.mu.Lock()
	if c.state != StateRevoked {
		c.revokeReason = reason
	}
	cb := c.setState(StateRevoked)
	c.stopGrace()
	c.publish()
	c.mu.Unlock()
	run(cb)
	c.logger.Error("policy access revoked: blocking all requests", "reason", reason)
	if reason == "" {
		return ErrRevoked
	}
	return fmt.Errorf("%w: %s", ErrRevoked, reason)
}

// stop is called when Run returns because its context ended.
func (c *Client) stop() {
	c.mu.Lock()
	c.stopped = true
	var cb func()
	if c.state == StateReady {
		cb = c.setState(StateDisconnected)
	}
	c.stopGrace()
	c.publish()
	c.mu.Unlock()
	run(cb)
}

// install puts a new set in force after compiling it and asking the Apply
// hook. On error nothing changes. It is called only from Run's goroutine.
func (c *Client) install(set []Policy, version string, index uint64, full bool, server string) error {
	c.mu.Lock()
	prev, prevValidators, prevShadow := c.rules, c.validators, c.shadow
	c.mu.Unlock()
	enforced, shadowSet := splitShadow(set)
	rules, validators, err := c.cel.compileEnforced(enforced, prev, prevValidators)
	var shadow []*shadowPolicy
	if err == nil && len(shadowSet) > 0 {
		shadow, err = c.compileShadow(shadowSet, prevShadow)
	}
	if err == nil && c.cfg.Apply != nil {
		if aerr := c.cfg.Apply(set); aerr != nil {
			err = fmt.Errorf("apply hook: %w", aerr)
		}
	}
	if err != nil {
		c.mu.Lock()
		c.stats.Rejected++
		c.mu.Unlock()
		c.logger.Error("policy set rejected; keeping the previous one", "version", version, "server", server, "err", err)
		return err
	}
	c.mu.Lock()
	for _, sp := range shadow {
		if sp.n == nil { // new: not yet published, so not read concurrently
			sp.n = c.counterLocked(sp.name)
		}
	}
	c.policies, c.rules, c.validators, c.shadow, c.version, c.haveSet = set, rules, validators, shadow, version, true
	if full || index > c.index {
		c.index = index
	}
	c.publish()
	c.mu.Unlock()
	c.logger.Debug("policy set applied", "version", version, "policies", len(set), "server", server)
	if cb := c.cfg.OnUpdate; cb != nil {
		cb(Update{Version: version, Index: index, Policies: set, Full: full, Server: server})
	}
	return nil
}

// snapshot returns the set in force and its versions.
func (c *Client) snapshot() (set []Policy, version string, index uint64, has bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.policies, c.version, c.index, c.haveSet
}

func (c *Client) count(f func(*Stats)) {
	c.mu.Lock()
	f(&c.stats)
	c.stats.LastContact = c.cfg.Clock.Now()
	c.mu.Unlock()
}

// transport is one way of talking to a node.
type transport interface {
	// session connects to server and follows it until the connection ends
	// or ctx is done. synced reports whether it got as far as a sync (so
	// backoff starts over). An *authError or a *revokedError may revoke.
	session(ctx context.Context, server string) (synced bool, err error)
}

// authError is an authentication refusal when connecting.
type authError struct {
	msg string
	err error
	// unknown: the server knows no employee of the token (its reason
	// UNKNOWN_EMPLOYEE), retried for Config.UnknownIdentityGrace.
	unknown bool
}

func (e *authError) Error() string { return "authentication refused: " + e.msg }
func (e *authError) Unwrap() error { return e.err }

// revokedError is a revocation announced by the server.
type revokedError struct{ reason string }

func (e *revokedError) Error() string { return "revoked: " + e.reason }

// token returns the token to connect with.
func (c *Client) token(ctx context.Context) (string, error) {
	if c.cfg.TokenSource == nil {
		return c.cfg.Token, nil
	}
	tok, err := c.cfg.TokenSource(ctx)
	if err != nil {
		return "", fmt.Errorf("token source: %w", err)
	}
	if c.dlog != nil {
		c.dlog.setIdentity(&c.cfg, tok)
	}
	return tok, nil
}

// backoff returns the wait before attempt n (0-based): a random duration in
// [0, min(max, min·2^n)] ("full jitter").
func backoff(n int, lo, hi time.Duration) time.Duration {
	ceil := hi
	if n < 62 {
		if d := lo << n; d > 0 && d < hi && d>>n == lo {
			ceil = d
		}
	}
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil + 1)
}

// capabilities is what the SDK declares to servers on both transports
// (docs/rollouts.md): "rollouts", so that it may be put in a staged
// rollout's cohort, whose candidate set it applies, ACKs and NACKs like any
// other; "shadow", since IsBlocked and Evaluate decide with the enforced
// policies only and evaluate shadow policies apart (shadow.go); and
// "decision_log" when Config.DecisionLog records decisions, so that a
// server says whether it takes them (the feed's init; over gRPC an older
// node answers ReportDecisions with Unimplemented).
func (c *Client) capabilities() []string {
	if c.dlog != nil {
		return []string{feedv1.CapabilityRollouts, feedv1.CapabilityShadow, feedv1.CapabilityDecisionLog}
	}
	return []string{feedv1.CapabilityRollouts, feedv1.CapabilityShadow}
}
