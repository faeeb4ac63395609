package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/store"
)

// targetRollbackP99 is the rollback target: from a halt condition being met to
// every cohort sidecar holding the stable set again.
const targetRollbackP99 = time.Second

// The rollout scenario's policy: acme.p1 in the fleet's one org, stable with
// reason stableReason; every rollout puts it with badReason, which every
// sidecar's Apply refuses.
const (
	rolloutPolicyName = "acme.p1"
	stableReason      = "stable"
	badReason         = "bad"
)

// rolloutPollInterval is how often the gRPC cohort's Stats are read. It
// bounds when bench notices a rollback push, not the time it records, which
// is the SDK's own Stats.LastContact.
const rolloutPollInterval = 5 * time.Millisecond

// rolloutStatePoll is how often the rollout's state is read while a round
// waits for the halt (GET /v1/rollouts, without the cohort status, which
// costs the leader a cluster-wide client count).
const rolloutStatePoll = 100 * time.Millisecond

// rolloutMoments defines the measured moments, in the output as in
// docs/performance.md.
const rolloutMoments = "halt condition: the round's first Apply refusal (NACK) by a cohort gRPC sidecar; " +
	"halt decision: the rollout's updated_at at rolled_back (the leader's clock); " +
	"stable again: gRPC, the SDK counting (Stats.LastContact) the first discovery response after its refusal, " +
	"the rollback push of the stable version it kept; ws, OnUpdate with the stable version, the feed's rollback upsert " +
	"applied over the set it kept"

// errBadCandidate is what a sidecar's Apply answers the marked candidate.
var errBadCandidate = errors.New("bench: refusing a set that holds the candidate marked " + strconv.Quote(badReason))

// rolloutConfig holds the rollout scenario's flags.
type rolloutConfig struct {
	grpc, ws         int
	nodes            int
	rounds           int
	stages           string
	bake             time.Duration
	maxNack          float64
	timeout          time.Duration
	connectTimeout   time.Duration
	startConcurrency int
	percents         []int // parsed from stages by validate
}

// rolloutScenario measures a staged rollout's halt and rollback:
// a 3-node cluster, -grpc discovery and -ws feed SDK sidecars of one org
// that holds acme.p1, each listing every node from its own. Each round
// starts a rollout of acme.p1 whose candidate every sidecar's Apply
// refuses; the cohort NACKs (gRPC) or skips it (WebSocket), the leader
// rolls back, and bench records, per cohort sidecar, when it held the
// stable set again, from the first NACK (the halt condition) and from the
// leader's halt decision. See docs/performance.md for the exact moments.
func rolloutScenario() scenario {
	return scenario{
		name:    "rollout",
		summary: "a staged rollout the sidecars NACK: time from the halt condition to every cohort sidecar on the stable set again",
		setup: func(fs *flag.FlagSet) runner {
			c := &rolloutConfig{}
			fs.IntVar(&c.grpc, "grpc", 1000, "SDK sidecars on the discovery stream (gRPC), each with its own connection")
			fs.IntVar(&c.ws, "ws", 1000, "SDK sidecars on the WebSocket feed")
			fs.IntVar(&c.nodes, "nodes", 3, "cluster size")
			fs.IntVar(&c.rounds, "rounds", 3, "rollouts, one after the other; each has its own id and so its own cohort")
			fs.StringVar(&c.stages, "stages", "10,100", "stage percents, comma-separated; the first one's cohort is measured")
			fs.DurationVar(&c.bake, "bake", time.Hour, "each stage's bake time (long: the halt, not the bake, must end the stage)")
			fs.Float64Var(&c.maxNack, "max-nack-ratio", 0.01, "the rollouts' max_nack_ratio")
			fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "how long a round may take to halt and get every cohort sidecar back")
			fs.DurationVar(&c.connectTimeout, "connect-timeout", 3*time.Minute, "how long every sidecar may take to connect and hold the stable set")
			fs.IntVar(&c.startConcurrency, "dial-concurrency", defaultStartConcurrency, "sidecars starting at once")
			return c
		},
	}
}

