package discovery

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/store"
)

// discoveryGoroutines counts the goroutines running code of this package.
func discoveryGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("policyd/server/discovery.(*")) {
			count++
		}
	}
	return count
}

// waitGoroutines polls until the package runs want goroutines.
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	got := discoveryGoroutines()
	for got != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // poll interval
		got = discoveryGoroutines()
	}
	if got != want {
		t.Fatalf("%d goroutines in the discovery package, want %d", got, want)
	}
}

// TestIdleStreamHasNoWriter: a stream's writer runs only while a
// response waits to be sent. Once the snapshot and a push have been
// delivered, the stream is down to its handler and its receiver, so that
// thousands of idle sidecars do not each keep a third goroutine and stack.
func TestIdleStreamHasNoWriter(t *testing.T) {
	h := newRegisterHarness(t)
	close(h.release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
	if err != nil {
		t.Fatal(err)
	}
	recvAck := func(what string) *discoveryv1.PolicyDiscoveryResponse {
		t.Helper()
		resp, err := gs.Recv()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1",
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatalf("ACK %s: %v", what, err)
		}
		return resp
	}
	if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1"}); err != nil {
		t.Fatal(err)
	}
	first := recvAck("snapshot")
	waitGoroutines(t, 2)

	h.apply(t, 2, func(b *store.Batch, m store.Meta) error {
		p, err := policy.DecodePolicy([]byte(`{"name":"p-t1","kind":"ToolPolicy","scope":{"org":"o1","team":"t1"},` +
			`"spec":{"tool_name":"Bash","action":"deny","reason":"changed"}}`))
		if err != nil {
			return err
		}
		_, _, err = b.PutPolicy(m, p, nil)
		return err
	})
	pushed := recvAck("push")
	if pushed.GetVersionInfo() == first.GetVersionInfo() {
		t.Fatalf("push carries version %q, the snapshot's", pushed.GetVersionInfo())
	}
	waitGoroutines(t, 2)

	cancel()
	waitGoroutines(t, 0)
}
