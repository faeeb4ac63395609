package adminapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

type unavailable struct{}

func (unavailable) Error() string     { return "no leader" }
func (unavailable) Unavailable() bool { return true }

// TestStatusOf pins the one mapping from errors to HTTP statuses, including
// errors wrapped the way the server and the store wrap them.
func TestStatusOf(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"validation", policy.ValidationError{{Field: "kind", Reason: "required"}}, http.StatusBadRequest, "invalid"},
		{"wrapped invalid", fmt.Errorf("join: %w", policy.ErrInvalid), http.StatusBadRequest, "invalid"},
		{"explicit", &apiError{status: http.StatusRequestEntityTooLarge, code: "invalid", msg: "big"}, http.StatusRequestEntityTooLarge, "invalid"},
		{"not found", fmt.Errorf("policy %q: %w", "p", store.ErrNotFound), http.StatusNotFound, "not_found"},
		{"conflict", fmt.Errorf("cas: %w", store.ErrConflict), http.StatusConflict, "conflict"},
		{"no token", auth.ErrNoCredentials, http.StatusUnauthorized, "unauthorized"},
		{"bad token", auth.ErrBadCredentials, http.StatusUnauthorized, "unauthorized"},
		{"forbidden", fmt.Errorf("token ci: %w", auth.ErrForbidden), http.StatusForbidden, "forbidden"},
		{"unavailable", fmt.Errorf("propose: %w", unavailable{}), http.StatusServiceUnavailable, "unavailable"},
		{"deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, "unavailable"},
		{"anything else", errors.New("disk on fire"), http.StatusInternalServerError, "internal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, code := statusOf(tc.err)
			if status != tc.status || code != tc.code {
				t.Fatalf("statusOf(%v) = %d %s, want %d %s", tc.err, status, code, tc.status, tc.code)
			}
		})
	}
}
