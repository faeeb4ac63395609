package feed

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// TestRefusalAtAttach: a connection that attaches while the node refuses
// sidecars (Deps.Refusal) is closed with 1013 and the refusal, and is sent
// nothing: the node may have stopped serving after its HTTP door let the
// handshake through.
func TestRefusalAtAttach(t *testing.T) {
	var refusal atomic.Pointer[string]
	f := newFixture(t, fixtureOpts{noAuth: true, refusal: func() string {
		if p := refusal.Load(); p != nil {
			return *p
		}
		return ""
	}})
	seedData(f)

	c := f.dial(t, dialOpts{query: "employee=bob"})
	c.nextOf(feedv1.TypeInit)

	msg := "this node's data dir belongs to another cluster; try another node"
	refusal.Store(&msg)
	r := f.dial(t, dialOpts{query: "employee=bob", noRead: true})
	if got := r.closeCode(5 * time.Second); got != websocket.StatusTryAgainLater {
		t.Fatalf("close code %d (%v), want 1013", got, r.err)
	}
	var ce websocket.CloseError
	if !errors.As(r.err, &ce) || ce.Reason != msg {
		t.Errorf("close %v, want reason %q", r.err, msg)
	}
	for len(r.msgs) > 0 {
		if m := <-r.msgs; m.Type != feedv1.TypePing {
			t.Errorf("a refused connection was sent %s", m.Type)
		}
	}
}
