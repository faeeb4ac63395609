package adminclient

import (
	"context"
	"net/http"
)

// History is GET /v1/policies/{name}/history and /v1/employees/{id}/history:
// the revisions the event log still holds, oldest first.
type History struct {
	EntityType string `json:"entity_type"`
	ID         string `json:"id"`
	// PrunedThrough is the highest event ID retention removed: older
	// revisions are gone.
	PrunedThrough uint64     `json:"pruned_through"`
	Revisions     []Revision `json:"revisions"`
}

// History lists the revisions of key in collection ("policies" or
// "employees") that the event log still holds; consistent reads through
// the leader.
func (c *Client) History(ctx context.Context, collection, key string, consistent bool) (*History, error) {
	var out History
	return &out, c.Do(ctx, http.MethodGet, entityPath(collection, key)+"/history"+consistentQuery(consistent), nil, nil, &out)
}
