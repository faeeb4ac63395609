package adminclient

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
)

// DecisionRecord is one logged decision (docs/decisions.md).
type DecisionRecord = decisionsv1.Record

// DecisionPage is GET /v1/decisions: records newest first, the cursor of
// the next (older) page, and the members whose records are missing.
type DecisionPage = decisionsv1.Page

// DecisionFilter selects GET /v1/decisions' records; zero fields match
// everything. Result is "allow" or "deny".
type DecisionFilter struct {
	Org, Team, Employee, Policy, Result string
	Since, Until                        time.Time
	Limit                               int
	Cursor                              string
}

// Decisions reads one page of the cluster's decision logs.
func (c *Client) Decisions(ctx context.Context, f DecisionFilter) (*DecisionPage, error) {
	q := url.Values{}
	setNonEmpty(q, "org", f.Org)
	setNonEmpty(q, "team", f.Team)
	setNonEmpty(q, "employee", f.Employee)
	setNonEmpty(q, "policy", f.Policy)
	setNonEmpty(q, "result", f.Result)
	setNonEmpty(q, "cursor", f.Cursor)
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		q.Set("until", f.Until.UTC().Format(time.RFC3339Nano))
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out DecisionPage
	return &out, c.Do(ctx, http.MethodGet, withQuery("/v1/decisions", q), nil, nil, &out)
}
