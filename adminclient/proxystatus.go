package adminclient

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// ProxyStatus is GET /v1/proxy-status: per version, the discovery clients
// that ACKed, NACKed or have not answered it.
type ProxyStatus struct {
	Done        bool                 `json:"done"`
	Versions    []ProxyStatusVersion `json:"versions"`
	Unreachable []string             `json:"unreachable_nodes,omitempty"`
}

// ProxyStatusVersion is the discovery clients sent one version.
type ProxyStatusVersion struct {
	Version string      `json:"version"`
	Done    bool        `json:"done"`
	Acked   []ClientRef `json:"acked"`
	Nacked  []NackRef   `json:"nacked"`
	Pending []ClientRef `json:"pending"`
}

// ProxyStatus reports each version's acknowledgements; wait > 0 blocks
// (up to 5m) until every discovery client answered.
func (c *Client) ProxyStatus(ctx context.Context, wait time.Duration) (*ProxyStatus, error) {
	return c.proxyStatus(ctx, "/v1/proxy-status", wait)
}

func (c *Client) proxyStatus(ctx context.Context, path string, wait time.Duration) (*ProxyStatus, error) {
	q := url.Values{}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	var out ProxyStatus
	return &out, c.Do(ctx, http.MethodGet, withQuery(path, q), nil, nil, &out)
}