func (c *rolloutConfig) validate() error {
	var errs []error
	if c.grpc < 1 || c.ws < 0 {
		errs = append(errs, fmt.Errorf("-grpc must be at least 1 (only gRPC sidecars NACK) and -ws not negative, got %d, %d", c.grpc, c.ws))
	}
	if c.nodes < 1 {
		errs = append(errs, fmt.Errorf("-nodes must be at least 1, got %d", c.nodes))
	}
	if c.rounds < 1 {
		errs = append(errs, fmt.Errorf("-rounds must be at least 1, got %d", c.rounds))
	}
	percents, err := parsePercents(c.stages)
	if err != nil {
		errs = append(errs, fmt.Errorf("-stages: %w", err))
	}
	c.percents = percents
	if c.bake < time.Second || c.bake > 24*time.Hour {
		errs = append(errs, fmt.Errorf("-bake must be between 1s and 24h, got %v", c.bake))
	}
	if c.maxNack < 0 || c.maxNack >= 1 {
		errs = append(errs, fmt.Errorf("-max-nack-ratio must be in [0, 1), got %g", c.maxNack))
	}
	if c.timeout <= 0 || c.connectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("-timeout and -connect-timeout must be positive, got %v, %v", c.timeout, c.connectTimeout))
	}
	if c.startConcurrency < 1 {
		errs = append(errs, fmt.Errorf("-dial-concurrency must be at least 1, got %d", c.startConcurrency))
	}
	return errors.Join(errs...)
}

// parsePercents parses stage percents as the server takes them: 1 to 100,
// strictly increasing, the last one 100.
func parsePercents(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(f), "%")))
		if err != nil {
			return nil, fmt.Errorf("%q is not a percent", f)
		}
		if p < 1 || p > 100 || len(out) > 0 && p <= out[len(out)-1] {
			return nil, fmt.Errorf("percents must be strictly increasing from 1 to 100, got %q", s)
		}
		out = append(out, p)
	}
	if len(out) == 0 || out[len(out)-1] != 100 {
		return nil, fmt.Errorf("the last stage must be 100, got %q", s)
	}
	return out, nil
}

// rolloutPolicyBody is acme.p1 in org with reason.
func rolloutPolicyBody(org, reason string) []byte {
	b, _ := json.Marshal(map[string]any{
		"name": rolloutPolicyName, "kind": "ToolPolicy",
		"scope":  map[string]string{"org": org},
		"labels": map[string]string{"bench": "rollout"},
		"spec":   map[string]any{"tool_name": "Bash", "action": "deny", "reason": reason},
	})
	return b
}

// holdsBad reports whether set holds a policy marked with badReason.
func holdsBad(set []client.Policy) bool {
	for _, p := range set {
		var spec struct {
			Reason string `json:"reason"`
		}
		if json.Unmarshal(p.Spec, &spec) == nil && spec.Reason == badReason {
			return true
		}
	}
	return false
}

// carProbe is what one sidecar saw in the current round, on the fleet
// clock (notHeld: not yet).
type carProbe struct {
	// rejectedAt is when its Apply first refused the candidate: over gRPC
	// the NACK is sent right after.
	rejectedAt atomic.Int64
	// syncs is, for a gRPC sidecar, its Stats' FullSyncs+Unchanged when it
	// rejected (the candidate's response already counted): one more is the
	// rollback push.
	syncs atomic.Uint64
	// stableAt is when it held the stable set again after rejecting.
	stableAt atomic.Int64
	// rejections counts its refusals in the round: a second one means the
	// candidate came again, and a gRPC sidecar's next response after its
	// first was not necessarily the rollback.
	rejections atomic.Int64
}

// rollbackProbe follows every sidecar of the fleet through the rounds.
type rollbackProbe struct {
	stable string // the stable set's version; set before the fleet opens
	fleet  atomic.Pointer[sdkFleet]
	cars   []carProbe
}

