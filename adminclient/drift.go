package adminclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// DriftList is GET /v1/drift.
type DriftList struct {
	Reports []DriftReport `json:"reports"`
}

// DriftFilter selects drift reports.
type DriftFilter struct {
	Phase, Delivery string
	Limit           int
	Consistent      bool
}

// DriftReport is a stored drift report and what the cluster did with it.
type DriftReport struct {
	ID           string          `json:"id"`
	Phase        string          `json:"phase"`
	PairID       string          `json:"pair_id"`
	Report       json.RawMessage `json:"report"`
	FirstSeen    time.Time       `json:"first_seen"`
	SentAt       time.Time       `json:"sent_at,omitzero"`
	LastSeen     time.Time       `json:"last_seen"`
	Observations int             `json:"observations"`
	Delivery     string          `json:"delivery"`
	Deliveries   []URLDelivery   `json:"deliveries,omitempty"`
	Revision     uint64          `json:"revision"`
}

// Drift lists drift reports.
func (c *Client) Drift(ctx context.Context, f DriftFilter) (*DriftList, error) {
	q := url.Values{}
	setNonEmpty(q, "phase", f.Phase)
	setNonEmpty(q, "delivery", f.Delivery)
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.Consistent {
		q.Set("consistent", "true")
	}
	var out DriftList
	return &out, c.Do(ctx, http.MethodGet, withQuery("/v1/drift", q), nil, nil, &out)
}

// maxDriftLimit is the API's page limit for drift reports.
const maxDriftLimit = 1000

// DriftReport finds one report by id. The API has no per-report route, so
// it looks through the newest 1,000; ErrNotFound beyond.
func (c *Client) DriftReport(ctx context.Context, id string) (*DriftReport, error) {
	list, err := c.Drift(ctx, DriftFilter{Limit: maxDriftLimit})
	if err != nil {
		return nil, err
	}
	for i := range list.Reports {
		if list.Reports[i].ID == id {
			return &list.Reports[i], nil
		}
	}
	return nil, &Error{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("drift report %q not found", id)}
}
