package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/policyd/policyd/adminclient"
)

// failoverNodes is the cluster size of the failover scenario.
const failoverNodes = 3

// Issue targets for failover (worst round).
const (
	targetNewLeader  = 3 * time.Second
	targetAllCurrent = 5 * time.Second
)

// failoverConfig holds the failover scenario's flags.
type failoverConfig struct {
	rounds         int
	writers        int
	keys           int
	valueSize      int
	grpc, ws       int
	before, after  time.Duration
	timeout        time.Duration
	connectTimeout time.Duration
}

// failoverScenario kills the leader with SIGKILL under a steady write load
// and with SDK sidecars connected, -rounds times, restarting the killed
// node between rounds. Per round it measures, from the kill: a survivor
// reporting itself leader (GET /v1/cluster, polled), the first
// acknowledged write sent after the kill, every sidecar that was on the
// killed node ready again, and every sidecar holding a marker write made
// once writes succeed again; and it checks that every acknowledged write is
// there (a consistent read after the round).
//
// Writers write their own keys and the last acknowledged write of each
// key must be readable: writer w uses keys bench-w<w>-0..keys-1 before the
// kill and bench-w<w>-keys..2·keys-1 after, so the writes acknowledged just
// before the kill are not overwritten by later ones and are checked
// individually. Sequence numbers only grow (per writer, across rounds), so
// a stored sequence below the last acknowledged one is a lost write; one
// above it is a write whose answer was lost, which is allowed.
func failoverScenario() scenario {
	return scenario{
		name:    "failover",
		summary: "kill -9 the leader under write load with SDK sidecars: new leader, writes, sidecars, lost writes",
		setup: func(fs *flag.FlagSet) runner {
			c := &failoverConfig{}
			fs.IntVar(&c.rounds, "rounds", 3, "leader kills; the killed node is restarted between rounds")
			fs.IntVar(&c.writers, "writers", 20, "concurrent writers, each with one PUT in flight, to the live nodes in turn")
			fs.IntVar(&c.keys, "keys", 20, "keys per writer and phase (before / after the kill)")
			fs.IntVar(&c.valueSize, "value-size", 4096, "size in bytes of each PUT's JSON body")
			fs.IntVar(&c.grpc, "grpc", 200, "SDK sidecars over gRPC (client.TransportGRPC), spread over the nodes")
			fs.IntVar(&c.ws, "ws", 200, "SDK sidecars over WebSocket (client.TransportWS), spread over the nodes")
			fs.DurationVar(&c.before, "before", 3*time.Second, "write load before each kill")
			fs.DurationVar(&c.after, "after", time.Second, "write load after every sidecar is current again")
			fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "bound on each wait of a round (new leader, writes, sidecars) and per-request timeout")
			fs.DurationVar(&c.connectTimeout, "connect-timeout", 2*time.Minute, "how long the sidecars may take to connect at the start")
			return c
		},
	}
}

func (c *failoverConfig) validate() error {
	var errs []error
	if c.rounds < 1 {
		errs = append(errs, fmt.Errorf("-rounds must be at least 1, got %d", c.rounds))
	}
	if c.writers < 1 {
		errs = append(errs, fmt.Errorf("-writers must be at least 1, got %d", c.writers))
	}
	if c.keys < 1 {
		errs = append(errs, fmt.Errorf("-keys must be at least 1, got %d", c.keys))
	}
	if c.grpc < 0 || c.ws < 0 {
		errs = append(errs, fmt.Errorf("-grpc and -ws must not be negative, got %d, %d", c.grpc, c.ws))
	}
	if c.before <= 0 || c.after < 0 || c.timeout <= 0 || c.connectTimeout <= 0 {
		errs = append(errs, errors.New("-before, -timeout and -connect-timeout must be positive, -after not negative"))
	}
	longest := policyName(max(c.writers-1, 0), max(2*c.keys-1, 0))
	if minSize := minBodySize(longest); c.valueSize < minSize || c.valueSize > maxBodySize {
		errs = append(errs, fmt.Errorf("-value-size must be in [%d, %d], got %d", minSize, maxBodySize, c.valueSize))
	}
	return errors.Join(errs...)
}

