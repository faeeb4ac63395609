package feed

import (
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/server/decisionlog"
)

// maxDecisionLogBytes is the read limit of a connection invited to send
// decision_log messages: a batch at its caps and the envelope around it.
const maxDecisionLogBytes = decisionsv1.MaxBatchBytes + 64<<10

// takesDecisions reports whether c is invited to send decision_log
// messages: it declared the capability and the node keeps decisions.
func (h *Hub) takesDecisions(c *conn) bool {
	return h.deps.Decisions != nil && c.caps.DecisionLog
}

// decisionLog hands a connection's batch to the node's decision log, under
// the identity the connection is served. The feed has no answer to send:
// refused records are lost and counted there (docs/decisions.md).
func (h *Hub) decisionLog(c *conn, b *decisionsv1.Batch) {
	h.mu.RLock()
	ident := c.ident
	h.mu.RUnlock()
	recs := make([][]byte, len(b.Records))
	for i, r := range b.Records {
		recs[i] = r
	}
	res, err := h.deps.Decisions.Ingest(decisionlog.Batch{
		Identity: ident, ClientAddress: c.addr, Transport: "ws", Records: recs, Dropped: b.Dropped,
	})
	if err != nil || res.Refused > 0 {
		h.logger.Debug("feed decision batch refused in part", "conn", c.addr, "employee", ident.Employee,
			"accepted", res.Accepted, "refused", res.Refused, "err", err)
	}
}
