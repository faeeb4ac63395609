package adminclient

import (
	"context"
	"time"
)

// Rollout is ProxyStatus's name before it was renamed.
//
// Deprecated: use ProxyStatus.
type Rollout = ProxyStatus

// RolloutVersion is ProxyStatusVersion's name before it was renamed.
//
// Deprecated: use ProxyStatusVersion.
type RolloutVersion = ProxyStatusVersion

// Rollout is ProxyStatus at the path's old name, GET /v1/rollout, which a
// node older than the rename also serves.
//
// Deprecated: use ProxyStatus.
func (c *Client) Rollout(ctx context.Context, wait time.Duration) (*Rollout, error) {
	return c.proxyStatus(ctx, "/v1/rollout", wait)
}
