package adminapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// History is GET /v1/policies/{name}/history and /v1/employees/{id}/history:
// the revisions the event log still holds, oldest first.
type History struct {
	EntityType store.EntityType `json:"entity_type"`
	ID         string           `json:"id"`
	// PrunedThrough is the highest event ID retention removed: older
	// revisions are gone.
	PrunedThrough uint64     `json:"pruned_through"`
	Revisions     []Revision `json:"revisions"`
}

// Revision is one write of an entity, from its event.
type Revision struct {
	Revision  uint64       `json:"revision"`
	Time      time.Time    `json:"time"`
	Action    store.Action `json:"action"`
	Actor     string       `json:"actor,omitempty"`
	RequestID string       `json:"request_id,omitempty"`
	// RevertedTo is set when the write was a revert to that revision.
	RevertedTo uint64 `json:"reverted_to,omitempty"`
}

func (e entity[T]) historyHandler(a *API) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		key, err := e.pathKey(r)
		if err != nil {
			return err
		}
		if err := a.maybeConsistent(r); err != nil {
			return err
		}
		evs, pruned, err := a.b.Store().History(e.typ, key)
		if err != nil {
			return err
		}
		h := History{EntityType: e.typ, ID: key, PrunedThrough: pruned, Revisions: make([]Revision, 0, len(evs))}
		for _, ev := range evs {
			h.Revisions = append(h.Revisions, Revision{
				Revision: ev.ID, Time: ev.ProcessedAt, Action: ev.Action,
				Actor: ev.Actor, RequestID: ev.RequestID, RevertedTo: ev.RevertedTo,
			})
		}
		writeJSON(w, http.StatusOK, h)
		return nil
	}
}

// revisionHandler serves one revision's content as the write stored it
// (GET /v1/policies/{name}/revisions/{rev}): what a revert to it writes
// back, and what `policyd policy diff` compares.
func (e entity[T]) revisionHandler(a *API) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		key, err := e.pathKey(r)
		if err != nil {
			return err
		}
		rev, err := strconv.ParseUint(r.PathValue("rev"), 10, 64)
		if err != nil || rev == 0 {
			return badRequest(fmt.Sprintf("rev: %q is not a revision number", r.PathValue("rev")))
		}
		if err := a.maybeConsistent(r); err != nil {
			return err
		}
		ev, err := a.b.Store().Revision(e.typ, key, rev)
		if err != nil {
			return err
		}
		w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(rev, 10)))
		writeRawJSON(w, http.StatusOK, ev.Data)
		return nil
	}
}

// RevertRequest is POST /v1/policies/{name}/revert (and employees): write
// revision To's content back as a new revision. IfMatch (or the If-Match
// header) is the revision the caller saw as current, 0 for a deleted
// entity; without either, the revision this node holds is used, so a write
// racing the revert still fails it with 409.
type RevertRequest struct {
	To      uint64  `json:"to"`
	IfMatch *uint64 `json:"if_match,omitempty"`
}

func (e entity[T]) revertHandler(a *API) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		key, hdr, err := e.target(r)
		if err != nil {
			return err
		}
		body, err := readBody(r)
		if err != nil {
			return err
		}
		var req RevertRequest
		if err := policy.DecodeStrict(body, &req); err != nil {
			return err
		}
		if req.To == 0 {
			return badRequest("to: required, the revision to write back")
		}
		cond := req.IfMatch
		switch {
		case cond != nil && hdr != nil && *cond != *hdr:
			return badRequest(fmt.Sprintf("if_match %d and the If-Match header %d differ", *cond, *hdr))
		case cond == nil && hdr != nil:
			cond = hdr
		case cond == nil:
			if err := a.maybeConsistent(r); err != nil {
				return err
			}
			var cur uint64
			v, err := e.get(key)
			switch {
			case err == nil:
				cur = e.revision(v)
			case !errors.Is(err, store.ErrNotFound):
				return err
			}
			cond = &cur
		}
		ev, err := a.b.Store().Revision(e.typ, key, req.To)
		if err != nil {
			return err
		}
		v, err := e.decodeStored(ev.Data)
		if err != nil {
			return fmt.Errorf("decode revision %d of %s %q: %w", req.To, e.typ, key, err)
		}
		// The rules may have changed since: the old content must pass
		// today's validation to be written again.
		if err := e.validate(v); err != nil {
			return fmt.Errorf("revision %d of %s %q: %w", req.To, e.typ, key, err)
		}
		cmd, err := e.put(v, cond)
		if err != nil {
			return err
		}
		cmd.RevertedTo = req.To
		res, err := a.commit(r, cmd)
		if err != nil {
			return err
		}
		return e.answerPut(w, r, a, key, res)
	}
}

func decodeStoredEmployee(raw []byte) (*policy.Employee, error) {
	var e policy.Employee
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, err
	}
	return &e, nil
}