func newRollbackProbe(stable string, n int) *rollbackProbe {
	p := &rollbackProbe{stable: stable, cars: make([]carProbe, n)}
	p.reset()
	return p
}

// reset forgets the last round; the fleet must be quiet.
func (p *rollbackProbe) reset() {
	for i := range p.cars {
		p.cars[i].rejectedAt.Store(notHeld)
		p.cars[i].stableAt.Store(notHeld)
		p.cars[i].syncs.Store(0)
		p.cars[i].rejections.Store(0)
	}
}

// apply is every sidecar's Apply: it refuses the candidate and records the
// first refusal of the round (one goroutine per sidecar calls it).
func (p *rollbackProbe) apply(c *sidecar, set []client.Policy) error {
	if !holdsBad(set) {
		return nil
	}
	f := p.fleet.Load()
	if f == nil {
		return errBadCandidate
	}
	at := f.since()
	cp := &p.cars[c.idx]
	cp.rejections.Add(1)
	if cp.rejectedAt.Load() == notHeld {
		// syncs first: the poller reads it once rejectedAt is set.
		if c.kind == kindGRPC {
			st := f.clients[c.idx].Stats()
			cp.syncs.Store(st.FullSyncs + st.Unchanged)
		}
		cp.rejectedAt.Store(int64(at))
	}
	return errBadCandidate
}

// onUpdate records a WebSocket sidecar's return to the stable set: the
// feed's rollback upsert, re-installing the stable acme.p1 over the set it
// kept (it skipped the candidate), so the SDK calls OnUpdate with the
// stable version.
func (p *rollbackProbe) onUpdate(c *sidecar, u client.Update, at time.Duration) {
	if c.kind != kindWS {
		return
	}
	cp := &p.cars[c.idx]
	if cp.rejectedAt.Load() != notHeld && cp.stableAt.Load() == notHeld && u.Version == p.stable && !holdsBad(u.Policies) {
		cp.stableAt.Store(int64(at))
	}
}

// pollGRPC records the gRPC sidecars that got a response after they
// rejected the candidate: the rollback push, a full response with the
// stable version they already hold (or unchanged), which the SDK counts in
// Stats but does not report through OnUpdate. Its time is the SDK's
// Stats.LastContact, stamped when it counted the response. It returns how
// many rejected sidecars of both kinds are not back yet.
func (p *rollbackProbe) pollGRPC() int {
	f := p.fleet.Load()
	waiting := 0
	for i, c := range f.cars {
		cp := &p.cars[i]
		if cp.rejectedAt.Load() == notHeld || cp.stableAt.Load() != notHeld {
			continue
		}
		if c.kind == kindGRPC {
			if st := f.clients[i].Stats(); st.FullSyncs+st.Unchanged > cp.syncs.Load() {
				cp.stableAt.Store(int64(st.LastContact.Sub(f.base)))
				continue
			}
		}
		waiting++
	}
	return waiting
}

// roundResult is what one rollout measured.
type roundResult struct {
	Round      int    `json:"round"`
	ID         string `json:"id"`
	State      string `json:"state"`
	HaltReason string `json:"halt_reason"`
	// Per transport [grpc, ws]: cohort members by the hash, those whose
	// Apply refused the candidate, and those of them back on the stable
	// set within -timeout.
	Cohort   [2]int `json:"cohort"`
	Rejected [2]int `json:"rejected"`
	Stable   [2]int `json:"stable_again"`
	// OutsideRejections counts sidecars outside the cohort that were sent
	// the candidate, RepeatRejections cohort sidecars that were sent it
	// more than once (want 0 of both).
	OutsideRejections int `json:"outside_rejections"`
	RepeatRejections  int `json:"repeat_rejections"`
	// From the POST being sent to the first NACK, and from the first NACK
	// to the leader's halt decision (the rollout's updated_at).
	PostToNackMs float64 `json:"post_to_first_nack_ms"`
	NackToHaltMs float64 `json:"first_nack_to_halt_ms"`
	// From the first NACK to the last one of the cohort: how far the
	// first one is from the moment the ratio actually exceeded the limit
	// (at most this).
	NackSpreadMs float64 `json:"first_to_last_nack_ms"`

	fromNack [2][]time.Duration
	fromHalt [2][]time.Duration
}