func (c *failoverConfig) run(ctx context.Context, env *runEnv) (err error) {
	cfg := *c
	cl, _, stop, err := startReady(ctx, env, failoverNodes, nil, inactivityEnv)
	if err != nil {
		return err
	}
	var fl *sdkFleet
	defer func() {
		if fl != nil {
			env.logf("closing the sidecars")
			fl.close()
		}
		stop(&err)
	}()

	httpClient := newLoadClient(cfg.writers+8, failoverNodes, cfg.timeout)
	defer httpClient.CloseIdleConnections()
	addrs := cl.httpAddrs()
	apis, err := nodeAPIs(httpClient, addrs)
	if err != nil {
		return err
	}
	if err := preflight(ctx, apis[0], cfg.valueSize); err != nil {
		return err
	}
	if err := seedPolicies(ctx, httpClient, addrs, 1, 1, 0); err != nil {
		return fmt.Errorf("seed policies: %w", err)
	}
	if cfg.ws > 0 {
		if err := seedEmployees(ctx, httpClient, addrs, cfg.ws, 1); err != nil {
			return fmt.Errorf("seed employees: %w", err)
		}
	}
	initial, err := orgVersion(ctx, httpClient, addrs[0], orgName(0), true)
	if err != nil {
		return err
	}
	env.logf("starting %d gRPC and %d WebSocket SDK sidecars", cfg.grpc, cfg.ws)
	fl, err = openSDKFleet(ctx, cl, sdkFleetSpec{grpc: cfg.grpc, ws: cfg.ws, orgs: 1, grpcScope: "employee",
		streamsPerConn: 1, startConcurrency: defaultStartConcurrency})
	if err != nil {
		return err
	}
	if complete, err := fl.wait(ctx, fl.watch(map[int]string{0: initial}), cfg.connectTimeout); err != nil {
		return err
	} else if !complete {
		return fmt.Errorf("the sidecars do not all hold the initial version after %v", cfg.connectTimeout)
	}

	wl := newFailoverLoad(cfg, apis, httpClient, fl.base)
	var rounds []*failoverRoundFigure
	for r := 1; r <= cfg.rounds; r++ {
		f, err := c.round(ctx, env, cl, fl, wl, r)
		if f != nil && err != nil {
			f.Error = err.Error()
		}
		if f != nil {
			if err := env.emit(f); err != nil {
				return err
			}
		}
		if err != nil {
			// The summary still goes out: the target is missed, and the
			// completed rounds are figures.
			return errors.Join(fmt.Errorf("round %d: %w", r, err), env.emit(summarizeFailover(cfg, rounds)))
		}
		rounds = append(rounds, f)
	}
	return env.emit(summarizeFailover(cfg, rounds))
}

