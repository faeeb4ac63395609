package discovery

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// putEmployee is a harness change that writes employee e1's record.
func putEmployee(org, team string) func(b *store.Batch, m store.Meta) error {
	return func(b *store.Batch, m store.Meta) error {
		_, _, err := b.PutEmployee(m, &policy.Employee{ID: "e1", Org: org, Team: team, Status: policy.StatusActive}, nil)
		return err
	}
}

// putTeamPolicy is a harness change that writes policy name for team t of
// org o1.
func putTeamPolicy(name, team, reason string) func(b *store.Batch, m store.Meta) error {
	return func(b *store.Batch, m store.Meta) error {
		p, err := policy.DecodePolicy([]byte(`{"name":"` + name + `","kind":"ToolPolicy","scope":{"org":"o1","team":"` + team +
			`"},"spec":{"tool_name":"Bash","action":"deny","reason":"` + reason + `"}}`))
		if err != nil {
			return err
		}
		_, _, err = b.PutPolicy(m, p, nil)
		return err
	}
}

func policyNames(r *discoveryv1.PolicyDiscoveryResponse) []string {
	var out []string
	for _, p := range r.GetPolicies() {
		out = append(out, p.GetName())
	}
	return out
}

// TestTeamMoveRescopesOpenStream: an employee moved to another team keeps
// its stream, which is pushed the new team's snapshot and from then on
// follows the new team only. The client goes on naming its old team in
// every request, as an SDK configured with its scope does: that is not a
// reason to refuse it, since the employee record decides the team.
func TestTeamMoveRescopesOpenStream(t *testing.T) {
	h := newRegisterHarness(t)
	close(h.release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
	if err != nil {
		t.Fatal(err)
	}
	old := &discoveryv1.Scope{Org: "o1", Team: "t1", Employee: "e1"}
	send := func(r *discoveryv1.PolicyDiscoveryResponse) {
		t.Helper()
		req := &discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1", Scope: old}
		if r != nil {
			req.VersionInfo, req.ResponseNonce = r.GetVersionInfo(), r.GetNonce()
		}
		if err := gs.Send(req); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	send(nil)
	r := recvFrom(t, "e1", gs)
	if got := policyNames(r); !slices.Equal(got, []string{"p-t1"}) {
		t.Fatalf("before the move: %v, want [p-t1]", got)
	}
	send(r)

	h.apply(t, 2, putEmployee("o1", "t2"))
	r = recvFrom(t, "e1", gs)
	if got := policyNames(r); r.GetUnchanged() || !slices.Equal(got, []string{"p-t2"}) {
		t.Fatalf("after the move: %v (unchanged %v), want the new team's [p-t2]", got, r.GetUnchanged())
	}
	send(r) // ACK, still naming team t1

	// The old team's changes no longer reach the stream; the new team's do.
	h.apply(t, 3, putTeamPolicy("p-t1", "t1", "changed"))
	h.apply(t, 4, putTeamPolicy("p-t2b", "t2", "new"))
	r = recvFrom(t, "e1", gs)
	if got := policyNames(r); !slices.Equal(got, []string{"p-t2", "p-t2b"}) {
		t.Fatalf("after a change to each team: %v, want [p-t2 p-t2b]", got)
	}
	send(r)

	// An unknown nonce (a restart's) is answered with the new team's set.
	if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1", Scope: old, ResponseNonce: "elsewhere-1"}); err != nil {
		t.Fatal(err)
	}
	if r := recvFrom(t, "e1", gs); !r.GetUnchanged() && !slices.Equal(policyNames(r), []string{"p-t2", "p-t2b"}) {
		t.Fatalf("answer to an unknown nonce: %v, want the new team's set", policyNames(r))
	}

	cl := h.svc.Clients()
	if len(cl) != 1 || cl[0].GetTeam() != "t2" {
		t.Fatalf("clients %v, want e1 in team t2", cl)
	}
	if got := servertest.Metric(t, h.reg, "policyd_discovery_streams", "scope", "o1/t1/e1"); got != 0 {
		t.Errorf("streams of the old scope: %v, want 0", got)
	}
	if got := servertest.Metric(t, h.reg, "policyd_discovery_streams", "scope", "o1/t2/e1"); got != 1 {
		t.Errorf("streams of the new scope: %v, want 1", got)
	}

	// An org change ends the stream: a tenant boundary is never crossed.
	h.apply(t, 5, putEmployee("o2", "t2"))
	for {
		_, err := gs.Recv()
		if err == nil {
			continue // a response queued before the change
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("after the org change: %v, want PermissionDenied", err)
		}
		break
	}
	// And the token naming the old org is refused.
	again, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
	if err != nil {
		t.Fatal(err)
	}
	// The server may refuse the stream before the request is sent: Send
	// then says io.EOF, and Recv has the status.
	if err := again.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1"}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if _, err := again.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reconnect with the old org's token: %v, want PermissionDenied", err)
	}
}

// TestRequestScopeJWT: with auth.mode jwt a request may leave its scope
// empty or name the caller's org and employee, with any team (the record
// decides it); another org or employee is refused.
func TestRequestScopeJWT(t *testing.T) {
	h := newRegisterHarness(t)
	close(h.release)
	tests := []struct {
		name  string
		scope *discoveryv1.Scope
		want  codes.Code
	}{
		{"empty", nil, codes.OK},
		{"exactly the identity", &discoveryv1.Scope{Org: "o1", Team: "t1", Employee: "e1"}, codes.OK},
		{"another team: the record's is served", &discoveryv1.Scope{Org: "o1", Team: "t2", Employee: "e1"}, codes.OK},
		{"no team", &discoveryv1.Scope{Org: "o1", Employee: "e1"}, codes.OK},
		{"another org", &discoveryv1.Scope{Org: "o2", Team: "t1", Employee: "e1"}, codes.PermissionDenied},
		{"another employee", &discoveryv1.Scope{Org: "o1", Team: "t1", Employee: "e2"}, codes.PermissionDenied},
		{"the org alone", &discoveryv1.Scope{Org: "o1"}, codes.PermissionDenied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
			if err != nil {
				t.Fatal(err)
			}
			if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-" + tc.name, Scope: tc.scope}); err != nil {
				t.Fatal(err)
			}
			r, err := gs.Recv()
			if got := status.Code(err); got != tc.want {
				t.Fatalf("first receive: %v, want %v", err, tc.want)
			}
			if tc.want == codes.OK && !slices.Equal(policyNames(r), []string{"p-t1"}) {
				t.Fatalf("served %v, want the record's team's [p-t1]", policyNames(r))
			}
		})
	}
}