func (c *rolloutConfig) run(ctx context.Context, env *runEnv) (err error) {
	cfg := *c
	if need := uint64(cfg.ws + cfg.grpc + fileMargin); env.fileLimit != 0 && env.fileLimit < need {
		return fmt.Errorf("the open-files limit is %d, and %d sidecars need about %d", env.fileLimit, cfg.grpc+cfg.ws, need)
	}
	cl, leader, stop, err := startReady(ctx, env, cfg.nodes, nil, inactivityEnv)
	if err != nil {
		return err
	}
	var sf *sdkFleet
	defer func() {
		if sf != nil {
			env.logf("closing the sidecars")
			sf.close()
		}
		stop(&err)
	}()
	var leaderAddr string
	for _, nd := range cl.nodes {
		if nd.id == leader {
			leaderAddr = nd.httpAddr
		}
	}
	httpc := newLoadClient(32, cfg.nodes, 30*time.Second)
	defer httpc.CloseIdleConnections()
	addrs := cl.httpAddrs()
	org := orgName(0)
	if err := putAll(ctx, httpc, addrs, []restPut{{"/v1/policies/" + rolloutPolicyName, rolloutPolicyBody(org, stableReason)}}, 1); err != nil {
		return fmt.Errorf("seed %s: %w", rolloutPolicyName, err)
	}
	if cfg.ws > 0 {
		if err := seedEmployees(ctx, httpc, addrs, cfg.ws, 1); err != nil {
			return fmt.Errorf("seed employees: %w", err)
		}
	}
	stable, err := orgVersion(ctx, httpc, leaderAddr, org, true)
	if err != nil {
		return err
	}

	probe := newRollbackProbe(stable, cfg.grpc+cfg.ws)
	env.logf("starting %d gRPC and %d WebSocket SDK sidecars over %d node(s), each listing every node from its own", cfg.grpc, cfg.ws, cfg.nodes)
	openStart := time.Now()
	sf, err = openSDKFleet(ctx, cl, sdkFleetSpec{grpc: cfg.grpc, ws: cfg.ws, orgs: 1, grpcScope: "employee",
		streamsPerConn: 1, startConcurrency: cfg.startConcurrency, apply: probe.apply, onUpdate: probe.onUpdate})
	if err != nil {
		return fmt.Errorf("open sidecars: %w", err)
	}
	probe.fleet.Store(sf)
	w := sf.watch(map[int]string{0: stable})
	complete, err := sf.wait(ctx, w, cfg.connectTimeout)
	if err != nil {
		return err
	}
	if !complete {
		return fmt.Errorf("after %v, %d of %d sidecars do not hold the stable set; first errors: %q",
			cfg.connectTimeout, countMissing(w), len(w.expected), sf.errors())
	}
	env.logf("every sidecar holds the stable set %.12s, %v after opening started", stable, time.Since(openStart).Round(time.Millisecond))

	api, err := nodeAPI(httpc, leaderAddr)
	if err != nil {
		return err
	}
	var rounds []*roundResult
	for i := range cfg.rounds {
		r, err := cfg.round(ctx, env, api, sf, probe, i+1)
		if err != nil {
			return fmt.Errorf("round %d: %w", i+1, err)
		}
		rounds = append(rounds, r)
		if err := env.emit(newRolloutRoundFigure(r)); err != nil {
			return err
		}
		if err := cl.checkAlive(); err != nil {
			return err
		}
	}
	for _, k := range []string{"grpc", "ws", "all"} {
		f := rolloutFigureFor(cfg, k, rounds)
		if f.Cohort == 0 {
			continue
		}
		if err := env.emit(f); err != nil {
			return err
		}
	}
	if errs := sf.errors(); len(errs) > 0 {
		env.logf("sidecar connections that ended (first %d): %q", len(errs), errs)
	}
	env.logf("moments: %s", rolloutMoments)
	env.logf("note: the %d node(s) and bench (every sidecar) share the machine's %d CPU(s)", cfg.nodes, runtime.NumCPU())
	return nil
}

