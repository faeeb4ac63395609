package discovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// TestStreamLooksUpEmployeeAfterCatchUp: the employee record is read after
// the catch-up wait, not before it, so an employee created just before its
// sidecar connects (committed, but not yet applied here when the stream
// opened) is served. One that does not exist once the node is current is
// refused with Unauthenticated and the UNKNOWN_EMPLOYEE reason; a node that
// cannot catch up refuses with Unavailable, never as unknown; a bad token
// is refused before any wait.
func TestStreamLooksUpEmployeeAfterCatchUp(t *testing.T) {
	create := func(b *store.Batch, m store.Meta) error {
		_, _, err := b.PutEmployee(m, &policy.Employee{ID: "new", Org: "o1", Team: "t1", Status: policy.StatusActive}, nil)
		return err
	}
	tests := []struct {
		name       string
		token      string
		during     func(b *store.Batch, m store.Meta) error // committed during the wait
		catchUpErr error
		want       codes.Code
		wantReason string
		noWait     bool // refused before the catch-up wait
	}{
		{name: "created during the wait: served", token: "new", during: create, want: codes.OK},
		{name: "never created: unknown", token: "new", want: codes.Unauthenticated, wantReason: discoveryv1.ReasonUnknownEmployee},
		{name: "cannot catch up: unavailable", token: "new", catchUpErr: errors.New("no leader"), want: codes.Unavailable},
		{name: "bad token: refused first", token: "", want: codes.Unauthenticated, noWait: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newRegisterHarness(t)
			if tc.catchUpErr != nil {
				h.catchUpErr.Store(&tc.catchUpErr)
			}
			tok := "not.a.jwt"
			if tc.token != "" {
				tok = tokenFor(t, tc.token)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok))
			if err != nil {
				t.Fatal(err)
			}
			if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1"}); err != nil {
				t.Fatalf("send the first request: %v", err)
			}
			type received struct {
				resp *discoveryv1.PolicyDiscoveryResponse
				err  error
			}
			recv := make(chan received, 1)
			go func() {
				resp, err := gs.Recv()
				recv <- received{resp, err}
			}()
			if !tc.noWait {
				select {
				case <-h.authenticated:
				case r := <-recv:
					t.Fatalf("the stream ended before the catch-up wait: %v", r.err)
				case <-ctx.Done():
					t.Fatal("the stream never reached the catch-up wait")
				}
				if tc.during != nil {
					h.apply(t, 2, tc.during)
				}
			}
			close(h.release)
			r := <-recv
			resp, err := r.resp, r.err
			st := status.Convert(err)
			if got := st.Code(); got != tc.want {
				t.Fatalf("first receive: %v (response %v), want code %v", err, resp, tc.want)
			}
			if got := reasonOf(st); got != tc.wantReason {
				t.Errorf("reason %q, want %q (%v)", got, tc.wantReason, err)
			}
			select {
			case <-h.authenticated:
				if tc.noWait {
					t.Error("a bad token reached the catch-up wait")
				}
			default:
			}
			if tc.want == codes.OK {
				if got := policyNames(resp); len(got) != 1 || got[0] != "p-t1" {
					t.Errorf("served %v, want [p-t1]", got)
				}
			}
		})
	}
}

// reasonOf is st's ErrorInfo reason in policyd's domain, or "".
func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == discoveryv1.ErrorDomain {
			return ei.GetReason()
		}
	}
	return ""
}
