package adminapi

import (
	"fmt"
	"net/http"
	"time"

	"github.com/policyd/policyd/internal/server/proxystatus"
)

// Proxy-status waits: ?wait= is capped so that a request cannot be held
// for ever, and the view is re-read at proxyStatusPoll while waiting.
const (
	maxProxyStatusWait = 5 * time.Minute
	proxyStatusPoll    = 100 * time.Millisecond
)

// proxyStatus is GET /v1/proxy-status[?wait=30s]: with wait, it answers as soon as
// every connected discovery client has answered its newest version, or when
// wait has passed (then with done: false).
func (a *API) proxyStatus(w http.ResponseWriter, r *http.Request) error {
	var wait time.Duration
	if s := r.URL.Query().Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 || d > maxProxyStatusWait {
			return badRequest(fmt.Sprintf("wait: %q must be a duration between 0s and %v", s, maxProxyStatusWait))
		}
		wait = d
	}
	deadline := time.Now().Add(wait)
	for {
		clients, unreachable, err := a.b.Clients(r.Context())
		if err != nil {
			return err
		}
		ro := proxystatus.Compute(clients)
		ro.Unreachable = unreachable
		if ro.Done || !time.Now().Before(deadline) {
			writeJSON(w, http.StatusOK, ro)
			return nil
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-a.streams.Done():
			writeJSON(w, http.StatusOK, ro)
			return nil
		case <-time.After(min(proxyStatusPoll, time.Until(deadline))):
		}
	}
}