// round runs one kill. The returned figure may be partial when err is set.
func (c *failoverConfig) round(ctx context.Context, env *runEnv, cl *cluster, fl *sdkFleet, wl *failoverLoad, r int) (_ *failoverRoundFigure, err error) {
	leader, err := cl.waitReady(ctx, env.readyTimeout)
	if err != nil {
		return nil, fmt.Errorf("wait for the cluster: %w", err)
	}
	victim := slices.IndexFunc(cl.nodes, func(nd *node) bool { return nd.id == leader })
	f := &failoverRoundFigure{Scenario: "failover-round", Round: r, Killed: leader, Writers: c.writers,
		GRPC: c.grpc, WS: c.ws}

	wl.start(ctx)
	stopped := false
	defer func() {
		if !stopped {
			wl.stop()
		}
	}()
	if err := sleepUntil(ctx, time.Now().Add(c.before)); err != nil {
		return nil, err
	}

	onVictim := fl.connectedTo(cl.nodes[victim])
	killAt := fl.since()
	wl.kill(victim, killAt)
	if err := cl.kill(victim); err != nil {
		return nil, err
	}
	env.logf("round %d: killed the leader %s (%d sidecars were on it)", r, leader, len(onVictim))

	newLeader, at, err := waitNewLeader(ctx, cl, victim, fl.since, c.timeout)
	if err != nil {
		return f, err
	}
	f.NewLeader, f.NewLeaderMs = newLeader, ms(at-killAt)

	resumed, err := wl.waitResumed(ctx, c.timeout)
	if err != nil {
		return f, err
	}
	f.WritesResumedMs = ms(resumed - killAt)

	// A marker write to the sidecars' org, through a survivor, once writes
	// work again: every sidecar must end up holding it.
	survivor := cl.nodes[(victim+1)%len(cl.nodes)].httpAddr
	name := propPolicyName(0, 0)
	if err := putRetry(ctx, wl.client, survivor, name, propPolicyBody(name, orgName(0), 1000+r, 0), c.timeout); err != nil {
		return f, fmt.Errorf("marker write: %w", err)
	}
	version, err := orgVersion(ctx, wl.client, survivor, orgName(0), true)
	if err != nil {
		return f, err
	}
	w := fl.watch(map[int]string{0: version})
	complete, err := fl.wait(ctx, w, c.timeout)
	if err != nil {
		return f, err
	}
	if !complete {
		return f, fmt.Errorf("%d of %d sidecars do not hold the marker version %.12s %v after the kill",
			countMissing(w), len(w.expected), version, c.timeout)
	}
	var last time.Duration
	for _, idx := range w.expected {
		at, _ := w.heldAt(idx)
		last = max(last, at)
	}
	f.AllCurrentMs = ms(last - killAt)
	f.Reconnected = len(onVictim)
	f.AllReconnectedMs = ms(fl.readyAfter(onVictim, killAt) - killAt)

	if err := sleepUntil(ctx, time.Now().Add(c.after)); err != nil {
		return f, err
	}
	wl.stop()
	stopped = true
	f.Acked, f.AckedAfterKill = wl.acked()
	f.WriteErrors = wl.errors()

	// Every acknowledged write must be readable, on a consistent read.
	stored, err := readSeqs(ctx, wl.client, survivor)
	if err != nil {
		return f, err
	}
	lost := lostWrites(wl.lastAcked(), stored)
	f.LostWrites = len(lost)
	if len(lost) > 0 {
		env.logf("round %d: LOST ACKNOWLEDGED WRITES: %d, e.g. %s", r, len(lost), lost[0])
	}
	env.logf("round %d: new leader %s after %v ms, writes after %v ms, sidecars current after %v ms, %d acknowledged writes checked",
		r, f.NewLeader, f.NewLeaderMs, f.WritesResumedMs, f.AllCurrentMs, f.Acked)

	// The killed node comes back with its data dir and must rejoin: the
	// next round (and the end of the run) needs every node ready.
	restartAt := time.Now()
	if err := cl.restart(victim); err != nil {
		return f, err
	}
	if _, err := cl.waitReady(ctx, env.readyTimeout); err != nil {
		return f, fmt.Errorf("after restarting %s: %w", leader, err)
	}
	f.RejoinMs = ms(time.Since(restartAt))
	return f, nil
}

// putRetry PUTs policy name to the node at addr until it gets a 2xx, for
// up to timeout: writes resumed, but the cluster may still be settling
// (e.g. a second election).
func putRetry(ctx context.Context, client *http.Client, addr, name string, body []byte, timeout time.Duration) error {
	api, err := nodeAPI(client, addr)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		_, err := api.PutPolicy(ctx, name, body, adminclient.AnyRevision)
		if err == nil {
			return nil
		}
		err = fmt.Errorf("PUT /v1/policies/%s to %s: %w", name, addr, err)
		if ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
}

