package adminclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
)

// DecisionRecord is one logged decision (docs/decisions.md).
type DecisionRecord = decisionsv1.Record

// DecisionRequest is a logged request (DecisionRecord.Request).
type DecisionRequest = decisionsv1.Request

// ImpactCounts and ImpactTeam are an ImpactReport's parts.
type (
	ImpactCounts = decisionsv1.ImpactCounts
	ImpactTeam   = decisionsv1.ImpactTeam
)

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

// ImpactReport is POST /v1/impact's answer (docs/decisions.md).
type ImpactReport = decisionsv1.ImpactReport

// ImpactRequest is the body of POST /v1/impact: a change set in the form
// StartRollout takes, and which logged decisions to replay. Since is an
// RFC 3339 time or a duration back from now ("24h", the default).
type ImpactRequest struct {
	Changes     []StartChange `json:"changes"`
	Since       string        `json:"since,omitempty"`
	Org         string        `json:"org,omitempty"`
	Team        string        `json:"team,omitempty"`
	MaxExamples int           `json:"max_examples,omitempty"`
	Timeout     string        `json:"timeout,omitempty"`
}

// Impact replays the logged decisions of the identities req's changes
// affect, with and without them, on every node.
func (c *Client) Impact(ctx context.Context, req ImpactRequest) (*ImpactReport, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode impact request: %w", err)
	}
	var out ImpactReport
	return &out, c.Do(ctx, http.MethodPost, "/v1/impact", nil, body, &out)
}
