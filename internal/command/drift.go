package command

import (
	"encoding/json"
	"fmt"
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/store"
)

// Drift types (docs/drift.md): the webhook's observations, and the leader's
// record of the follow-up it performed.
const (
	TypeObserveDrift        Type = 11
	TypeRecordDriftDelivery Type = 12
	TypeCompleteDriftTasks  Type = 13
	TypePruneDrift          Type = 14
)

// ActorDrift is the actor of the drift webhook's sink and follow-up, and of
// drift pruning.
const ActorDrift = "task:drift"

// Bounds on drift commands. A decision yields a handful of effects; these
// only keep a buggy or hostile proposer from writing entries that are
// expensive for every replica.
const (
	maxDriftEffects = 64
	maxDriftKeys    = 1024
	maxDriftKind    = 64
	maxDriftURL     = 2048
)

// Delivery states a RecordDriftDelivery may carry for one URL.
var deliveryStates = map[string]bool{
	store.DeliveryDelivered: true, store.DeliveryRetrying: true, store.DeliveryFailed: true,
}

// ObserveDrift builds the command recording one admission decision's
// effects, seen by node nodeID.
func ObserveDrift(nodeID string, obs []store.DriftObservation) (*Command, error) {
	c := &commandv1.ObserveDrift{NodeId: nodeID}
	for _, o := range obs {
		c.Effects = append(c.Effects, &commandv1.DriftEffect{
			Kind: o.Kind, Key: o.Key, ReportId: o.ReportID, PairId: o.PairID,
			Snoozed: o.Snoozed, Effect: o.Effect, Report: o.Report,
		})
	}
	if _, err := Observations(c); err != nil {
		return nil, err
	}
	return New(c)
}

// RecordDriftDelivery builds the command recording the delivery of one
// report; final settles it and removes its task.
func RecordDriftDelivery(reportID string, ds []store.URLDelivery, final bool) (*Command, error) {
	c := &commandv1.RecordDriftDelivery{ReportId: reportID, Final: final}
	for _, d := range ds {
		c.Deliveries = append(c.Deliveries, &commandv1.DriftDelivery{Url: d.URL, State: d.State, Attempts: d.Attempts, Error: d.Error})
	}
	if _, err := Deliveries(c); err != nil {
		return nil, err
	}
	return New(c)
}

// CompleteDriftTasks builds the command removing finished patch tasks.
func CompleteDriftTasks(keys []string) (*Command, error) {
	c := &commandv1.CompleteDriftTasks{}
	for _, k := range keys {
		c.Outcomes = append(c.Outcomes, &commandv1.DriftTaskOutcome{Key: k})
	}
	if _, err := TaskKeys(c); err != nil {
		return nil, err
	}
	return New(c)
}

// PruneDrift builds the command deleting settled reports last seen before
// cutoff.
func PruneDrift(cutoff time.Time) (*Command, error) {
	return New(&commandv1.PruneDrift{CutoffUnixNano: cutoff.UnixNano()})
}

// Observations validates an ObserveDrift payload: everything Apply relies
// on is checked here, so a bad entry never reaches the log.
func Observations(c *commandv1.ObserveDrift) ([]store.DriftObservation, error) {
	if n := len(c.GetEffects()); n == 0 || n > maxDriftEffects {
		return nil, fmt.Errorf("observe drift: %d effects, want 1 to %d", n, maxDriftEffects)
	}
	if err := CheckKeys("observe drift", "node_id", c.GetNodeId()); err != nil {
		return nil, err
	}
	out := make([]store.DriftObservation, 0, len(c.GetEffects()))
	reports := 0
	for i, e := range c.GetEffects() {
		what := fmt.Sprintf("observe drift: effect %d", i)
		o := store.DriftObservation{
			Kind: e.GetKind(), Key: e.GetKey(), ReportID: e.GetReportId(), PairID: e.GetPairId(),
			Snoozed: e.GetSnoozed(), Effect: e.GetEffect(), Report: e.GetReport(), NodeID: c.GetNodeId(),
		}
		if o.Kind == "" || len(o.Kind) > maxDriftKind {
			return nil, fmt.Errorf("%s: kind %q is empty or longer than %d bytes", what, o.Kind, maxDriftKind)
		}
		if len(o.Effect) > 0 && !json.Valid(o.Effect) {
			return nil, fmt.Errorf("%s: effect is not JSON", what)
		}
		if o.IsReport() {
			// One report per entry: an entry records at most one event,
			// whose ID is the entry's index.
			if reports++; reports > 1 {
				return nil, fmt.Errorf("%s: more than one report in one command", what)
			}
			if err := CheckKeys(what, "report_id", o.ReportID, "pair_id", o.PairID); err != nil {
				return nil, err
			}
			if !json.Valid(o.Report) {
				return nil, fmt.Errorf("%s: report is not JSON", what)
			}
		} else if err := CheckKeys(what, "key", o.Key); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func Deliveries(c *commandv1.RecordDriftDelivery) ([]store.URLDelivery, error) {
	if err := CheckKeys("record drift delivery", "report_id", c.GetReportId()); err != nil {
		return nil, err
	}
	if n := len(c.GetDeliveries()); n > maxDriftEffects {
		return nil, fmt.Errorf("record drift delivery: %d deliveries, at most %d", n, maxDriftEffects)
	}
	out := make([]store.URLDelivery, 0, len(c.GetDeliveries()))
	for i, d := range c.GetDeliveries() {
		if d.GetUrl() == "" || len(d.GetUrl()) > maxDriftURL {
			return nil, fmt.Errorf("record drift delivery: delivery %d: url is empty or longer than %d bytes", i, maxDriftURL)
		}
		if !deliveryStates[d.GetState()] {
			return nil, fmt.Errorf("record drift delivery: delivery %d: unknown state %q", i, d.GetState())
		}
		if len(d.GetError()) > maxDriftURL {
			return nil, fmt.Errorf("record drift delivery: delivery %d: error longer than %d bytes", i, maxDriftURL)
		}
		out = append(out, store.URLDelivery{URL: d.GetUrl(), State: d.GetState(), Attempts: d.GetAttempts(), Error: d.GetError()})
	}
	return out, nil
}

func TaskKeys(c *commandv1.CompleteDriftTasks) ([]string, error) {
	if n := len(c.GetOutcomes()); n == 0 || n > maxDriftKeys {
		return nil, fmt.Errorf("complete drift tasks: %d keys, want 1 to %d", n, maxDriftKeys)
	}
	out := make([]string, 0, len(c.GetOutcomes()))
	for _, o := range c.GetOutcomes() {
		if err := CheckKeys("complete drift tasks", "key", o.GetKey()); err != nil {
			return nil, err
		}
		out = append(out, o.GetKey())
	}
	return out, nil
}
