package feed

import (
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/server/shadow"
)

// maxShadowReportBytes is the read limit of a connection that declared the
// shadow capability, when feed.max_message_bytes is below it: a report of
// 256 entries (shadow.MaxEntries) with long policy names fits.
const maxShadowReportBytes = 128 << 10

// isShadow reports whether policy name is a shadow policy now.
func (h *Hub) isShadow(name string) bool {
	rp, ok := h.deps.Policies.Get(name)
	return ok && rp.Policy.Shadow()
}

// shadowReport hands a connection's shadow report to the node's aggregate,
// which takes only the shadow policies the connection was sent
// (docs/rollouts.md). A report it refuses is counted there; the feed has
// no answer to send.
func (h *Hub) shadowReport(c *conn, r *feedv1.ShadowReport) {
	if h.deps.Shadow == nil {
		return
	}
	h.mu.RLock()
	ident, set := c.ident, c.set
	h.mu.RUnlock()
	counts := make([]shadow.Count, 0, min(len(r.Counts), shadow.MaxEntries+1))
	for i, sc := range r.Counts {
		if i > shadow.MaxEntries {
			break // refused as too many: no need to copy them all
		}
		counts = append(counts, shadow.Count{Policy: sc.Policy, WouldBlock: sc.WouldBlock, WouldAllow: sc.WouldAllow, Evaluated: sc.Evaluated})
	}
	err := h.deps.Shadow.Report(shadow.Report{
		Member:   "ws:" + c.addr,
		Identity: ident,
		Counts:   counts,
		Served: func(name string) bool {
			if set == nil {
				return false
			}
			rp, ok := set.Lookup(name)
			return ok && rp.Policy.Shadow()
		},
		Exists: func(name string) bool {
			_, ok := h.deps.Policies.Get(name)
			return ok
		},
	})
	if err != nil {
		h.logger.Debug("feed shadow report ignored", "conn", c.addr, "employee", ident.Employee, "err", err)
	}
}