// waitNewLeader polls GET /v1/cluster on every node but victim until one
// says it is the leader, and returns its ID and when (on clock).
func waitNewLeader(ctx context.Context, cl *cluster, victim int, clock func() time.Duration, timeout time.Duration) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for i, nd := range cl.nodes {
			if i == victim {
				continue
			}
			st, err := cl.status(ctx, client, nd)
			if err == nil && st.State == "Leader" {
				return nd.id, clock(), nil
			}
		}
		select {
		case <-ctx.Done():
			return "", 0, fmt.Errorf("no new leader %v after the kill: %w", timeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// failoverLoad is the steady write load: writers PUT to the live nodes in
// turn, one request in flight each.
type failoverLoad struct {
	cfg    failoverConfig
	apis   []*adminclient.Client // one per node, in order
	client *http.Client

	writers []*failoverWriter // persist across rounds: sequence numbers only grow
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	dead     atomic.Int32 // the killed node, -1 when none
	killAt   atomic.Int64 // fleet clock of the kill
	resumed  atomic.Int64 // fleet clock of the first ack of a write sent after the kill; 0 before
	resumeCh chan struct{}
	base     time.Time
}

// failoverWriter is one writer's state.
type failoverWriter struct {
	seq       uint64
	lastAcked map[string]uint64 // per key, in this round
	acked     int
	ackedPost int
	errs      map[string]int
}

// newFailoverLoad returns the load; base is the fleet's clock origin, so
// that the load's times and the fleet's compare.
func newFailoverLoad(cfg failoverConfig, apis []*adminclient.Client, client *http.Client, base time.Time) *failoverLoad {
	l := &failoverLoad{cfg: cfg, apis: apis, client: client, base: base}
	for range cfg.writers {
		l.writers = append(l.writers, &failoverWriter{})
	}
	return l
}

// start starts the writers of a round.
func (l *failoverLoad) start(ctx context.Context) {
	ctx, l.cancel = context.WithCancel(ctx)
	l.dead.Store(-1)
	l.killAt.Store(0)
	l.resumed.Store(0)
	l.resumeCh = make(chan struct{})
	for i, w := range l.writers {
		w.lastAcked, w.acked, w.ackedPost, w.errs = map[string]uint64{}, 0, 0, map[string]int{}
		l.wg.Go(func() { l.write(ctx, i, w) })
	}
}

// kill tells the writers that node victim is gone from now on (killAt on
// the fleet clock, which the load shares).
func (l *failoverLoad) kill(victim int, killAt time.Duration) {
	l.killAt.Store(int64(killAt))
	l.dead.Store(int32(victim))
}

func (l *failoverLoad) write(ctx context.Context, writer int, w *failoverWriter) {
	var buf []byte
	for i := 0; ctx.Err() == nil; i++ {
		dead := int(l.dead.Load())
		target := (writer + i) % len(l.apis)
		if target == dead {
			target = (target + 1) % len(l.apis)
		}
		phase := 0
		if dead >= 0 {
			phase = 1
		}
		name := policyName(writer, phase*l.cfg.keys+i%l.cfg.keys)
		w.seq++
		buf = policyBody(buf[:0], name, w.seq, l.cfg.valueSize)
		sent := l.since()
		_, err := l.apis[target].PutPolicy(ctx, name, buf, adminclient.AnyRevision)
		if ctx.Err() != nil {
			return // stopped: the outcome of this write is unknown, and unchecked
		}
		if err != nil {
			w.errs[errorKind(err)]++
			// Don't spin on a dead cluster.
			if sleepUntil(ctx, time.Now().Add(20*time.Millisecond)) != nil {
				return
			}
			continue
		}
		w.lastAcked[name] = w.seq
		w.acked++
		if killAt := l.killAt.Load(); killAt != 0 && int64(sent) >= killAt {
			w.ackedPost++
			if l.resumed.CompareAndSwap(0, int64(l.since())) {
				close(l.resumeCh)
			}
		}
	}
}

// since is the load's clock, the fleet's.
func (l *failoverLoad) since() time.Duration { return time.Since(l.base) }

// waitResumed waits for the first acknowledged write sent after the kill
// and returns when its answer arrived.
func (l *failoverLoad) waitResumed(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.resumeCh:
		return time.Duration(l.resumed.Load()), nil
	case <-t.C:
		return 0, fmt.Errorf("no write sent after the kill was acknowledged within %v", timeout)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// stop stops the writers and waits for them.
func (l *failoverLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

// acked counts the acknowledged writes of the round, in all and sent after
// the kill. Call after stop.
func (l *failoverLoad) acked() (all, afterKill int) {
	for _, w := range l.writers {
		all += w.acked
		afterKill += w.ackedPost
	}
	return all, afterKill
}

// errors counts the failed writes of the round by kind. Call after stop.
func (l *failoverLoad) errors() map[string]int {
	out := map[string]int{}
	for _, w := range l.writers {
		for k, n := range w.errs {
			out[k] += n
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// lastAcked is every key's last acknowledged sequence number in the round.
// Call after stop.
func (l *failoverLoad) lastAcked() map[string]uint64 {
	out := map[string]uint64{}
	for _, w := range l.writers {
		for k, s := range w.lastAcked {
			out[k] = s
		}
	}
	return out
}

// readSeqs reads, with a consistent read on addr, every policy of the
// writes' org and returns the sequence number in each one's reason.
func readSeqs(ctx context.Context, client *http.Client, addr string) (map[string]uint64, error) {
	api, err := nodeAPI(client, addr)
	if err != nil {
		return nil, err
	}
	// Do with the raw list, for parseSeqs; Policies would decode every
	// policy's fields that are not needed here.
	const path = "/v1/policies?org=bench&consistent=true"
	var body json.RawMessage
	if err := api.Do(ctx, http.MethodGet, path, nil, nil, &body); err != nil {
		return nil, fmt.Errorf("GET %s from %s: %w", path, addr, err)
	}
	return parseSeqs(body)
}

// parseSeqs extracts name → sequence number from a policy list written by
// policyBody; policies of another shape are left out.
func parseSeqs(body []byte) (map[string]uint64, error) {
	var list struct {
		Policies []struct {
			Name string `json:"name"`
			Spec struct {
				Reason string `json:"reason"`
			} `json:"spec"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decode policy list: %w", err)
	}
	out := make(map[string]uint64, len(list.Policies))
	for _, p := range list.Policies {
		if seq, ok := reasonSeq(p.Spec.Reason); ok {
			out[p.Name] = seq
		}
	}
	return out, nil
}

// reasonSeq returns the sequence number of a policyBody reason.
func reasonSeq(reason string) (uint64, bool) {
	rest, ok := strings.CutPrefix(reason, reasonHead)
	if !ok || len(rest) < seqDigits {
		return 0, false
	}
	seq, err := strconv.ParseUint(rest[:seqDigits], 10, 64)
	return seq, err == nil
}

// lostWrites returns, sorted, a description of every key whose last
// acknowledged sequence number is not stored: missing, or stored with an
// older one.
func lostWrites(acked, stored map[string]uint64) []string {
	var lost []string
	for k, want := range acked {
		got, ok := stored[k]
		switch {
		case !ok:
			lost = append(lost, fmt.Sprintf("%s: acknowledged seq %d, missing", k, want))
		case got < want:
			lost = append(lost, fmt.Sprintf("%s: acknowledged seq %d, stored %d", k, want, got))
		}
	}
	slices.Sort(lost)
	return lost
}

// failoverRoundFigure is one kill's result, printed as one JSON line.
// Times are from the kill.
type failoverRoundFigure struct {
	Scenario        string  `json:"scenario"`
	Round           int     `json:"round"`
	Killed          string  `json:"killed"`
	NewLeader       string  `json:"new_leader"`
	Writers         int     `json:"writers"`
	GRPC            int     `json:"grpc_sidecars"`
	WS              int     `json:"ws_sidecars"`
	NewLeaderMs     float64 `json:"new_leader_ms"`
	WritesResumedMs float64 `json:"writes_resumed_ms"` // the first ack of a write sent after the kill
	// Reconnected sidecars were on the killed node; AllReconnectedMs is
	// when the last of them was ready again.
	Reconnected      int     `json:"reconnected"`
	AllReconnectedMs float64 `json:"all_reconnected_ms"`
	// AllCurrentMs: every sidecar holds the marker written once writes
	// work again.
	AllCurrentMs   float64        `json:"all_current_ms"`
	Acked          int            `json:"acked_writes"`
	AckedAfterKill int            `json:"acked_after_kill"`
	WriteErrors    map[string]int `json:"write_errors,omitempty"`
	LostWrites     int            `json:"lost_writes"`
	// RejoinMs is from restarting the killed node to every node ready.
	RejoinMs float64 `json:"rejoin_ms"`
	// Error is why the round did not complete; its other figures are then
	// partial.
	Error string `json:"error,omitempty"`
}

func (f *failoverRoundFigure) columns() []string {
	return []string{"scenario", "round", "killed", "new leader", "leader ms", "writes ms", "reconnected",
		"reconnect ms", "current ms", "acked", "errors", "lost", "rejoin ms"}
}

func (f *failoverRoundFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	errs := 0
	for _, n := range f.WriteErrors {
		errs += n
	}
	return []string{f.Scenario, strconv.Itoa(f.Round), f.Killed, f.NewLeader, num(f.NewLeaderMs), num(f.WritesResumedMs),
		strconv.Itoa(f.Reconnected), num(f.AllReconnectedMs), num(f.AllCurrentMs), strconv.Itoa(f.Acked),
		strconv.Itoa(errs), strconv.Itoa(f.LostWrites), num(f.RejoinMs)}
}

// failoverFigure summarizes the rounds: median and max of each time.
type failoverFigure struct {
	Scenario              string  `json:"scenario"`
	Rounds                int     `json:"rounds"`
	Writers               int     `json:"writers"`
	GRPC                  int     `json:"grpc_sidecars"`
	WS                    int     `json:"ws_sidecars"`
	NewLeaderMedianMs     float64 `json:"new_leader_median_ms"`
	NewLeaderMaxMs        float64 `json:"new_leader_max_ms"`
	WritesResumedMedianMs float64 `json:"writes_resumed_median_ms"`
	WritesResumedMaxMs    float64 `json:"writes_resumed_max_ms"`
	ReconnectedMedianMs   float64 `json:"all_reconnected_median_ms"`
	ReconnectedMaxMs      float64 `json:"all_reconnected_max_ms"`
	AllCurrentMedianMs    float64 `json:"all_current_median_ms"`
	AllCurrentMaxMs       float64 `json:"all_current_max_ms"`
	Acked                 int     `json:"acked_writes"`
	LostWrites            int     `json:"lost_writes"`
	Target                string  `json:"target"`
	TargetMet             bool    `json:"target_met"`
}

// summarizeFailover summarizes the rounds that completed; the target is
// met only if every requested round completed within it.
func summarizeFailover(cfg failoverConfig, rounds []*failoverRoundFigure) *failoverFigure {
	f := &failoverFigure{Scenario: "failover", Rounds: len(rounds), Writers: cfg.writers, GRPC: cfg.grpc, WS: cfg.ws,
		Target: fmt.Sprintf("new leader ≤ %v, all sidecars current ≤ %v, 0 lost writes", targetNewLeader, targetAllCurrent)}
	medMax := func(get func(*failoverRoundFigure) float64) (float64, float64) {
		var ds []time.Duration
		for _, r := range rounds {
			ds = append(ds, time.Duration(get(r)*float64(time.Millisecond)))
		}
		s := summarize(ds)
		return ms(s.p50), ms(s.max)
	}
	f.NewLeaderMedianMs, f.NewLeaderMaxMs = medMax(func(r *failoverRoundFigure) float64 { return r.NewLeaderMs })
	f.WritesResumedMedianMs, f.WritesResumedMaxMs = medMax(func(r *failoverRoundFigure) float64 { return r.WritesResumedMs })
	f.ReconnectedMedianMs, f.ReconnectedMaxMs = medMax(func(r *failoverRoundFigure) float64 { return r.AllReconnectedMs })
	f.AllCurrentMedianMs, f.AllCurrentMaxMs = medMax(func(r *failoverRoundFigure) float64 { return r.AllCurrentMs })
	for _, r := range rounds {
		f.Acked += r.Acked
		f.LostWrites += r.LostWrites
	}
	f.TargetMet = len(rounds) == cfg.rounds && len(rounds) > 0 && f.LostWrites == 0 &&
		f.NewLeaderMaxMs <= ms(targetNewLeader) && f.AllCurrentMaxMs <= ms(targetAllCurrent)
	return f
}

func (f *failoverFigure) columns() []string {
	return []string{"scenario", "rounds", "leader med/max ms", "writes med/max ms", "reconnect med/max ms",
		"current med/max ms", "acked", "lost", "target", "met"}
}

func (f *failoverFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	pair := func(a, b float64) string { return num(a) + "/" + num(b) }
	return []string{f.Scenario, strconv.Itoa(f.Rounds), pair(f.NewLeaderMedianMs, f.NewLeaderMaxMs),
		pair(f.WritesResumedMedianMs, f.WritesResumedMaxMs), pair(f.ReconnectedMedianMs, f.ReconnectedMaxMs),
		pair(f.AllCurrentMedianMs, f.AllCurrentMaxMs), strconv.Itoa(f.Acked), strconv.Itoa(f.LostWrites),
		f.Target, yesNo(f.TargetMet)}
}
