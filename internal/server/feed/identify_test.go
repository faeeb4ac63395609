package feed

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/policy"
)

// TestHandshakeReadsRecordOnceCurrent: a handshake verifies the token, then
// waits for this node to hold the writes it acknowledged, and only then
// reads the employee record; a refusal for the record's sake is confirmed
// by a consistent read first. So an employee created just before its
// sidecar connects, through this node or another, is admitted; one that
// does not exist is refused with 401 and the UNKNOWN_EMPLOYEE reason, an
// inactive one with 403 and none; a node that cannot confirm it is current
// answers 503, never a refusal of the identity; and a bad token is refused
// before anything waits.
func TestHandshakeReadsRecordOnceCurrent(t *testing.T) {
	tests := []struct {
		name string
		sub  string // the token's subject; "" sends a token that does not verify
		// ownWrites and readIndex stand in for this node's waits; nil:
		// current already.
		ownWrites func(f *fixture) func(context.Context) error
		readIndex func(f *fixture) func() (uint64, error)
		status    int
		code      string
		reason    string
		// waits: the waits for own writes and consistent reads made.
		ownWaits, caughtUps int64
	}{
		{
			name: "created through this node, applied during the wait: admitted", sub: "newbie",
			ownWrites: func(f *fixture) func(context.Context) error {
				return func(context.Context) error {
					f.apply(f.putEmployee("newbie", "acme", "red", policy.StatusActive))
					return nil
				}
			},
			status: http.StatusSwitchingProtocols, ownWaits: 1,
		},
		{
			name: "created through another node, found by the consistent read: admitted", sub: "newbie",
			readIndex: func(f *fixture) func() (uint64, error) {
				return func() (uint64, error) {
					return f.apply(f.putEmployee("newbie", "acme", "red", policy.StatusActive)), nil
				}
			},
			status: http.StatusSwitchingProtocols, ownWaits: 1, caughtUps: 1,
		},
		{
			name: "never created: unknown", sub: "newbie",
			status: http.StatusUnauthorized, code: "unauthorized", reason: feedv1.ReasonUnknownEmployee, ownWaits: 1, caughtUps: 1,
		},
		{
			name: "inactive: forbidden, no reason", sub: "dave",
			status: http.StatusForbidden, code: "forbidden", ownWaits: 1, caughtUps: 1,
		},
		{
			name: "own writes not applied in time: unavailable", sub: "newbie",
			ownWrites: func(*fixture) func(context.Context) error {
				return func(context.Context) error { return context.DeadlineExceeded }
			},
			status: http.StatusServiceUnavailable, code: "unavailable", ownWaits: 1,
		},
		{
			name: "refusal not confirmed: unavailable", sub: "newbie",
			readIndex: func(*fixture) func() (uint64, error) {
				return func() (uint64, error) { return 0, errors.New("no leader") }
			},
			status: http.StatusServiceUnavailable, code: "unavailable", ownWaits: 1, caughtUps: 1,
		},
		{
			name: "bad token: refused before any wait", sub: "",
			status: http.StatusUnauthorized, code: "unauthorized",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			seedData(f)
			if tc.ownWrites != nil {
				f.setOwnWrites(t, tc.ownWrites(f))
			}
			if tc.readIndex != nil {
				f.setReadIndex(t, tc.readIndex(f))
			}
			f.ownWaits.Store(0)
			f.caughtUps.Store(0)
			tok := "not.a.jwt"
			if tc.sub != "" {
				tok = f.token(tc.sub, "acme", "red")
			}
			if tc.status == http.StatusSwitchingProtocols {
				c := f.dial(t, dialOpts{token: tok})
				init := c.nextOf(feedv1.TypeInit)
				if got, want := policyNames(init.Policies), []string{"g-all", "o-acme", "t-acme-red"}; !slices.Equal(got, want) {
					t.Errorf("init holds %v, want %v", got, want)
				}
			} else {
				status, _, body := f.handshake(t, http.MethodGet, "", bearer(tok))
				if status != tc.status {
					t.Fatalf("status %d, want %d: %s", status, tc.status, body)
				}
				code, reason := envelope(t, body)
				if code != tc.code || reason != tc.reason {
					t.Errorf("code %q reason %q, want %q and %q: %s", code, reason, tc.code, tc.reason, body)
				}
			}
			if got, want := f.ownWaits.Load(), tc.ownWaits; got != want {
				t.Errorf("%d waits for own writes, want %d", got, want)
			}
			if got, want := f.caughtUps.Load(), tc.caughtUps; got != want {
				t.Errorf("%d consistent reads, want %d", got, want)
			}
		})
	}
}
