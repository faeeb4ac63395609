package adminapi

import (
	"net/http"

	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/store"
)

// reloadStatuser is the part of the Backend that reports the reload
// controller (docs/operations.md).
type reloadStatuser interface {
	// ReloadStatus is this node's controller status: running only on the
	// leader.
	ReloadStatus() reload.Status
}

// ReloadView is GET /v1/reload: this node's controller status, and the
// replicated state every node holds (the hash cache, the pending-restart
// queue, and the last restarts and failed attempts, newest first).
type ReloadView struct {
	Controller   reload.Status         `json:"controller"`
	AppliedIndex uint64                `json:"applied_index"`
	Cache        []store.ReloadHash    `json:"cache"`
	Queue        []store.ReloadPending `json:"queue"`
	Restarts     []store.ReloadRestart `json:"restarts"`
	Errors       []store.ReloadError   `json:"errors"`
}

func (a *API) reloadState(w http.ResponseWriter, r *http.Request) error {
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	st, err := a.b.Store().ReloadState()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ReloadView{
		Controller: a.b.ReloadStatus(), AppliedIndex: st.Index,
		Cache: st.Hashes, Queue: st.Pending, Restarts: st.Restarts, Errors: st.Errors,
	})
	return nil
}
