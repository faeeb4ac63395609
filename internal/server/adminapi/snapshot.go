package adminapi

import (
	"fmt"
	"net/http"
	"strconv"
)

// Headers of GET /v1/snapshot. The digest is not among them: computing it
// would need a second pass over the whole file before the first byte is sent;
// `policyd snapshot save` computes it from the received file instead.
const (
	// HeaderAppliedIndex carries the applied Raft index the snapshot holds.
	HeaderAppliedIndex = "X-Policyd-Applied-Index"
)

// snapshot streams a consistent copy of this node's state database (one bbolt
// read transaction, as a Raft snapshot is taken) for backups. Writes keep
// going while it streams. With ?consistent=true the node first catches up
// with every write acknowledged before the request, so a backup taken from
// a follower misses nothing the cluster had confirmed.
//
// The body's length is announced up front, so that a transfer cut short is an
// error at the client rather than a truncated backup.
func (a *API) snapshot(w http.ResponseWriter, r *http.Request) error {
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	sn, err := a.b.Store().Snapshot()
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer sn.Release()
	idx := sn.Index()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(sn.Size(), 10))
	h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="policyd-state-%d.db"`, idx))
	h.Set("Cache-Control", "no-store")
	h.Set(HeaderAppliedIndex, strconv.FormatUint(idx, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	if _, err := sn.WriteTo(w); err != nil {
		// The status is sent; the client sees a short body and fails.
		a.logger.Warn("snapshot stream ended early", "applied_index", idx, "err", err)
	}
	return nil
}
