package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/server/decisionlog"
)

// decisionReader is the part of Backend that reads the decision logs.
type decisionReader interface {
	// Decisions gathers every member's newest matching records, merged by
	// time; maskIdentities hides employees and client addresses.
	Decisions(ctx context.Context, req *clusterv1.LocalDecisionsRequest, maskIdentities bool) (*decisionsv1.Page, error)
	// DecisionsMasked reports whether read tokens get identities masked.
	DecisionsMasked() bool
}

func (a *API) routeDecisions() {
	a.route("GET /v1/decisions", auth.RoleRead, a.getDecisions)
}

// getDecisions is GET /v1/decisions (docs/decisions.md).
func (a *API) getDecisions(w http.ResponseWriter, r *http.Request) error {
	req, err := parseDecisionsQuery(r.URL.Query(), time.Now())
	if err != nil {
		return err
	}
	role, _ := r.Context().Value(ctxRole).(auth.Role)
	page, err := a.b.Decisions(r.Context(), req, role < auth.RoleAdmin && a.b.DecisionsMasked())
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, page)
	return nil
}

// parseDecisionsQuery reads GET /v1/decisions' parameters: since and until
// are RFC 3339 times or durations back from now ("1h").
func parseDecisionsQuery(q url.Values, now time.Time) (*clusterv1.LocalDecisionsRequest, error) {
	req := &clusterv1.LocalDecisionsRequest{}
	for _, p := range []struct {
		name string
		dst  *string
	}{{"org", &req.Org}, {"team", &req.Team}, {"employee", &req.Employee}, {"policy", &req.Policy}, {"result", &req.Result}} {
		v, _, err := queryOne(q, p.name)
		if err != nil {
			return nil, err
		}
		*p.dst = v
	}
	switch req.Result {
	case "", decisionsv1.ResultAllow, decisionsv1.ResultDeny:
	default:
		return nil, badRequest(fmt.Sprintf("result: %q is neither allow nor deny", req.Result))
	}
	for _, p := range []struct {
		name string
		dst  *int64
	}{{"since", &req.SinceUnixNano}, {"until", &req.UntilUnixNano}} {
		v, ok, err := queryOne(q, p.name)
		if err != nil || !ok {
			if err != nil {
				return nil, err
			}
			continue
		}
		t, err := parseWhen(v, now)
		if err != nil {
			return nil, badRequest(p.name + ": " + err.Error())
		}
		*p.dst = t.UnixNano()
	}
	if req.UntilUnixNano != 0 && req.UntilUnixNano <= req.SinceUnixNano {
		return nil, badRequest("until: must be after since")
	}
	limit, err := queryInt(q, "limit", decisionlog.MaxLimit)
	if err != nil {
		return nil, err
	}
	if limit != nil {
		if *limit == 0 {
			return nil, badRequest("limit: must be at least 1")
		}
		req.Limit = uint32(*limit) //nolint:gosec // in [1, MaxLimit]
	}
	c, _, err := queryOne(q, "cursor")
	if err != nil {
		return nil, err
	}
	if req.Before, err = decisionlog.ParseCursor(c); err != nil {
		return nil, badRequest("cursor: " + err.Error())
	}
	return req, nil
}

// parseWhen reads a time as RFC 3339 or as a duration before now.
func parseWhen(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("duration %q must be above 0", v)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || t.Before(time.Unix(0, 0)) || t.Year() > 2200 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration such as 24h", v)
	}
	return t, nil
}
