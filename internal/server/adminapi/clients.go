package adminapi

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/server/proxystatus"
)

// ClientsView is GET /v1/clients.
type ClientsView struct {
	// Clients is the page asked for: every matching sidecar without limit
	// and offset. With any query parameter it is sorted by node, then
	// client address, then connection time; without one it keeps the
	// backend's order (this node's first), as before filters existed.
	Clients []ClientView `json:"clients"`
	// Unreachable lists members that did not answer; their sidecars are
	// missing from Clients.
	Unreachable []string `json:"unreachable_nodes,omitempty"`
	// Total counts the sidecars that match every filter, before paging.
	Total int `json:"total"`
	// Counts is per state over the node and scope filters only, so that a
	// console can label each state's tab without a request per tab.
	Counts ClientCounts `json:"counts"`
	// Offset and Limit echo the request's, when it gave them.
	Offset *int `json:"offset,omitempty"`
	Limit  *int `json:"limit,omitempty"`
}

// ClientCounts counts sidecars per state. Stale overlaps the others: a
// stale sidecar is also pending, acked or nacked.
type ClientCounts struct {
	Pending int `json:"pending"`
	Acked   int `json:"acked"`
	Nacked  int `json:"nacked"`
	Stale   int `json:"stale"`
}

// ClientView is one connected sidecar.
type ClientView struct {
	Node          string    `json:"node"`
	ClientAddress string    `json:"client_address"`
	Transport     string    `json:"transport"`
	Org           string    `json:"org"`
	Team          string    `json:"team"`
	Employee      string    `json:"employee"`
	Version       string    `json:"version"`
	State         string    `json:"state"`
	AckedVersion  string    `json:"acked_version,omitempty"`
	NackMessage   string    `json:"nack_message,omitempty"`
	NackVersion   string    `json:"nack_version,omitempty"`
	ConnectedAt   time.Time `json:"connected_at"`
	LastActive    time.Time `json:"last_health_check"`
	PeerAddr      string    `json:"peer_addr,omitempty"`
}

const (
	// stateStale is the state filter for sidecars whose last health check
	// is older than stale_after, whatever their answer to the last push.
	stateStale        = "stale"
	defaultStaleAfter = 30 * time.Second
	maxStaleAfter     = 24 * time.Hour
	maxClientsLimit   = 10000
)

// clientsQuery is GET /v1/clients' parameters; "" and nil mean not given.
type clientsQuery struct {
	node, org, team, employee, state string
	staleAfter                       time.Duration
	limit, offset                    *int
	// given: some parameter was, so the answer is sorted for paging.
	given bool
}

// queryOne reads a parameter that may be given at most once and never
// empty: a repeated or empty one would be silently read as something the
// caller did not mean (the first value; no filter).
func queryOne(q url.Values, name string) (string, bool, error) {
	vs, ok := q[name]
	switch {
	case !ok:
		return "", false, nil
	case len(vs) > 1:
		return "", false, badRequest(fmt.Sprintf("%s: given %d times; give it once", name, len(vs)))
	case vs[0] == "":
		return "", false, badRequest(fmt.Sprintf("%s: empty; omit it to match every value", name))
	}
	return vs[0], true, nil
}

// queryInt reads an integer parameter in [0, max] (max < 0: no bound).
func queryInt(q url.Values, name string, maxN int) (*int, error) {
	v, ok, err := queryOne(q, name)
	if err != nil || !ok {
		return nil, err
	}
	n, err := strconv.Atoi(v)
	switch {
	case err != nil || n < 0:
		return nil, badRequest(fmt.Sprintf("%s: %q is not a non-negative integer", name, v))
	case maxN >= 0 && n > maxN:
		return nil, badRequest(fmt.Sprintf("%s: %d is more than %d", name, n, maxN))
	}
	return &n, nil
}

func parseClientsQuery(q url.Values) (clientsQuery, error) {
	cq := clientsQuery{staleAfter: defaultStaleAfter}
	// In a fixed order, so that a request with two bad parameters is
	// always told of the same one.
	for _, p := range []struct {
		name string
		dst  *string
	}{{"node", &cq.node}, {"org", &cq.org}, {"team", &cq.team}, {"employee", &cq.employee}, {"state", &cq.state}} {
		v, ok, err := queryOne(q, p.name)
		if err != nil {
			return cq, err
		}
		*p.dst, cq.given = v, cq.given || ok
	}
	switch cq.state {
	case "", proxystatus.Pending, proxystatus.Acked, proxystatus.Nacked, stateStale:
	default:
		return cq, badRequest(fmt.Sprintf("state: unknown state %q (pending, acked, nacked, stale)", cq.state))
	}
	v, ok, err := queryOne(q, "stale_after")
	if err != nil {
		return cq, err
	}
	if ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > maxStaleAfter {
			return cq, badRequest(fmt.Sprintf("stale_after: %q is not a duration above 0 and at most %s", v, maxStaleAfter))
		}
		cq.staleAfter, cq.given = d, true
	}
	if cq.limit, err = queryInt(q, "limit", maxClientsLimit); err != nil {
		return cq, err
	}
	if cq.offset, err = queryInt(q, "offset", -1); err != nil {
		return cq, err
	}
	cq.given = cq.given || cq.limit != nil || cq.offset != nil
	return cq, nil
}

