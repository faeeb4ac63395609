package adminclient

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// SourceList is GET /v1/sources.
type SourceList struct {
	Sources []Source `json:"sources"`
	// Leader is the leader's admin address: only its answer holds each
	// source's Reconciler.
	Leader       string `json:"leader_http_addr,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
}

// Source is one policy source (docs/sources.md).
type Source struct {
	Name           string    `json:"name"`
	SyncedRevision string    `json:"synced_revision,omitempty"`
	SyncedAt       time.Time `json:"synced_at,omitzero"`
	SyncIndex      uint64    `json:"sync_index,omitempty"`
	Policies       int       `json:"policies"`
	Owned          []string  `json:"owned"`
	PruneAllowed   bool      `json:"prune_allowed,omitempty"`
	// Reconciler is set in the leader's answer only.
	Reconciler *SourceReconciler `json:"reconciler,omitempty"`
}

// SourceReconciler is the leader's reconciler of one source.
type SourceReconciler struct {
	Running          bool                `json:"running"`
	ObservedRevision string              `json:"observed_revision,omitempty"`
	LastAttemptAt    time.Time           `json:"last_attempt_at,omitzero"`
	LastResult       string              `json:"last_result,omitempty"`
	LastError        string              `json:"last_error,omitempty"`
	PruneRefused     *SourcePruneRefusal `json:"prune_refused,omitempty"`
	Note             string              `json:"note,omitempty"`
	Invalid          []SourceOutcome     `json:"invalid,omitempty"`
	Conflicts        []SourceOutcome     `json:"conflicts,omitempty"`
}

// SourcePruneRefusal is a sync refused by sources.max_prune_ratio.
type SourcePruneRefusal struct {
	Revision string    `json:"revision"`
	Deletes  int       `json:"deletes"`
	Owned    int       `json:"owned"`
	MaxRatio float64   `json:"max_ratio"`
	At       time.Time `json:"at"`
}

// SourceOutcome is an object a sync left out, and why.
type SourceOutcome struct {
	Object  string `json:"Object"`
	Name    string `json:"Name"`
	State   string `json:"State"`
	Message string `json:"Message"`
}

// SyncRequested answers a sync request.
type SyncRequested struct {
	Source       string `json:"source"`
	RequestIndex uint64 `json:"request_index"`
	AllowPrune   bool   `json:"allow_prune,omitempty"`
}

// Sources lists the configured sources. The reconcilers' status is the
// leader's: when the answering server is not the leader, Sources asks the
// leader it names.
func (c *Client) Sources(ctx context.Context) (*SourceList, error) {
	var out SourceList
	if err := c.Do(ctx, http.MethodGet, "/v1/sources", nil, nil, &out); err != nil {
		return nil, err
	}
	if out.Leader == "" || hasReconciler(out.Sources) {
		return &out, nil
	}
	var fromLeader SourceList
	if err := c.getAt(ctx, c.memberURL(out.Leader), "/v1/sources", &fromLeader); err != nil {
		return &out, nil // the replicated part is still right
	}
	return &fromLeader, nil
}

func hasReconciler(ss []Source) bool {
	for _, s := range ss {
		if s.Reconciler != nil {
			return true
		}
	}
	return len(ss) == 0
}

// SyncSource asks the leader to sync the named source now; allowPrune
// lets that sync delete beyond sources.max_prune_ratio.
func (c *Client) SyncSource(ctx context.Context, name string, allowPrune bool) (*SyncRequested, error) {
	path := "/v1/sources/" + url.PathEscape(name) + "/sync"
	if allowPrune {
		path += "?allow_prune=true"
	}
	var out SyncRequested
	return &out, c.Do(ctx, http.MethodPost, path, nil, nil, &out)
}
