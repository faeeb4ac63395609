package store

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// EntityDrift is a drift report.
const EntityDrift EntityType = "drift"

// Drift state (docs/drift.md). The webhook on every node proposes what its
// decisions ask for; the store keeps, in log order:
//   - reports (bucket drift_reports, by report id): every Detected and
//     Resolved DriftReport, with its delivery status. Creating one, and its
//     final delivery outcome, are events of type drift;
//   - tasks (drift_tasks, by task key): work the leader still has to do:
//     deliver a report, or patch a parent;
//   - open drifts (drift_open, by pair id): the Detected report a later
//     Resolved refers to.
//
// Deduplication happens here, in Apply, so that it follows the log order and
// is the same on every replica: a Detected report is delivered once per
// DriftDedupWindow, an approved drift's Resolved report once per occurrence
// (its report id) and window, another Resolved one only for an open drift,
// and identical patch tasks collapse into one while pending.
var (
	bucketDriftReports = []byte("drift_reports")
	bucketDriftTasks   = []byte("drift_tasks")
	bucketDriftOpen    = []byte("drift_open")
)

// DriftDedupWindow is how long a delivered Detected report suppresses the
// same report id, across the whole cluster.
const DriftDedupWindow = 10 * time.Minute

// Drift effect kinds.
const (
	DriftDetected = "detected"
	DriftResolved = "resolved"
	// DriftApproved is the Resolved report of an approved drift: recorded
	// whether or not a drift of its pair is open (it closes one that is),
	// and deduplicated like a Detected report, by its id (one per approved
	// change, however many webhooks observed it).
	DriftApproved = "approved"
)

// Report phases, as in the DriftReport JSON.
const (
	PhaseDetected = "Detected"
	PhaseResolved = "Resolved"
)

// Delivery states of a report, and of one callback URL.
const (
	DeliveryPending    = "pending"    // the leader has it to deliver
	DeliveryRetrying   = "retrying"   // a URL failed and will be retried
	DeliveryDelivered  = "delivered"  // every URL answered 2xx
	DeliveryFailed     = "failed"     // the leader gave up on some URL
	DeliverySuppressed = "suppressed" // an active snooze on the parent
	DeliveryNone       = "none"       // no callback was configured
)

// DriftObservation is one effect of an admission decision, as the proposer
// decided it.
type DriftObservation struct {
	// Kind is DriftDetected, DriftResolved or a patch kind.
	Kind string
	// Key identifies a patch task; equal for the same effect from any node.
	Key string
	// ReportID and PairID identify a report and its parent/child pair.
	ReportID string
	PairID   string
	Snoozed  bool
	// Effect is the admission effect, opaque here; Report the DriftReport.
	Effect []byte
	Report []byte
	// NodeID names the node whose webhook saw it.
	NodeID string
}

// IsReport reports whether the observation is a DriftReport (not a patch).
func (o *DriftObservation) IsReport() bool {
	return o.Kind == DriftDetected || o.Kind == DriftResolved || o.Kind == DriftApproved
}

