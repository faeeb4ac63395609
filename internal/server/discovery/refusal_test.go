package discovery

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
)

// TestRefusalAtRegister: a stream that the node let in, and that registers
// after the node stopped serving sidecars (Deps.Refusal), ends with
// Unavailable and the refusal before any response: DropAll, which ran
// before it registered, could not see it.
func TestRefusalAtRegister(t *testing.T) {
	h := newRegisterHarness(t)
	gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+h.token))
	if err != nil {
		t.Fatal(err)
	}
	if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "late"}); err != nil {
		t.Fatal(err)
	}
	<-h.authenticated // set-up passed the doors and waits in CaughtUp
	msg := "this node's data dir belongs to another cluster; try another node"
	h.refusal.Store(&msg)
	if n := h.svc.DropAll(msg); n != 0 {
		t.Fatalf("DropAll ended %d streams before any registered", n)
	}
	close(h.release)
	resp, err := gs.Recv()
	if err == nil {
		t.Fatalf("the stream was sent version %s", resp.GetVersionInfo())
	}
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != msg {
		t.Errorf("stream ended with %v, want Unavailable %q", st, msg)
	}
	if got := h.registered(); got != 0 {
		t.Errorf("%d streams registered", got)
	}
}
