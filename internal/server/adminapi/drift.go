package adminapi

import (
	"fmt"
	"net/http"

	"github.com/policyd/policyd/internal/store"
)

const (
	defaultDriftLimit = 100
	maxDriftLimit     = 1000
)

var (
	driftPhases     = map[string]bool{store.PhaseDetected: true, store.PhaseResolved: true}
	driftDeliveries = map[string]bool{
		store.DeliveryPending: true, store.DeliveryRetrying: true, store.DeliveryDelivered: true,
		store.DeliveryFailed: true, store.DeliverySuppressed: true, store.DeliveryNone: true,
	}
)

// driftList is GET /v1/drift.
type driftList struct {
	Reports []store.DriftReport `json:"reports"`
}

// listDrift lists drift reports, most recently seen first, filtered by
// phase (Detected|Resolved) and delivery (pending, retrying, delivered,
// failed, suppressed, none); limit defaults to 100, at most 1000.
// ?consistent=true reads at the leader's commit index.
func (a *API) listDrift(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := store.DriftFilter{Phase: q.Get("phase"), Delivery: q.Get("delivery")}
	if f.Phase != "" && !driftPhases[f.Phase] {
		return badRequest(fmt.Sprintf("phase: %q is not Detected or Resolved", f.Phase))
	}
	if f.Delivery != "" && !driftDeliveries[f.Delivery] {
		return badRequest(fmt.Sprintf("delivery: unknown state %q (pending, retrying, delivered, failed, suppressed, none)", f.Delivery))
	}
	limit, err := queryUint(r, "limit")
	if err != nil {
		return err
	}
	switch {
	case limit == 0:
		f.Limit = defaultDriftLimit
	case limit > maxDriftLimit:
		return badRequest(fmt.Sprintf("limit: at most %d", maxDriftLimit))
	default:
		f.Limit = int(limit)
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	reports, err := a.b.Store().DriftReports(f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, driftList{Reports: reports})
	return nil
}