// URLDelivery is the delivery of one report to one callback URL.
type URLDelivery struct {
	URL      string    `json:"url"`
	State    string    `json:"state"`
	Attempts uint32    `json:"attempts"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// DriftReport is a stored report: the DriftReport JSON as delivered, with
// what the cluster did with it.
type DriftReport struct {
	ID     string `json:"id"`
	Phase  string `json:"phase"`
	PairID string `json:"pair_id"`
	// Report is the DriftReport JSON, exactly as POSTed to the callbacks.
	Report json.RawMessage `json:"report"`
	// FirstSeen is when the report was first recorded; SentAt when its
	// current delivery began (the start of its dedup window); LastSeen the
	// latest observation.
	FirstSeen time.Time `json:"first_seen"`
	SentAt    time.Time `json:"sent_at,omitzero"`
	LastSeen  time.Time `json:"last_seen"`
	// Observations counts the decisions that reported it, from every node.
	Observations int    `json:"observations"`
	Delivery     string `json:"delivery"`
	// Deliveries is the outcome per callback URL, sorted by URL.
	Deliveries []URLDelivery `json:"deliveries,omitempty"`
	// Revision is the Raft index of the last change.
	Revision uint64 `json:"revision"`
}

// DriftTask is work the leader has to do.
type DriftTask struct {
	Key  string `json:"key"`
	Kind string `json:"kind"`
	// ReportID and PairID are set for a report delivery.
	ReportID string `json:"report_id,omitempty"`
	PairID   string `json:"pair_id,omitempty"`
	// Effect is the admission effect to perform (patch tasks).
	Effect json.RawMessage `json:"effect,omitempty"`
	// Index is the Raft index that created the task; tasks run in that
	// order.
	Index     uint64    `json:"index"`
	CreatedAt time.Time `json:"created_at"`
}

// reportTaskKey is the task key of a report delivery.
func reportTaskKey(id string) string { return "report/" + id }

// ObserveDrift records one decision's effects. It never fails on content:
// the decoder validated it (at most one report). Duplicates change only
// counters and write no event.
func (b *Batch) ObserveDrift(m Meta, obs []DriftObservation) error {
	for i := range obs {
		o := &obs[i]
		var err error
		switch o.Kind {
		case DriftDetected, DriftApproved:
			err = b.observeReport(m, o)
		case DriftResolved:
			err = b.observeResolved(m, o)
		default:
			err = b.putTask(m, DriftTask{Key: o.Key, Kind: o.Kind, Effect: o.Effect})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// observeReport records a Detected report, or an approved drift's Resolved
// one, delivering it once per DriftDedupWindow.
func (b *Batch) observeReport(m Meta, o *DriftObservation) error {
	var rec DriftReport
	found, err := getJSON(b.tx.Bucket(bucketDriftReports), o.ReportID, &rec)
	if err != nil {
		return err
	}
	inWindow := found && !rec.SentAt.IsZero() && m.ProcessedAt.Sub(rec.SentAt) < DriftDedupWindow
	switch {
	case inWindow || (found && o.Snoozed && rec.Delivery == DeliverySuppressed):
		// Seen already: by another node, or again within the window. (A
		// drift resolved and seen again within the window is not reopened
		// either: its receiver would get a second Resolved for one
		// Detected.)
		rec.Observations++
		rec.LastSeen = m.ProcessedAt
		return b.putReport(m, &rec, "")
	case o.Snoozed:
		// Recorded, not delivered; it starts no dedup window, so the same
		// drift is delivered once the snooze has expired.
		rec = newReport(m, o, found, rec)
		rec.Delivery = DeliverySuppressed
		return b.putReport(m, &rec, actionFor(found))
	default:
		rec = newReport(m, o, found, rec)
		rec.SentAt = m.ProcessedAt
		rec.Delivery = DeliveryPending
		open := b.tx.Bucket(bucketDriftOpen)
		if o.Kind == DriftApproved {
			err = open.Delete([]byte(o.PairID)) // the approval resolves an open drift
		} else {
			err = open.Put([]byte(o.PairID), []byte(o.ReportID))
		}
		if err != nil {
			return err
		}
		if err := b.putTask(m, DriftTask{Key: reportTaskKey(o.ReportID), Kind: o.Kind, ReportID: o.ReportID, PairID: o.PairID}); err != nil {
			return err
		}
		return b.putReport(m, &rec, actionFor(found))
	}
}

// observeResolved records a resolution only for a drift that is open: the
// webhook reports every approval and parent spec change, and most of them
// resolve nothing.
func (b *Batch) observeResolved(m Meta, o *DriftObservation) error {
	openB := b.tx.Bucket(bucketDriftOpen)
	detected := openB.Get([]byte(o.PairID))
	if detected == nil {
		return nil
	}
	// A Detected report that was never delivered needs no resolution.
	var det DriftReport
	found, err := getJSON(b.tx.Bucket(bucketDriftReports), string(detected), &det)
	if err != nil {
		return err
	}
	if err := openB.Delete([]byte(o.PairID)); err != nil {
		return err
	}
	if !found || det.Delivery == DeliverySuppressed {
		return nil
	}
	var rec DriftReport
	found, err = getJSON(b.tx.Bucket(bucketDriftReports), o.ReportID, &rec)
	if err != nil {
		return err
	}
	rec = newReport(m, o, found, rec)
	if o.Snoozed {
		rec.Delivery = DeliverySuppressed
		return b.putReport(m, &rec, actionFor(found))
	}
	rec.SentAt = m.ProcessedAt
	rec.Delivery = DeliveryPending
	if err := b.putTask(m, DriftTask{Key: reportTaskKey(o.ReportID), Kind: o.Kind, ReportID: o.ReportID, PairID: o.PairID}); err != nil {
		return err
	}
	return b.putReport(m, &rec, actionFor(found))
}

// newReport starts a new delivery episode of a report, keeping its history
// counters when it existed.
func newReport(m Meta, o *DriftObservation, found bool, old DriftReport) DriftReport {
	phase := PhaseDetected
	if o.Kind == DriftResolved || o.Kind == DriftApproved {
		phase = PhaseResolved
	}
	rec := DriftReport{
		ID: o.ReportID, Phase: phase, PairID: o.PairID, Report: bytes.Clone(o.Report),
		FirstSeen: m.ProcessedAt, LastSeen: m.ProcessedAt, Observations: 1,
	}
	if found {
		rec.FirstSeen = old.FirstSeen
		rec.Observations = old.Observations + 1
	}
	return rec
}

func actionFor(found bool) Action {
	if found {
		return ActionUpdate
	}
	return ActionCreate
}

// putReport stores rec at revision m.Index; a non-empty action also writes
// the event.
func (b *Batch) putReport(m Meta, rec *DriftReport, action Action) error {
	rec.Revision = m.Index
	raw, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode drift report %q: %w", rec.ID, err)
	}
	if err := b.tx.Bucket(bucketDriftReports).Put([]byte(rec.ID), raw); err != nil {
		return err
	}
	if action == "" {
		return nil
	}
	return b.record(m, EntityDrift, rec.ID, action, raw, []policy.Scope{{}})
}

// putTask adds a task unless one with the same key is pending.
func (b *Batch) putTask(m Meta, t DriftTask) error {
	bk := b.tx.Bucket(bucketDriftTasks)
	if bk.Get([]byte(t.Key)) != nil {
		return nil
	}
	t.Index, t.CreatedAt = m.Index, m.ProcessedAt
	raw, err := json.Marshal(&t)
	if err != nil {
		return fmt.Errorf("encode drift task %q: %w", t.Key, err)
	}
	if err := bk.Put([]byte(t.Key), raw); err != nil {
		return err
	}
	// Wakes the leader's follow-up worker; no event: a task is plumbing.
	b.changes = append(b.changes, EntityChange{Type: EntityDrift, ID: t.Key, Action: ActionCreate, Index: m.Index})
	return nil
}

// RecordDriftDelivery records delivery outcomes of one report. With final,
// the report's task is removed and its delivery state settled, as an event.
// An unknown report (pruned meanwhile) only loses its task.
func (b *Batch) RecordDriftDelivery(m Meta, reportID string, ds []URLDelivery, final bool) error {
	var rec DriftReport
	found, err := getJSON(b.tx.Bucket(bucketDriftReports), reportID, &rec)
	if err != nil {
		return err
	}
	if !found {
		// Pruned meanwhile: still drop the task, or the leader would retry
		// it forever.
		if final {
			return b.tx.Bucket(bucketDriftTasks).Delete([]byte(reportTaskKey(reportID)))
		}
		return nil
	}
	for _, d := range ds {
		d.At = m.ProcessedAt
		i := slices.IndexFunc(rec.Deliveries, func(x URLDelivery) bool { return x.URL == d.URL })
		if i < 0 {
			rec.Deliveries = append(rec.Deliveries, d)
		} else {
			rec.Deliveries[i] = d
		}
	}
	slices.SortFunc(rec.Deliveries, func(a, b URLDelivery) int { return strings.Compare(a.URL, b.URL) })
	action := Action("")
	if final {
		if err := b.tx.Bucket(bucketDriftTasks).Delete([]byte(reportTaskKey(reportID))); err != nil {
			return err
		}
		rec.Delivery = DeliveryDelivered
		if len(rec.Deliveries) == 0 {
			rec.Delivery = DeliveryNone
		}
		for _, d := range rec.Deliveries {
			if d.State != DeliveryDelivered {
				rec.Delivery = DeliveryFailed
			}
		}
		action = ActionUpdate
	} else if rec.Delivery == DeliveryPending {
		rec.Delivery = DeliveryRetrying
	}
	return b.putReport(m, &rec, action)
}

// CompleteDriftTasks removes finished patch tasks. Unknown keys are
// ignored: completing is idempotent.
func (b *Batch) CompleteDriftTasks(m Meta, keys []string) error {
	bk := b.tx.Bucket(bucketDriftTasks)
	for _, k := range keys {
		if bk.Get([]byte(k)) == nil {
			continue
		}
		if err := bk.Delete([]byte(k)); err != nil {
			return err
		}
		b.changes = append(b.changes, EntityChange{Type: EntityDrift, ID: k, Action: ActionDelete, Index: m.Index})
	}
	return nil
}

// PruneDrift deletes reports last seen before cutoff whose delivery is
// settled, at most MaxPrunePerBatch of them, and the open-drift records that
// point at deleted reports. It returns how many reports it deleted.
func (b *Batch) PruneDrift(cutoff time.Time) (int, error) {
	reports := b.tx.Bucket(bucketDriftReports)
	var doomed [][]byte
	err := reports.ForEach(func(k, v []byte) error {
		if len(doomed) >= MaxPrunePerBatch {
			return nil
		}
		var rec DriftReport
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("decode stored drift report %q: %w", k, err)
		}
		if rec.LastSeen.Before(cutoff) && rec.Delivery != DeliveryPending && rec.Delivery != DeliveryRetrying {
			doomed = append(doomed, bytes.Clone(k))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, k := range doomed {
		if err := reports.Delete(k); err != nil {
			return 0, err
		}
	}
	var stale [][]byte
	openB := b.tx.Bucket(bucketDriftOpen)
	if err := openB.ForEach(func(k, v []byte) error {
		if reports.Get(v) == nil {
			stale = append(stale, bytes.Clone(k))
		}
		return nil
	}); err != nil {
		return 0, err
	}
	for _, k := range stale {
		if err := openB.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(doomed), nil
}

// DriftTasks returns the pending tasks in the order they were created.
func (s *Store) DriftTasks() ([]DriftTask, error) {
	var out []DriftTask
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDriftTasks).ForEach(func(k, v []byte) error {
			var t DriftTask
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("decode stored drift task %q: %w", k, err)
			}
			out = append(out, t)
			return nil
		})
	})
	slices.SortStableFunc(out, func(a, b DriftTask) int {
		if a.Index != b.Index {
			return cmp.Compare(a.Index, b.Index)
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out, err
}

// DriftReport returns one report or ErrNotFound.
func (s *Store) DriftReport(id string) (*DriftReport, error) {
	var rec DriftReport
	err := s.view(func(tx *bolt.Tx) error {
		found, err := getJSON(tx.Bucket(bucketDriftReports), id, &rec)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("drift report %q: %w", id, ErrNotFound)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// DriftFilter selects reports. Zero values select everything; Limit 0 means
// no limit.
type DriftFilter struct {
	Phase    string
	Delivery string
	Limit    int
}

// DriftReports returns the reports matching f, most recently seen first
// (ties by id).
func (s *Store) DriftReports(f DriftFilter) ([]DriftReport, error) {
	out := []DriftReport{}
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDriftReports).ForEach(func(k, v []byte) error {
			var rec DriftReport
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode stored drift report %q: %w", k, err)
			}
			if (f.Phase != "" && rec.Phase != f.Phase) || (f.Delivery != "" && rec.Delivery != f.Delivery) {
				return nil
			}
			out = append(out, rec)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b DriftReport) int {
		if c := b.LastSeen.Compare(a.LastSeen); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}