// round starts one rollout and waits for its halt and for every sidecar
// that refused the candidate to hold the stable set again.
func (c *rolloutConfig) round(ctx context.Context, env *runEnv, api *adminclient.Client, sf *sdkFleet, probe *rollbackProbe, n int) (*roundResult, error) {
	probe.reset()
	req := adminclient.StartRollout{
		Changes:      []adminclient.StartChange{{Op: "put", Policy: rolloutPolicyBody(orgName(0), badReason)}},
		MaxNackRatio: c.maxNack,
		OnHalt:       store.OnHaltRollback,
	}
	for _, p := range c.percents {
		req.Stages = append(req.Stages, adminclient.StartStage{Percent: p, Bake: c.bake.String()})
	}
	sent := sf.since()
	ro, err := api.StartRollout(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("POST /v1/rollouts: %w", err)
	}
	r := &roundResult{Round: n, ID: ro.ID}

	deadline := time.Now().Add(c.timeout)
	var lastState time.Time
	terminal := false
	for {
		waiting := probe.pollGRPC()
		if !terminal && time.Since(lastState) >= rolloutStatePoll {
			lastState = time.Now()
			list, err := api.StagedRollouts(ctx, "all")
			if err != nil {
				return nil, fmt.Errorf("GET /v1/rollouts: %w", err)
			}
			for _, x := range list.Rollouts {
				if x.ID == r.ID {
					terminal = !store.RolloutActive(x.State)
				}
			}
		}
		if terminal && waiting == 0 || time.Now().After(deadline) {
			break
		}
		if err := sleepUntil(ctx, time.Now().Add(rolloutPollInterval)); err != nil {
			return nil, err
		}
	}
	ro, err = api.StagedRollout(ctx, r.ID)
	if err != nil {
		return nil, fmt.Errorf("GET /v1/rollouts/%s: %w", r.ID, err)
	}
	r.State, r.HaltReason = ro.State, ro.HaltReason
	if ro.State != store.RolloutRolledBack {
		return nil, fmt.Errorf("rollout %s is %s after %v (%s), want %s", r.ID, ro.State, c.timeout, ro.HaltReason, store.RolloutRolledBack)
	}
	halt := ro.UpdatedAt.Sub(sf.base) // the leader's wall clock, the same machine's
	r.measure(sf, probe, c.percents[0], sent, halt)
	env.logf("round %d: %s %s (%s): cohort %d gRPC + %d ws, rejected %d + %d, stable again %d + %d; first NACK %.1f ms after the POST, last %.1f ms after the first, halt %.1f ms after the first",
		n, r.ID, r.State, r.HaltReason, r.Cohort[kindGRPC], r.Cohort[kindWS], r.Rejected[kindGRPC], r.Rejected[kindWS],
		r.Stable[kindGRPC], r.Stable[kindWS], r.PostToNackMs, r.NackSpreadMs, r.NackToHaltMs)
	if r.OutsideRejections > 0 || r.RepeatRejections > 0 {
		return nil, fmt.Errorf("rollout %s: %d sidecars outside the cohort were sent its candidate, %d in it more than once",
			r.ID, r.OutsideRejections, r.RepeatRejections)
	}
	// Every sidecar, in the cohort or not, holds the stable set now.
	for i, sdk := range sf.clients {
		if v := sdk.Version(); v != probe.stable || holdsBad(sdk.Policies()) {
			return nil, fmt.Errorf("after rollout %s, sidecar %s holds %.12s, not the stable set %.12s", r.ID, sf.cars[i].id, v, probe.stable)
		}
	}
	return r, nil
}

