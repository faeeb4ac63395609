package console

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/auth"
)

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
		stop := context.AfterFunc(c.streams, cancel)
		defer stop()
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

// liveOverview sends the Overview's body each time the node's one shared
// render of it changes.
func (c *Console) liveOverview(ctx context.Context, w *sseWriter, _ *http.Request, _ *session, _ *adminclient.Client) error {
	ch, leave := c.liveOverviewHub.subscribe()
	defer leave()
	for {
		select {
		case <-ctx.Done():
			return nil
		case body := <-ch:
			if err := w.send("body", "", body); err != nil {
				return nil // the browser left
			}
		}
	}
}

// overviewHub renders the live Overview once for every browser watching
// it on this node, every LivePeriod and only while one is: five open
// tabs cost one render, none cost nothing. It reads as the console itself
// with the read role, as every viewer has at least that.
type overviewHub struct {
	c    *Console
	mu   sync.Mutex
	subs map[chan string]struct{}
	last string
	stop chan struct{} // nil while no browser watches
}

// subscribe returns a channel of rendered bodies, the latest first.
func (h *overviewHub) subscribe() (<-chan string, func()) {
	ch := make(chan string, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[chan string]struct{}{}
	}
	h.subs[ch] = struct{}{}
	if h.last != "" {
		ch <- h.last
	}
	if h.stop == nil {
		h.stop = make(chan struct{})
		go h.run(h.stop)
	}
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, ch)
		if len(h.subs) == 0 && h.stop != nil {
			close(h.stop)
			h.stop, h.last = nil, ""
		}
	}
}

func (h *overviewHub) run(stop chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	reader := &session{Token: auth.Token{Name: "console", Role: auth.RoleRead}, AuthOff: h.c.cfg.Tokens() == nil}
	t := time.NewTicker(h.c.cfg.LivePeriod)
	defer t.Stop()
	for {
		var buf bytes.Buffer
		if err := h.c.pages["overview"].ExecuteTemplate(&buf, "overview_body", h.c.overviewData(ctx, h.c.client(reader))); err != nil {
			h.c.logger.Error("console: render the live overview", "err", err)
		}
		h.mu.Lock()
		if body := buf.String(); ctx.Err() == nil && body != h.last {
			h.last = body
			for ch := range h.subs {
				select { // a slow browser gets the latest only
				case <-ch:
				default:
				}
				ch <- body
			}
		}
		h.mu.Unlock()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}
