package adminapi

import (
	"context"
	"net/http"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/apierror"
)

// TransferLeaderRequest is POST /v1/cluster/transfer-leader: ID names the
// voter to lead next; "" lets raft pick the most up-to-date one.
type TransferLeaderRequest struct {
	ID string `json:"id,omitempty"`
}

// TransferLeaderResult says who led before and who leads after.
type TransferLeaderResult struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// leaderTransferer is the optional Backend method behind the route; it must
// run on the leader and refuses (409) elsewhere, naming the leader.
type leaderTransferer interface {
	TransferLeadership(ctx context.Context, id string) (from, to string, err error)
}

func (a *API) transferLeader(w http.ResponseWriter, r *http.Request) error {
	lt, ok := a.b.(leaderTransferer)
	if !ok {
		return &apiError{status: http.StatusNotImplemented, code: apierror.CodeInternal, msg: "this node cannot transfer leadership"}
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req TransferLeaderRequest
	if err := policy.DecodeStrict(body, &req); err != nil {
		return err
	}
	from, to, err := lt.TransferLeadership(r.Context(), req.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, TransferLeaderResult{From: from, To: to})
	return nil
}
