package authz

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/policyd/policyd/client"
)

// heldDecider allows every request, each once the test releases it, and
// hands the test the context it evaluates under.
type heldDecider struct {
	entered chan context.Context
	release chan struct{}
}

func (d *heldDecider) Evaluate(ctx context.Context, _ client.Request) client.Decision {
	d.entered <- ctx
	<-d.release
	if ctx.Err() != nil {
		return client.Decision{Message: "evaluation cancelled", Err: ctx.Err()}
	}
	return client.Decision{Allowed: true}
}

func (*heldDecider) State() client.State       { return client.StateReady }
func (*heldDecider) Policies() []client.Policy { return nil }
func (*heldDecider) EvalErrors() uint64        { return 0 }

// TestQueueWaitDoesNotBoundEvaluation: a check without a deadline that gets
// its slot just before maxQueueWait runs out is evaluated to the end, not
// denied as cancelled when the wait's timer fires.
func TestQueueWaitDoesNotBoundEvaluation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &heldDecider{entered: make(chan context.Context), release: make(chan struct{})}
		s, err := New(Config{MaxInFlight: 1}, slog.New(slog.DiscardHandler), d, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		decisions := make(chan client.Decision, 2)
		check := func() {
			dec, rej := s.decide(context.Background(), client.Request{})
			if rej != nil {
				t.Errorf("rejected: %+v", rej)
			}
			decisions <- dec
		}
		go check()
		<-d.entered // the first check holds the only slot
		go check()
		synctest.Wait() // the second waits for it
		// Fake time in the bubble: the second has waited almost maxQueueWait.
		time.Sleep(maxQueueWait - time.Millisecond)
		d.release <- struct{}{}
		<-d.entered // the second has the slot
		time.Sleep(2 * time.Millisecond)
		d.release <- struct{}{}
		for range 2 {
			if dec := <-decisions; !dec.Allowed {
				t.Errorf("decision %+v, want allowed", dec)
			}
		}
	})
}
