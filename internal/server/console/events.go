package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

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
	var got []adminclient.Event
	for window := uint64(1024); ; window *= 16 {
		f.After = 0
		if end > window {
			f.After = end - window
		}
		got = got[:0]
		for {
			f.Limit = 1000
			page, err := api.Events(ctx, f)
			if err != nil {
				return nil, 0, err
			}
			got = append(got, page.Events...)
			if len(got) > n {
				got = append(got[:0], got[len(got)-n:]...)
			}
			end = max(end, page.LastID)
			if len(page.Events) < f.Limit {
				break
			}
			f.After = page.LastID
		}
		if len(got) >= n || f.After == 0 || end <= window {
			break
		}
	}
	for i, j := 0, len(got)-1; i < j; i, j = i+1, j-1 {
		got[i], got[j] = got[j], got[i]
	}
	return got, end, nil
}

// liveFunc serves one live view's stream until the browser leaves.
type liveFunc func(ctx context.Context, w *sseWriter, r *http.Request, s *session, api *adminclient.Client) error

// live registers a Server-Sent Events view. It runs only while a browser
// holds it open: no browser, no work.
func (c *Console) live(pattern string, fn liveFunc) {
	c.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s, ok := c.session(w, r)
		if !ok {
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		select {
		case c.liveSlots <- struct{}{}:
			defer func() { <-c.liveSlots }()
		default:
			http.Error(w, "too many live views open on this node; the page still works without one", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		sw := &sseWriter{w: w, rc: http.NewResponseController(w)}
		// The session ends the stream: a browser reconnects and is sent
		// to sign in when its session is gone.
		ctx, cancel := context.WithDeadline(r.Context(), s.Expires)
		defer cancel()
		if err := fn(ctx, sw, r, s, c.client(s)); err != nil && ctx.Err() == nil {
			c.logger.Debug("console live view ended", "path", r.URL.Path, "err", err)
			_ = sw.send("problem", "", err.Error())
		}
	})
}

// sseWriter writes Server-Sent Events.
type sseWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

// send writes one event; data may span lines.
func (s *sseWriter) send(event, id, data string) error {
	var b strings.Builder
	if id != "" {
		fmt.Fprintf(&b, "id: %s\n", id)
	}
	fmt.Fprintf(&b, "event: %s\n", event)
	for line := range strings.SplitSeq(data, "\n") {
		fmt.Fprintf(&b, "data: %s\n", line)
	}
	b.WriteString("\n")
	if _, err := io.WriteString(s.w, b.String()); err != nil {
		return err
	}
	return s.rc.Flush()
}

// liveOverview re-renders the Overview's body every LivePeriod and sends
// it when it changed. It reads through this node, so it keeps going while
// another node, the leader among them, is down.
func (c *Console) liveOverview(ctx context.Context, w *sseWriter, _ *http.Request, _ *session, api *adminclient.Client) error {
	t := time.NewTicker(c.cfg.LivePeriod)
	defer t.Stop()
	var last []byte
	for {
		var buf bytes.Buffer
		if err := c.pages["overview"].ExecuteTemplate(&buf, "overview_body", c.overviewData(ctx, api)); err != nil {
			return fmt.Errorf("render: %w", err)
		}
		if !bytes.Equal(buf.Bytes(), last) {
			if err := w.send("body", "", buf.String()); err != nil {
				return nil // the browser left
			}
			last = buf.Bytes()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
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