// inScope matches the node and scope filters.
func (cq *clientsQuery) inScope(c *clusterv1.ClientInfo) bool {
	return (cq.node == "" || c.GetNodeId() == cq.node) &&
		(cq.org == "" || c.GetOrg() == cq.org) &&
		(cq.team == "" || c.GetTeam() == cq.team) &&
		(cq.employee == "" || c.GetEmployee() == cq.employee)
}

func (a *API) listClients(w http.ResponseWriter, r *http.Request) error {
	cq, err := parseClientsQuery(r.URL.Query())
	if err != nil {
		return err
	}
	clients, unreachable, err := a.b.Clients(r.Context())
	if err != nil {
		return err
	}
	view := ClientsView{Unreachable: unreachable, Offset: cq.offset, Limit: cq.limit}
	// One pass counts and selects; only the page is converted and encoded,
	// so a page of a large fleet costs a scan and a sort of pointers.
	staleBefore := time.Now().Add(-cq.staleAfter).UnixNano()
	matched := make([]*clusterv1.ClientInfo, 0, len(clients))
	for _, c := range clients {
		if !cq.inScope(c) {
			continue
		}
		stale := c.GetLastActiveUnixNano() < staleBefore
		switch c.GetState() {
		case proxystatus.Pending:
			view.Counts.Pending++
		case proxystatus.Acked:
			view.Counts.Acked++
		case proxystatus.Nacked:
			view.Counts.Nacked++
		}
		if stale {
			view.Counts.Stale++
		}
		if cq.state == "" || cq.state == c.GetState() || (cq.state == stateStale && stale) {
			matched = append(matched, c)
		}
	}
	view.Total = len(matched)
	if cq.given {
		matched = ordered(matched, cq.end())
	}
	if cq.offset != nil {
		matched = matched[min(*cq.offset, len(matched)):]
	}
	if cq.limit != nil {
		matched = matched[:min(*cq.limit, len(matched))]
	}
	view.Clients = make([]ClientView, 0, len(matched))
	for _, c := range matched {
		view.Clients = append(view.Clients, clientView(c))
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

// end is the index past the page's last row; -1 without a limit.
func (cq *clientsQuery) end() int {
	if cq.limit == nil {
		return -1
	}
	off := 0
	if cq.offset != nil {
		off = *cq.offset
	}
	return off + *cq.limit
}

func clientOrder(x, y *clusterv1.ClientInfo) int {
	return cmp.Or(cmp.Compare(x.GetNodeId(), y.GetNodeId()),
		cmp.Compare(x.GetClientAddress(), y.GetClientAddress()),
		cmp.Compare(x.GetConnectedAtUnixNano(), y.GetConnectedAtUnixNano()))
}

// ordered sorts cs, or only its first end rows when they are few: the
// Overview's counts (one row) and the first pages of 20,000 sidecars then
// cost a scan, not a sort. Ties keep their order either way.
func ordered(cs []*clusterv1.ClientInfo, end int) []*clusterv1.ClientInfo {
	if end < 0 || end > len(cs)/8 || end > 1024 {
		slices.SortStableFunc(cs, clientOrder)
		return cs
	}
	top := make([]*clusterv1.ClientInfo, 0, end+1)
	for _, c := range cs {
		if len(top) == end && (end == 0 || clientOrder(c, top[end-1]) >= 0) {
			continue
		}
		// After every equal one: stable.
		i, _ := slices.BinarySearchFunc(top, c, func(e, t *clusterv1.ClientInfo) int {
			if clientOrder(e, t) <= 0 {
				return -1
			}
			return 1
		})
		top = slices.Insert(top, i, c)
		if len(top) > end {
			top = top[:end]
		}
	}
	return top
}

func clientView(c *clusterv1.ClientInfo) ClientView {
	return ClientView{
		Node:          c.GetNodeId(),
		ClientAddress: c.GetClientAddress(),
		Transport:     c.GetTransport(),
		Org:           c.GetOrg(),
		Team:          c.GetTeam(),
		Employee:      c.GetEmployee(),
		Version:       c.GetVersionSent(),
		State:         c.GetState(),
		AckedVersion:  c.GetVersionAcked(),
		NackMessage:   c.GetNackMessage(),
		NackVersion:   c.GetNackVersion(),
		ConnectedAt:   time.Unix(0, c.GetConnectedAtUnixNano()).UTC(),
		LastActive:    time.Unix(0, c.GetLastActiveUnixNano()).UTC(),
		PeerAddr:      c.GetPeerAddr(),
	}
}

// clientsLister is the part of Backend that lists sidecars.
type clientsLister interface {
	// Clients lists the sidecars connected to every member, asking the
	// others over the internal API. Members that did not answer are named in
	// unreachable.
	Clients(ctx context.Context) (clients []*clusterv1.ClientInfo, unreachable []string, err error)
}
