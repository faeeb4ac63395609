package adminapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/policyd/policyd/internal/store"
)

const (
	defaultEventLimit = 100
	maxEventLimit     = 1000
	// watchKeepAlive keeps idle event streams open through proxies.
	watchKeepAlive = 15 * time.Second
)

var knownEntityTypes = map[store.EntityType]bool{
	store.EntityPolicy: true, store.EntityEmployee: true, store.EntityDrift: true, store.EntityReload: true,
	store.EntityRetention: true, store.EntityRollout: true,
}

// eventFilter reads type, org, actor and after. `org=` (present but empty) selects
// global events; an absent org selects every org.
func eventFilter(r *http.Request) (store.EventFilter, error) {
	q := r.URL.Query()
	f := store.EventFilter{Type: store.EntityType(q.Get("type")), Org: q.Get("org"), OrgSet: q.Has("org"), Actor: q.Get("actor")}
	if f.Type != "" && !knownEntityTypes[f.Type] {
		return f, badRequest(fmt.Sprintf("type: unknown entity type %q (policy, employee, drift, reload, retention, rollout)", f.Type))
	}
	after, err := queryUint(r, "after")
	if err != nil {
		return f, err
	}
	f.After = after
	return f, nil
}

func (a *API) listEvents(w http.ResponseWriter, r *http.Request) error {
	f, err := eventFilter(r)
	if err != nil {
		return err
	}
	limit, err := queryUint(r, "limit")
	if err != nil {
		return err
	}
	switch {
	case limit == 0:
		f.Limit = defaultEventLimit
	case limit > maxEventLimit:
		return badRequest(fmt.Sprintf("limit: at most %d", maxEventLimit))
	default:
		f.Limit = int(limit)
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	page, err := a.b.Store().ListEvents(f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// watchEvents streams events after `after` (or Last-Event-ID) as Server-Sent
// Events: `id: <event id>`, `event: <entity type>`, `data: <event JSON>`.
// If retention already removed events the client has not seen, it first
// sends `event: reset` with {"pruned_through": N}: the client must reload
// state, then continue. The stream ends when the client goes away or the
// server shuts down.
func (a *API) watchEvents(w http.ResponseWriter, r *http.Request) error {
	f, err := eventFilter(r)
	if err != nil {
		return err
	}
	if !r.URL.Query().Has("after") {
		if id := r.Header.Get("Last-Event-ID"); id != "" {
			if f.After, err = strconv.ParseUint(id, 10, 64); err != nil {
				return badRequest(fmt.Sprintf("Last-Event-ID: %q is not an event id", id))
			}
		}
	}
	rc := http.NewResponseController(w)
	// Subscribe before the first read, so nothing applied in between is missed.
	sub := a.b.Store().Subscribe()
	defer sub.Close()

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil // the client is gone; the status line is already sent
	}
	keepAlive := time.NewTicker(watchKeepAlive)
	defer keepAlive.Stop()
	f.Limit = 500
	for {
		page, err := a.b.Store().ListEvents(f)
		if err != nil {
			a.logger.Warn("event watch: read failed", "err", err)
			return nil
		}
		if page.PrunedThrough > f.After {
			fmt.Fprintf(w, "event: reset\ndata: {\"pruned_through\":%d}\n\n", page.PrunedThrough)
		}
		for _, ev := range page.Events {
			data, err := json.Marshal(ev)
			if err != nil {
				a.logger.Error("event watch: encode", "id", ev.ID, "err", err)
				return nil
			}
			fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.ID, ev.EntityType, data)
		}
		f.After = max(page.LastID, page.PrunedThrough, f.After)
		if err := rc.Flush(); err != nil {
			return nil
		}
		if len(page.Events) == f.Limit {
			continue // more are waiting
		}
		for waiting := true; waiting; {
			select {
			case <-r.Context().Done():
				return nil
			case <-a.streams.Done():
				return nil
			case _, ok := <-sub.Ready():
				if !ok {
					return nil // store closed
				}
				sub.Next()
				waiting = false
			case <-keepAlive.C:
				fmt.Fprint(w, ": keepalive\n\n")
				if err := rc.Flush(); err != nil {
					return nil
				}
			}
		}
	}
}
