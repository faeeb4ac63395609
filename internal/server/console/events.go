package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"

	"github.com/policyd/policyd/adminclient"
)

// eventsShown is how many of the newest events the Events page starts with.
const eventsShown = 100

type eventsData struct {
	Events []adminclient.Event
	Filter adminclient.EventFilter
	// Live is the live view's URL, with the filter and the last id shown.
	Live string
}

func eventFilterOf(q url.Values) adminclient.EventFilter {
	return adminclient.EventFilter{Type: q.Get("type"), Org: q.Get("org"), OrgSet: q.Get("org") != "", Actor: q.Get("actor")}
}

func (c *Console) events(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	f := eventFilterOf(r.URL.Query())
	events, last, err := newestEvents(r.Context(), api, f, eventsShown)
	if err != nil {
		return "", "", nil, err
	}
	v := url.Values{}
	for k, s := range map[string]string{"type": f.Type, "org": f.Org, "actor": f.Actor} {
		if s != "" {
			v.Set(k, s)
		}
	}
	v.Set("after", strconv.FormatUint(last, 10))
	return "events", "Events", &eventsData{Events: events, Filter: f, Live: "/ui/live/events?" + v.Encode()}, nil
}

// newestEvents returns the n newest events matching f, newest first, and
// the log position they were read to. The API reads forward only, so it
// looks back from the applied index in widening windows.
func newestEvents(ctx context.Context, api *adminclient.Client, f adminclient.EventFilter, n int) ([]adminclient.Event, uint64, error) {
	cl, err := api.Cluster(ctx)
	if err != nil {
		return nil, 0, err
	}
	end := cl.AppliedIndex
	var got []adminclient.Event   // the newest n read so far, oldest first
	top := uint64(math.MaxUint64) // events above top are read already
	for window := uint64(1024); ; window *= 16 {
		start := uint64(0)
		if end > window {
			start = end - window
		}
		// Each wider window reads only what the narrower one left below it.
		var older []adminclient.Event
		f.After = start
		for {
			f.Limit = 1000
			page, err := api.Events(ctx, f)
			if err != nil {
				return nil, 0, err
			}
			for _, ev := range page.Events {
				if ev.ID <= top {
					older = append(older, ev)
				}
			}
			if len(older) > n {
				older = append(older[:0], older[len(older)-n:]...)
			}
			if top == math.MaxUint64 {
				end = max(end, page.LastID)
			}
			if len(page.Events) < f.Limit || page.LastID >= top {
				break
			}
			f.After = page.LastID
		}
		got = append(older, got...)
		if len(got) > n {
			got = got[len(got)-n:]
		}
		if len(got) >= n || start == 0 {
			break
		}
		top = start
	}
	for i, j := 0, len(got)-1; i < j; i, j = i+1, j-1 {
		got[i], got[j] = got[j], got[i]
	}
	return got, end, nil
}

// liveEvents relays the API's event watch as rendered table rows.
func (c *Console) liveEvents(ctx context.Context, w *sseWriter, r *http.Request, _ *session, api *adminclient.Client) error {
	q := r.URL.Query()
	f := eventFilterOf(q)
	if a := q.Get("after"); a != "" {
		f.After, _ = strconv.ParseUint(a, 10, 64)
	}
	// A reconnecting browser says where it was.
	if id, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64); err == nil {
		f.After = id
	}
	body, err := api.WatchEvents(ctx, f)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := w.send("ready", "", ""); err != nil {
		return nil
	}
	err = adminclient.ReadEvents(body, func(ev adminclient.StreamEvent) error {
		if ev.Event == "reset" {
			return nil // the page shows what it has; older events are gone
		}
		var e adminclient.Event
		if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
			return fmt.Errorf("event stream: %w", err)
		}
		var buf bytes.Buffer
		if err := c.pages["events"].ExecuteTemplate(&buf, "event_row", e); err != nil {
			return fmt.Errorf("render: %w", err)
		}
		return w.send("row", ev.ID, buf.String())
	})
	if ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return errors.New("the event stream ended; reconnecting")
	}
	return err
}