// measure fills r from the probe: cohort of the first stage at percent,
// the round's POST sent at sent and the halt decided at halt (fleet clock).
func (r *roundResult) measure(sf *sdkFleet, probe *rollbackProbe, percent int, sent, halt time.Duration) {
	firstNack, lastNack := time.Duration(notHeld), time.Duration(0)
	for i, c := range sf.cars {
		cp := &probe.cars[i]
		rej := cp.rejectedAt.Load()
		if !policyset.InCohort(r.ID, c.id, uint32(percent)) {
			if rej != notHeld {
				r.OutsideRejections++
			}
			continue
		}
		r.Cohort[c.kind]++
		if rej == notHeld {
			continue
		}
		r.Rejected[c.kind]++
		if cp.rejections.Load() > 1 {
			r.RepeatRejections++
		}
		if c.kind == kindGRPC {
			if firstNack == time.Duration(notHeld) || time.Duration(rej) < firstNack {
				firstNack = time.Duration(rej)
			}
			lastNack = max(lastNack, time.Duration(rej))
		}
	}
	if firstNack == time.Duration(notHeld) {
		return
	}
	r.PostToNackMs, r.NackToHaltMs, r.NackSpreadMs = ms(firstNack-sent), ms(halt-firstNack), ms(lastNack-firstNack)
	for i, c := range sf.cars {
		cp := &probe.cars[i]
		at := cp.stableAt.Load()
		if cp.rejectedAt.Load() == notHeld || at == notHeld {
			continue
		}
		r.Stable[c.kind]++
		r.fromNack[c.kind] = append(r.fromNack[c.kind], time.Duration(at)-firstNack)
		r.fromHalt[c.kind] = append(r.fromHalt[c.kind], time.Duration(at)-halt)
	}
}

// rolloutRoundFigure is one round, printed as one JSON line and table row.
type rolloutRoundFigure struct {
	Scenario string `json:"scenario"`
	*roundResult
	FromNackMaxMs float64 `json:"from_first_nack_max_ms"`
}

func newRolloutRoundFigure(r *roundResult) *rolloutRoundFigure {
	f := &rolloutRoundFigure{Scenario: "rollout-round", roundResult: r}
	if all := slices.Concat(r.fromNack[kindGRPC], r.fromNack[kindWS]); len(all) > 0 {
		f.FromNackMaxMs = ms(slices.Max(all))
	}
	return f
}

func (f *rolloutRoundFigure) columns() []string {
	return []string{"scenario", "round", "id", "cohort grpc/ws", "rejected grpc/ws", "stable again grpc/ws",
		"POST→1st NACK ms", "1st→last NACK ms", "1st NACK→halt ms", "max 1st NACK→stable ms", "halt reason"}
}

func (f *rolloutRoundFigure) row() []string {
	pair := func(a [2]int) string { return strconv.Itoa(a[0]) + "/" + strconv.Itoa(a[1]) }
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{f.Scenario, strconv.Itoa(f.Round), f.ID, pair(f.Cohort), pair(f.Rejected), pair(f.Stable),
		num(f.PostToNackMs), num(f.NackSpreadMs), num(f.NackToHaltMs), num(f.FromNackMaxMs), f.HaltReason}
}

// rolloutFigure is one transport's (or both's) result over every round.
type rolloutFigure struct {
	Scenario     string  `json:"scenario"`
	Transport    string  `json:"transport"` // grpc, ws or all
	Nodes        int     `json:"nodes"`
	GRPC         int     `json:"grpc_sidecars"`
	WS           int     `json:"ws_sidecars"`
	Rounds       int     `json:"rounds"`
	Stages       string  `json:"stages"`
	MaxNackRatio float64 `json:"max_nack_ratio"`
	// Summed over the rounds: cohort members of the first stage, those
	// whose Apply refused the candidate, and those of them that held the
	// stable set again within -timeout; Missing is the difference. A
	// cohort member that was never sent the candidate (the halt came
	// first) held the stable set throughout and is in Cohort only.
	Cohort   int `json:"cohort"`
	Rejected int `json:"rejected"`
	Stable   int `json:"stable_again"`
	Missing  int `json:"missing"`
	// Per cohort sidecar and round: stable again minus the round's first
	// NACK (the halt condition), and minus the leader's halt decision.
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
	HaltP50Ms float64 `json:"from_halt_p50_ms"`
	HaltP99Ms float64 `json:"from_halt_p99_ms"`
	HaltMaxMs float64 `json:"from_halt_max_ms"`
	// Per round: first NACK to the halt decision.
	NackToHaltMs []float64 `json:"first_nack_to_halt_ms"`
	TargetP99Ms  float64   `json:"target_p99_ms"`
	Target       string    `json:"target"`
	TargetMet    bool      `json:"target_met"`
	CPUs         int       `json:"cpus"`
	// Moments defines the times the figures are differences of.
	Moments string `json:"moments"`
}

