package sources

import "errors"

// Errors of the sources' REST routes; adminapi maps them to statuses.
var (
	// ErrNotConfigured: no source of that name is configured (404).
	ErrNotConfigured = errors.New("no such source configured")
	// ErrHookRefused: a webhook without a valid signature or token (401).
	ErrHookRefused = errors.New("webhook signature refused")
	// ErrRateLimited: a webhook beyond its source's rate (429).
	ErrRateLimited = errors.New("webhook rate limit exceeded; the next poll or webhook syncs")
)
