package adminclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// HeaderAppliedIndex is the header of GET /v1/snapshot naming the applied
// index the snapshot holds.
const HeaderAppliedIndex = "X-Policyd-Applied-Index"

// AnyRevision is the ifMatchRev of an unconditional write: no If-Match.
const AnyRevision int64 = -1

func ifMatch(rev int64) http.Header {
	if rev < 0 {
		return nil
	}
	return http.Header{"If-Match": []string{strconv.FormatInt(rev, 10)}}
}

func setNonEmpty(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

func withQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// Policies lists policies.
func (c *Client) Policies(ctx context.Context, f PolicyFilter) (*PolicyList, error) {
	q := url.Values{}
	setNonEmpty(q, "org", f.Org)
	setNonEmpty(q, "team", f.Team)
	setNonEmpty(q, "employee", f.Employee)
	setNonEmpty(q, "kind", f.Kind)
	if f.Consistent {
		q.Set("consistent", "true")
	}
	if f.Summary {
		q.Set("summary", "true")
	}
	var out PolicyList
	return &out, c.Do(ctx, http.MethodGet, withQuery("/v1/policies", q), nil, nil, &out)
}

// Policy reads one policy.
func (c *Client) Policy(ctx context.Context, name string) (*Policy, error) {
	var out Policy
	return &out, c.Do(ctx, http.MethodGet, "/v1/policies/"+url.PathEscape(name), nil, nil, &out)
}

// PutPolicy creates or replaces the policy name with the JSON doc;
// ifMatch >= 0 is compare-and-set on the current revision (0: create only).
func (c *Client) PutPolicy(ctx context.Context, name string, doc json.RawMessage, ifMatchRev int64) (*Written, error) {
	var out Written
	return &out, c.Do(ctx, http.MethodPut, "/v1/policies/"+url.PathEscape(name), ifMatch(ifMatchRev), doc, &out)
}

// DeletePolicy deletes a policy; ifMatch as for PutPolicy.
func (c *Client) DeletePolicy(ctx context.Context, name string, ifMatchRev int64) (*Deleted, error) {
	var out Deleted
	return &out, c.Do(ctx, http.MethodDelete, "/v1/policies/"+url.PathEscape(name), ifMatch(ifMatchRev), nil, &out)
}

// Employees lists employees.
func (c *Client) Employees(ctx context.Context, f EmployeeFilter) (*EmployeeList, error) {
	q := url.Values{}
	setNonEmpty(q, "org", f.Org)
	setNonEmpty(q, "team", f.Team)
	if f.Consistent {
		q.Set("consistent", "true")
	}
	var out EmployeeList
	return &out, c.Do(ctx, http.MethodGet, withQuery("/v1/employees", q), nil, nil, &out)
}

// Employee reads one employee.
func (c *Client) Employee(ctx context.Context, id string) (*Employee, error) {
	var out Employee
	return &out, c.Do(ctx, http.MethodGet, "/v1/employees/"+url.PathEscape(id), nil, nil, &out)
}

// PutEmployee creates or replaces an employee.
func (c *Client) PutEmployee(ctx context.Context, id string, doc json.RawMessage, ifMatchRev int64) (*Written, error) {
	var out Written
	return &out, c.Do(ctx, http.MethodPut, "/v1/employees/"+url.PathEscape(id), ifMatch(ifMatchRev), doc, &out)
}

// DeleteEmployee deletes an employee.
func (c *Client) DeleteEmployee(ctx context.Context, id string, ifMatchRev int64) (*Deleted, error) {
	var out Deleted
	return &out, c.Do(ctx, http.MethodDelete, "/v1/employees/"+url.PathEscape(id), ifMatch(ifMatchRev), nil, &out)
}

// entityPath is the path of key in collection, "policies" or "employees".
func entityPath(collection, key string) string {
	return "/v1/" + url.PathEscape(collection) + "/" + url.PathEscape(key)
}

// consistentQuery is the query of a read through the leader, or none.
func consistentQuery(consistent bool) string {
	if consistent {
		return "?consistent=true"
	}
	return ""
}

// Document reads key in collection as JSON: revision rev as its write
// stored it, or with rev 0 the entity as it is now. consistent reads
// through the leader.
func (c *Client) Document(ctx context.Context, collection, key string, rev uint64, consistent bool) (json.RawMessage, error) {
	path := entityPath(collection, key)
	if rev != 0 {
		path += "/revisions/" + strconv.FormatUint(rev, 10)
	}
	var out json.RawMessage
	if err := c.Do(ctx, http.MethodGet, path+consistentQuery(consistent), nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Revert writes revision req.To of key in collection back as a new
// revision. Without req.IfMatch the current revision is read through the
// leader, so that a write racing the revert fails it with 409.
func (c *Client) Revert(ctx context.Context, collection, key string, req RevertRequest) (*Written, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode revert: %w", err)
	}
	var out Written
	return &out, c.Do(ctx, http.MethodPost, entityPath(collection, key)+"/revert?consistent=true", nil, body, &out)
}

func (f EventFilter) query() url.Values {
	q := url.Values{}
	setNonEmpty(q, "type", f.Type)
	setNonEmpty(q, "actor", f.Actor)
	if f.Org != "" || f.OrgSet {
		q.Set("org", f.Org)
	}
	q.Set("after", strconv.FormatUint(f.After, 10))
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return q
}

// Events reads a page of the event log.
func (c *Client) Events(ctx context.Context, f EventFilter) (*EventPage, error) {
	var out EventPage
	return &out, c.Do(ctx, http.MethodGet, withQuery("/v1/events", f.query()), nil, nil, &out)
}

// WatchEvents opens the Server-Sent Events stream of the event log from
// f.After on; the caller reads and closes it.
func (c *Client) WatchEvents(ctx context.Context, f EventFilter) (io.ReadCloser, error) {
	f.Limit = 0
	resp, err := c.Stream(ctx, withQuery("/v1/events/watch", f.query()))
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Cluster reads the cluster as the answering node sees it.
func (c *Client) Cluster(ctx context.Context) (*ClusterStatus, error) {
	var out ClusterStatus
	return &out, c.Do(ctx, http.MethodGet, "/v1/cluster", nil, nil, &out)
}

// Join adds a voter.
func (c *Client) Join(ctx context.Context, req JoinRequest) (*Membership, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode join request: %w", err)
	}
	var out Membership
	return &out, c.Do(ctx, http.MethodPost, "/v1/cluster/join", nil, body, &out)
}

// Remove removes a member.
func (c *Client) Remove(ctx context.Context, id string) (*Membership, error) {
	var out Membership
	return &out, c.Do(ctx, http.MethodDelete, "/v1/cluster/members/"+url.PathEscape(id), nil, nil, &out)
}

// TransferLeader hands leadership to voter id ("" lets raft choose). Only
// the leader can: the request goes to the leader's HTTP address as the
// cluster status names it, with the scheme of the server that named it.
func (c *Client) TransferLeader(ctx context.Context, id string) (*TransferLeaderResult, error) {
	st, err := c.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	via := c.servers[c.next]
	c.mu.Unlock()
	leader := via
	for _, m := range st.Members {
		if m.Leader && m.HTTPAddr != "" {
			u, _ := url.Parse(via)
			leader = u.Scheme + "://" + m.HTTPAddr
		}
	}
	if st.LeaderID == "" {
		return nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the cluster has no leader", Server: via}
	}
	body, err := json.Marshal(TransferLeaderRequest{ID: id})
	if err != nil {
		return nil, fmt.Errorf("encode transfer request: %w", err)
	}
	resp, err := c.sendTo(ctx, leader, request{method: http.MethodPost, path: "/v1/cluster/transfer-leader", body: body})
	if err != nil {
		return nil, fmt.Errorf("leader %s at %s: %w", st.LeaderID, leader, err)
	}
	defer resp.Body.Close()
	var out TransferLeaderResult
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("decode transfer answer from %s: %w", leader, err)
	}
	return &out, nil
}

// Version reads the answering server's build.
func (c *Client) Version(ctx context.Context) (*VersionInfo, error) {
	var out VersionInfo
	return &out, c.Do(ctx, http.MethodGet, "/v1/version", nil, nil, &out)
}

// ServerVersion is one server's build, or why it could not be read.
type ServerVersion struct {
	Server string       `json:"server"`
	Build  *VersionInfo `json:"build,omitempty"`
	Error  string       `json:"error,omitempty"`
}

// VersionOf reads one server's build, without failover: server is a base
// URL, not necessarily one of the configured ones (a member's http_addr).
func (c *Client) VersionOf(ctx context.Context, server string) (*VersionInfo, error) {
	var out VersionInfo
	return &out, c.getAt(ctx, server, "/v1/version", &out)
}

// getAt GETs path from one server, without failover, into out.
func (c *Client) getAt(ctx context.Context, server, path string, out any) error {
	resp, err := c.sendTo(ctx, strings.TrimRight(server, "/"), request{method: http.MethodGet, path: path})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s from %s: %w", path, server, err)
	}
	return nil
}

