package adminclient

import (
	"context"
	"net/http"
	"time"
)

// ReloadView is GET /v1/reload.
type ReloadView struct {
	Controller   ReloadController `json:"controller"`
	AppliedIndex uint64           `json:"applied_index"`
	Cache        []ReloadHash     `json:"cache"`
	Queue        []ReloadPending  `json:"queue"`
	Restarts     []ReloadRestart  `json:"restarts"`
	Errors       []ReloadError    `json:"errors"`
}

// ReloadController is this node's ConfigMap reload controller.
type ReloadController struct {
	State           string    `json:"state"`
	Reason          string    `json:"reason,omitempty"`
	Synced          bool      `json:"synced"`
	ResourceVersion string    `json:"resource_version,omitempty"`
	Since           time.Time `json:"since"`
	Namespace       string    `json:"namespace"`
	Selector        string    `json:"selector"`
	ScopeLabel      string    `json:"scope_label"`
	Debounce        string    `json:"debounce"`
}

// ReloadKey names a ConfigMap in a scope.
type ReloadKey struct {
	Scope     string `json:"scope"`
	ConfigMap string `json:"configmap"`
}

// ReloadHash is one hash-cache entry.
type ReloadHash struct {
	ReloadKey
	Hash      string    `json:"hash"`
	Index     uint64    `json:"index"`
	UpdatedAt time.Time `json:"updated_at"`
}

// ReloadPending is one queued restart.
type ReloadPending struct {
	ReloadKey
	Hash        string    `json:"hash"`
	DueAt       time.Time `json:"due_at"`
	Attempts    uint32    `json:"attempts"`
	LastError   string    `json:"last_error,omitempty"`
	Reason      string    `json:"reason"`
	Index       uint64    `json:"index"`
	ScheduledAt time.Time `json:"scheduled_at"`
}

// ReloadRestart is one completed restart.
type ReloadRestart struct {
	ReloadKey
	Hash        string    `json:"hash"`
	Patched     []string  `json:"patched"`
	Skipped     []string  `json:"skipped,omitempty"`
	Attempts    uint32    `json:"attempts"`
	Reason      string    `json:"reason"`
	RestartedAt time.Time `json:"restarted_at"`
	Index       uint64    `json:"index"`
}

// ReloadError is one failed restart attempt.
type ReloadError struct {
	ReloadKey
	Hash     string    `json:"hash"`
	Attempts uint32    `json:"attempts"`
	Error    string    `json:"error"`
	RetryAt  time.Time `json:"retry_at"`
	FailedAt time.Time `json:"failed_at"`
	Index    uint64    `json:"index"`
}

// Reload reports the ConfigMap reload controller.
func (c *Client) Reload(ctx context.Context) (*ReloadView, error) {
	var out ReloadView
	return &out, c.Do(ctx, http.MethodGet, "/v1/reload", nil, nil, &out)
}