// rolloutFigureFor pools the rounds for transport "grpc", "ws" or "all".
func rolloutFigureFor(cfg rolloutConfig, transport string, rounds []*roundResult) *rolloutFigure {
	kinds := []sidecarKind{kindGRPC, kindWS}
	switch transport {
	case "grpc":
		kinds = kinds[:1]
	case "ws":
		kinds = kinds[1:]
	}
	f := &rolloutFigure{Scenario: "rollout", Transport: transport, Nodes: cfg.nodes, GRPC: cfg.grpc, WS: cfg.ws,
		Rounds: len(rounds), Stages: cfg.stages, MaxNackRatio: cfg.maxNack, TargetP99Ms: ms(targetRollbackP99),
		Target: "p99 ≤ 1 s from the halt condition to the stable set", CPUs: runtime.NumCPU(), Moments: rolloutMoments}
	var fromNack, fromHalt []time.Duration
	for _, r := range rounds {
		for _, k := range kinds {
			f.Cohort += r.Cohort[k]
			f.Rejected += r.Rejected[k]
			f.Stable += r.Stable[k]
			fromNack = append(fromNack, r.fromNack[k]...)
			fromHalt = append(fromHalt, r.fromHalt[k]...)
		}
		f.NackToHaltMs = append(f.NackToHaltMs, r.NackToHaltMs)
	}
	f.Missing = f.Rejected - f.Stable
	n, h := summarize(fromNack), summarize(fromHalt)
	f.P50Ms, f.P99Ms, f.MaxMs = ms(n.p50), ms(n.p99), ms(n.max)
	f.HaltP50Ms, f.HaltP99Ms, f.HaltMaxMs = ms(h.p50), ms(h.p99), ms(h.max)
	f.TargetMet = f.Missing == 0 && n.count > 0 && n.p99 <= targetRollbackP99
	return f
}

func (f *rolloutFigure) columns() []string {
	return []string{"scenario", "transport", "rounds", "cohort", "rejected", "stable again",
		"p50 ms", "p99 ms", "max ms", "from halt p50/p99/max", "1st NACK→halt ms", "target", "met"}
}

func (f *rolloutFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	var lags []string
	for _, l := range f.NackToHaltMs {
		lags = append(lags, num(l))
	}
	return []string{f.Scenario, f.Transport, strconv.Itoa(f.Rounds), strconv.Itoa(f.Cohort), strconv.Itoa(f.Rejected),
		strconv.Itoa(f.Stable), num(f.P50Ms), num(f.P99Ms), num(f.MaxMs),
		num(f.HaltP50Ms) + "/" + num(f.HaltP99Ms) + "/" + num(f.HaltMaxMs), strings.Join(lags, ","), f.Target, yesNo(f.TargetMet)}
}

func (f *rolloutFigure) targets() []targetResult {
	return []targetResult{{
		Target: fmt.Sprintf("rollout %s (%d gRPC + %d ws SDK sidecars, %d nodes): %s", f.Transport, f.GRPC, f.WS, f.Nodes, f.Target),
		Measured: fmt.Sprintf("p99 %g ms (from the halt decision %g ms), %d of %d rejecting cohort sidecars back, %d rounds",
			f.P99Ms, f.HaltP99Ms, f.Stable, f.Rejected, f.Rounds),
		Met: f.TargetMet,
	}}
}
