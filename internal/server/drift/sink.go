package drift

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/policyd/policyd/internal/command"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/backoff"
	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/store"
)

// Proposer commits a command through the Raft leader (server.Node).
type Proposer interface {
	Propose(ctx context.Context, cmd *command.Command) (*commandv1.Result, error)
}

// ErrQueueFull is returned by Submit when the proposal queue is full (no
// leader for a long time); the effects are dropped.
var ErrQueueFull = errors.New("drift effect queue is full")

// Sink sizes.
const (
	sinkQueue = 1024
	// sinkRetryFor bounds how long one command is retried while no leader
	// is reachable.
	sinkRetryFor = time.Minute
)

// Sink implements admission.Sink by proposing ObserveDrift commands.
type Sink struct {
	logger *slog.Logger
	nodeID string
	prop   Proposer
	queue  chan *command.Command

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ admission.Sink = (*Sink)(nil)

// NewSink starts a sink that proposes as node nodeID. Call Close to stop it.
func NewSink(logger *slog.Logger, nodeID string, prop Proposer) *Sink {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sink{logger: logger, nodeID: nodeID, prop: prop, queue: make(chan *command.Command, sinkQueue), ctx: ctx, cancel: cancel}
	s.wg.Add(1)
	go s.run()
	return s
}

// Close stops proposing; effects still queued are dropped (and logged).
func (s *Sink) Close() {
	s.cancel()
	s.wg.Wait()
	if n := len(s.queue); n > 0 {
		s.logger.Warn("drift effects dropped at shutdown", "commands", n)
	}
}

// Submit implements admission.Sink. It encodes and queues, and never waits
// for Raft.
func (s *Sink) Submit(_ context.Context, effects []admission.Effect) error {
	cmds, err := Commands(s.nodeID, effects)
	if err != nil {
		return err
	}
	for _, c := range cmds {
		select {
		case s.queue <- c:
		default:
			return ErrQueueFull
		}
	}
	return nil
}

func (s *Sink) run() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case c := <-s.queue:
			s.propose(c)
		}
	}
}

// propose commits c, retrying while the cluster has no leader.
func (s *Sink) propose(c *command.Command) {
	deadline := time.Now().Add(sinkRetryFor)
	retry := backoff.New(50*time.Millisecond, 2*time.Second, false)
	c.Actor = command.ActorDrift
	for {
		res, err := s.prop.Propose(s.ctx, c)
		if err == nil {
			err = command.ResultErr(res)
		}
		if err == nil {
			return
		}
		if s.ctx.Err() != nil || time.Now().After(deadline) {
			s.logger.Warn("drift effects dropped", "err", err)
			return
		}
		s.logger.Debug("proposing drift effects, retrying", "err", err)
		if !retry.Wait(s.ctx) {
			return
		}
	}
}

// Commands encodes effects as ObserveDrift commands: each report in its own
// command (an entry records one event), the patch tasks with the first.
func Commands(nodeID string, effects []admission.Effect) ([]*command.Command, error) {
	var tasks []store.DriftObservation
	var reports [][]store.DriftObservation
	for _, e := range effects {
		o, err := observation(e)
		if err != nil {
			return nil, err
		}
		if o.IsReport() {
			reports = append(reports, []store.DriftObservation{o})
		} else {
			tasks = append(tasks, o)
		}
	}
	if len(reports) == 0 {
		reports = [][]store.DriftObservation{nil}
	}
	reports[0] = append(reports[0], tasks...)
	var out []*command.Command
	for _, obs := range reports {
		if len(obs) == 0 {
			continue
		}
		c, err := command.ObserveDrift(nodeID, obs)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// observation maps an effect to what the FSM needs. The task key depends
// only on what the effect does, so the same effect from every node is one
// task.
func observation(e admission.Effect) (store.DriftObservation, error) {
	raw, err := json.Marshal(e)
	if err != nil {
		return store.DriftObservation{}, fmt.Errorf("encode %s effect: %w", e.Kind, err)
	}
	o := store.DriftObservation{Kind: string(e.Kind), Effect: raw}
	switch e.Kind {
	case admission.EffectDriftDetected, admission.EffectDriftResolved:
		if e.Child == nil {
			return o, fmt.Errorf("%s effect without a child", e.Kind)
		}
		o.Kind = store.DriftDetected
		o.ReportID = e.ReportID()
		switch {
		case e.Kind == admission.EffectDriftDetected:
		case e.Resolution == admission.ResolvedApproved && e.Occurrence != "":
			// Every approved drift is its own report: stored under its
			// occurrence, while the report's id names the pair.
			o.Kind, o.ReportID = store.DriftApproved, e.Occurrence
		default:
			o.Kind = store.DriftResolved
		}
		o.PairID = admission.ResolvedID(e.Parent, *e.Child)
		if o.Report, err = json.Marshal(e.Report()); err != nil {
			return o, fmt.Errorf("encode drift report %s: %w", o.ReportID, err)
		}
		o.Effect = nil // the report says it all
		o.Key = o.ReportID
		return o, nil
	case admission.EffectRecordController:
		o.Key = taskKey(e, e.UserHash)
	case admission.EffectRecordPhase:
		o.Key = taskKey(e, e.Phase)
	case admission.EffectConsumeApproval:
		a, err := json.Marshal(e.Approval)
		if err != nil {
			return o, fmt.Errorf("encode approval: %w", err)
		}
		o.Key = taskKey(e, string(a))
	case admission.EffectPruneApprovals:
		o.Key = taskKey(e, fmt.Sprint(e.Parent.Generation))
	default:
		return o, fmt.Errorf("unknown effect kind %q", e.Kind)
	}
	return o, nil
}

// taskKey names a patch: kind, the object (by UID when known, so a
// re-created namesake is another object) and what is written.
func taskKey(e admission.Effect, what string) string {
	p := e.Parent
	h := sha256.Sum256([]byte(strings.Join([]string{p.APIVersion, p.Kind, p.Namespace, p.Name, p.UID, what}, "\x00")))
	return fmt.Sprintf("%s/%s/%s/%s", e.Kind, p.Namespace, p.Name, hex.EncodeToString(h[:8]))
}
