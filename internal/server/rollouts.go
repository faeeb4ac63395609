package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/prometheus/client_golang/prometheus"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/server/rollout"
	"github.com/policyd/policyd/internal/store"
)

// rolloutInterval is how often the leader looks at its running rollouts'
// cohorts (docs/rollouts.md): a halt reaches the cohort within it and one
// push.
const rolloutInterval = 200 * time.Millisecond

// rolloutDriver is the leader task that moves running rollouts: it counts
// each one's cohort cluster-wide, decides (rollout.Decide), and proposes the
// transition with the state and stage it read as the expected ones, so that
// a decision of a deposed leader, or a repeat, is refused by the FSM. All it
// keeps is in the store, so a new leader carries on from the stored stage
// and its start time: the same cohort, by the hash.
type rolloutDriver struct {
	logger   *slog.Logger
	store    *store.Store
	clients  func(ctx context.Context) ([]*clusterv1.ClientInfo, []string, error)
	propose  func(ctx context.Context, cmd *command.Command) (*commandv1.Result, error)
	now      func() time.Time
	interval time.Duration

	transitions *prometheus.CounterVec
	halts       prometheus.Counter
	cohort      *prometheus.GaugeVec
	shown       map[string]bool // rollouts with cohort series; Run's goroutine only
}

// setupRollouts registers the rollout driver as a leader task, and the
// rollout metrics.
func (n *Node) setupRollouts() {
	d := newRolloutDriver(n.logger.With("component", "rollouts"), n.store, n.Clients, n.ProposeLocal)
	n.reg.MustRegister(d.transitions, d.halts, d.cohort, &rolloutStates{store: n.store})
	n.AddLeaderTask(raftnode.LeaderTask{Name: "rollouts", Run: d.Run})
}

// newRolloutDriver builds the driver over st, counting cohorts with
// clients and proposing with propose (the leader's own, never forwarded).
func newRolloutDriver(logger *slog.Logger, st *store.Store,
	clients func(ctx context.Context) ([]*clusterv1.ClientInfo, []string, error),
	propose func(ctx context.Context, cmd *command.Command) (*commandv1.Result, error),
) *rolloutDriver {
	return &rolloutDriver{
		logger: logger, store: st, clients: clients, propose: propose, now: time.Now, interval: rolloutInterval,
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "policyd", Name: "rollout_stage_transitions_total",
			Help: "Rollout transitions the leader's driver made, by target: next_stage, completed, halted or rolled_back.",
		}, []string{"to"}),
		halts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "policyd", Name: "rollout_halts_total",
			Help: "Rollouts the leader's driver halted (or rolled back) on their NACK ratio.",
		}),
		cohort: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "policyd", Name: "rollout_cohort_size",
			Help: "Sidecars holding a running rollout's candidate at its current stage, cluster-wide, by transport (grpc, ws); set by the leader.",
		}, []string{"rollout", "transport"}),
	}
}

// Run drives the rollouts until ctx ends (leadership lost).
func (d *rolloutDriver) Run(ctx context.Context) {
	defer func() {
		// A follower shows no cohorts: the next leader does.
		d.cohort.Reset()
		d.shown = nil
	}()
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		d.tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick looks at every running rollout once.
func (d *rolloutDriver) tick(ctx context.Context) {
	all, err := d.store.ActiveRollouts()
	if err != nil {
		d.logger.Warn("read rollouts", "err", err)
		return
	}
	var running []*commandv1.Rollout
	for _, r := range all {
		if r.GetState() == store.RolloutRunning {
			running = append(running, r)
		}
	}
	// Series of rollouts no longer running go; the others are set below,
	// so that a scrape never sees a running rollout without its series.
	live := map[string]bool{}
	for _, r := range running {
		live[r.GetId()] = true
	}
	for id := range d.shown {
		if !live[id] {
			d.cohort.DeleteLabelValues(id, "grpc")
			d.cohort.DeleteLabelValues(id, "ws")
		}
	}
	d.shown = live
	if len(running) == 0 {
		return
	}
	clients, unreachable, err := d.clients(ctx)
	if err != nil {
		d.logger.Warn("list sidecars for rollouts", "err", err)
		return
	}
	if len(unreachable) > 0 {
		d.logger.Debug("rollout cohorts miss the sidecars of unreachable members", "members", unreachable)
	}
	for _, r := range running {
		c := rollout.CohortOf(r, clients)
		d.cohort.WithLabelValues(r.GetId(), "grpc").Set(float64(c.Size))
		d.cohort.WithLabelValues(r.GetId(), "ws").Set(float64(c.SizeWS))
		t := rollout.Decide(r, c, d.now())
		if t == nil {
			continue
		}
		if err := d.apply(ctx, t); err != nil {
			d.logger.Warn("rollout transition not made", "rollout", r.GetId(), "to", t.GetState(), "stage", t.GetStage(), "err", err)
			continue
		}
		to := t.GetState()
		if to == store.RolloutRunning {
			to = "next_stage"
		}
		d.transitions.WithLabelValues(to).Inc()
		if t.GetState() == store.RolloutHalted || t.GetState() == store.RolloutRolledBack {
			d.halts.Inc()
		}
		d.logger.Info("rollout moved", "rollout", r.GetId(), "state", t.GetState(), "stage", t.GetStage(), "reason", t.GetReason(),
			"cohort", c.Size, "acked", c.Acked, "nacked", c.Nacked, "cohort_ws", c.SizeWS)
	}
}

// apply proposes t as the driver's own write.
func (d *rolloutDriver) apply(ctx context.Context, t *commandv1.RolloutTransition) error {
	cmd, err := command.RolloutTransition(t)
	if err != nil {
		return err
	}
	res, err := d.propose(ctx, command.WithAudit(cmd, command.ActorRollout, ""))
	if err != nil {
		return err
	}
	if err := command.ResultErr(res); err != nil {
		if errors.Is(err, store.ErrConflict) {
			// An operator moved it first; the next tick reads the new state.
			d.logger.Debug("rollout moved meanwhile", "rollout", t.GetId(), "err", err)
		}
		return err
	}
	return nil
}

// rolloutStates is policyd_rollouts{state}: the rollouts this node's
// replica holds, by state (every state reported, 0 when empty).
type rolloutStates struct{ store *store.Store }

var rolloutStatesDesc = prometheus.NewDesc("policyd_rollouts",
	"Staged rollouts in this node's replica, by state.", []string{"state"}, nil)

var rolloutStateNames = []string{store.RolloutRunning, store.RolloutPaused, store.RolloutHalted,
	store.RolloutRolledBack, store.RolloutCompleted, store.RolloutAborted}

func (m *rolloutStates) Describe(ch chan<- *prometheus.Desc) { ch <- rolloutStatesDesc }

func (m *rolloutStates) Collect(ch chan<- prometheus.Metric) {
	all, _, err := m.store.Rollouts()
	if err != nil {
		return
	}
	counts := map[string]int{}
	for _, r := range all {
		counts[r.GetState()]++
	}
	for _, s := range rolloutStateNames {
		ch <- prometheus.MustNewConstMetric(rolloutStatesDesc, prometheus.GaugeValue, float64(counts[s]), s)
	}
}