// memberURL is a member's base URL from its http_addr, with the scheme of
// the configured servers.
func (c *Client) memberURL(addr string) string {
	scheme := "http"
	if u, err := url.Parse(c.servers[0]); err == nil && u.Scheme != "" {
		scheme = u.Scheme
	}
	return scheme + "://" + addr
}

// Clients lists the connected sidecars, cluster-wide.
func (c *Client) Clients(ctx context.Context) (*ClientList, error) {
	var out ClientList
	return &out, c.Do(ctx, http.MethodGet, "/v1/clients", nil, nil, &out)
}

// ClientsPage lists the connected sidecars that match f, one page at a
// time: with any field of f set, the server sorts them by node, client
// address and connection time, so that pages do not overlap. A server older
// than the filters ignores them and answers every sidecar, with Total 0.
func (c *Client) ClientsPage(ctx context.Context, f ClientFilter) (*ClientList, error) {
	q := url.Values{}
	setNonEmpty(q, "node", f.Node)
	setNonEmpty(q, "org", f.Org)
	setNonEmpty(q, "team", f.Team)
	setNonEmpty(q, "employee", f.Employee)
	setNonEmpty(q, "state", f.State)
	if f.StaleAfter != 0 {
		q.Set("stale_after", f.StaleAfter.String())
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.Offset != 0 {
		q.Set("offset", strconv.Itoa(f.Offset))
	}
	var out ClientList
	return &out, c.Do(ctx, http.MethodGet, withQuery("/v1/clients", q), nil, nil, &out)
}

// Snapshot is an open GET /v1/snapshot stream.
type Snapshot struct {
	// Body is the state database; the caller closes it.
	Body io.ReadCloser
	// AppliedIndex is the index the server announced.
	AppliedIndex uint64
	// Server is the base URL that answered.
	Server string
}

// Snapshot opens a consistent copy of the state database (admin role);
// consistent first makes the node catch up with every acknowledged write.
func (c *Client) Snapshot(ctx context.Context, consistent bool) (*Snapshot, error) {
	resp, err := c.Stream(ctx, "/v1/snapshot?consistent="+strconv.FormatBool(consistent))
	if err != nil {
		return nil, err
	}
	server := resp.Request.URL.Scheme + "://" + resp.Request.URL.Host
	idx, err := strconv.ParseUint(resp.Header.Get(HeaderAppliedIndex), 10, 64)
	if err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("snapshot answer from %s lacks a valid %s header: %w", server, HeaderAppliedIndex, err)
	}
	return &Snapshot{Body: resp.Body, AppliedIndex: idx, Server: server}, nil
}

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
