package discovery

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

// waitGoroutines polls until the package runs want goroutines.
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	const here = "policyd/internal/server/discovery.(*"
	var got int
	if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { got = servertest.Goroutines(here); return got == want })) != nil {
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

	h.changeTeamPolicy(t, 2, "changed")
	pushed := recvAck("push")
	if pushed.GetVersionInfo() == first.GetVersionInfo() {
		t.Fatalf("push carries version %q, the snapshot's", pushed.GetVersionInfo())
	}
	waitGoroutines(t, 2)

	cancel()
	waitGoroutines(t, 0)
}

// TestWritersUnderChurn: pushes arriving while the sidecars do not read
// (so that sends block on flow control and the last changes arrive during
// a send), on streams of which some end part way, never overlap two sends
// on a stream, never lose the newest version (each remaining stream ends
// up holding it once its sidecar reads again, without ACKing) and leave no
// writer behind (goleak checks the ended ones; the count checks the
// rest). Run with -race.
func TestWritersUnderChurn(t *testing.T) {
	const streams, changes = 12, 60
	// Each response carries a 3 KB policy: the 64 KiB stream window fills
	// after about 20 unread ones.
	pad := strings.Repeat("x", 3000)
	h := newRegisterHarness(t)
	close(h.release)
	resume := make(chan struct{})
	type sidecar struct {
		cancel context.CancelFunc
		last   chan string // every version received, newest last
		done   chan struct{}
	}
	var cars []*sidecar
	for i := range streams {
		ctx, cancel := context.WithCancel(context.Background())
		gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		addr := "sidecar-" + string(rune('a'+i))
		if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: addr}); err != nil {
			cancel()
			t.Fatal(err)
		}
		c := &sidecar{cancel: cancel, last: make(chan string, changes+2), done: make(chan struct{})}
		go func() {
			defer close(c.done)
			for n := 0; ; n++ {
				if n == 1 { // after the snapshot: stop reading until resumed
					select {
					case <-resume:
					case <-ctx.Done():
						return
					}
				}
				resp, err := gs.Recv()
				if err != nil {
					return
				}
				c.last <- resp.GetVersionInfo()
				if n > 0 {
					// No ACK after the snapshot: an ACK of a superseded
					// nonce makes the node resend its newest set, which
					// would hide a writer that left a response behind.
					continue
				}
				if gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: addr,
					VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}) != nil {
					return
				}
			}
		}()
		cars = append(cars, c)
	}
	t.Cleanup(func() {
		for _, c := range cars {
			c.cancel()
			<-c.done
		}
	})
	for _, c := range cars { // every stream registered and served
		select {
		case <-c.last:
		case <-time.After(10 * time.Second):
			t.Fatal("a stream got no snapshot")
		}
	}

	for i := range changes {
		h.changeTeamPolicy(t, uint64(2+i), "change "+strconv.Itoa(i)+" "+pad)
		if i == changes/2 { // a third of the streams leave mid-push
			for _, c := range cars[:streams/3] {
				c.cancel()
			}
		}
	}
	close(resume)
	want := h.index.Set(policy.Identity{Org: "o1", Team: "t1", Employee: "e1"}).Version
	for _, c := range cars[streams/3:] {
		deadline := time.After(10 * time.Second)
		for got := ""; got != want; {
			select {
			case got = <-c.last:
			case <-deadline:
				t.Fatalf("a stream's last version is %q, want the newest %q", got, want)
			}
		}
	}
	for _, c := range cars[:streams/3] {
		<-c.done
	}
	waitGoroutines(t, 2*(streams-streams/3))
}

// TestStreamEnds: every way a stream ends from outside its handler, which
// is blocked receiving, reaches the client with its status: a send stuck
// on a client that stopped reading, no first request, the inactivity
// flush, and a shutdown while the client has half-closed (it still gets
// pushes until then).
func TestStreamEnds(t *testing.T) {
	pad := strings.Repeat("x", 3000)
	change := func(h *registerHarness, t *testing.T, i int) {
		h.changeTeamPolicy(t, uint64(2+i), "change "+strconv.Itoa(i)+" "+pad)
	}
	tests := []struct {
		name string
		cfg  func(*config.Discovery)
		run  bool // the inactivity flush runs
		// drive does what the sidecar does after opening the stream.
		drive func(t *testing.T, h *registerHarness, gs discoveryv1.PolicyDiscoveryService_StreamPoliciesClient)
		want  codes.Code
	}{
		{"send stuck on a client that does not read", func(c *config.Discovery) { c.SendTimeout = 200 * time.Millisecond }, false,
			func(t *testing.T, h *registerHarness, gs discoveryv1.PolicyDiscoveryService_StreamPoliciesClient) {
				openAndAck(t, gs)
				for i := range 60 { // 3 KB each: the 64 KiB window fills
					change(h, t, i)
				}
				// Reading now would unblock the send: wait for the kill.
				_ = poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool { return h.registered() == 0 }))
			}, codes.ResourceExhausted},
		{"no first request", func(c *config.Discovery) { c.MaxClientInactive = 200 * time.Millisecond }, false,
			func(*testing.T, *registerHarness, discoveryv1.PolicyDiscoveryService_StreamPoliciesClient) {}, codes.DeadlineExceeded},
		{"inactivity flush", func(c *config.Discovery) {
			c.MaxClientInactive, c.FlushInterval = 300*time.Millisecond, 50*time.Millisecond
		}, true, func(t *testing.T, _ *registerHarness, gs discoveryv1.PolicyDiscoveryService_StreamPoliciesClient) {
			openAndAck(t, gs)
		}, codes.DeadlineExceeded},
		{"shutdown after a half-close", func(*config.Discovery) {}, false,
			func(t *testing.T, h *registerHarness, gs discoveryv1.PolicyDiscoveryService_StreamPoliciesClient) {
				first := openAndAck(t, gs)
				if err := gs.CloseSend(); err != nil {
					t.Fatal(err)
				}
				change(h, t, 0)
				resp, err := gs.Recv()
				if err != nil {
					t.Fatalf("push after the half-close: %v", err)
				}
				if resp.GetVersionInfo() == first.GetVersionInfo() {
					t.Fatal("push after the half-close carries the old version")
				}
				h.svc.CloseAll()
			}, codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default().Discovery
			tt.cfg(&cfg)
			h := newRegisterHarnessWith(t, cfg)
			close(h.release)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if tt.run {
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { defer close(done); h.svc.Run(runCtx) }()
				defer func() { stop(); <-done }()
			}
			gs, err := h.client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
			if err != nil {
				t.Fatal(err)
			}
			tt.drive(t, h, gs)
			for {
				if _, err = gs.Recv(); err != nil {
					break
				}
			}
			if got := status.Code(err); got != tt.want {
				t.Fatalf("stream ended with %v, want %v", err, tt.want)
			}
			left := 0
			if tt.run {
				left = 1 // Service.Run
			}
			waitGoroutines(t, left)
		})
	}
}

// openAndAck sends the first request, reads the snapshot and ACKs it.
func openAndAck(t *testing.T, gs discoveryv1.PolicyDiscoveryService_StreamPoliciesClient) *discoveryv1.PolicyDiscoveryResponse {
	t.Helper()
	if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1"}); err != nil {
		t.Fatal(err)
	}
	resp, err := gs.Recv()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if err := gs.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "sidecar-1",
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatalf("ACK: %v", err)
	}
	return resp
}

// openAcked opens a stream of employee e1 on client, reads its snapshot and
// ACKs it.
func (h *registerHarness) openAcked(ctx context.Context, t *testing.T, client discoveryv1.PolicyDiscoveryServiceClient) discoveryv1.PolicyDiscoveryService_StreamPoliciesClient {
	t.Helper()
	gs, err := client.StreamPolicies(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.token))
	if err != nil {
		t.Fatal(err)
	}
	openAndAck(t, gs)
	return gs
}

// registered is how many streams the service holds.
func (h *registerHarness) registered() int {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	return len(h.svc.streams)
}

// changeTeamPolicy commits batch index: team t1's policy p-t1 with reason.
func (h *registerHarness) changeTeamPolicy(t *testing.T, index uint64, reason string) {
	t.Helper()
	h.apply(t, index, teamPolicy(reason))
}

// teamPolicy puts team t1's policy p-t1 with reason.
func teamPolicy(reason string) func(b *store.Batch, m store.Meta) error {
	return func(b *store.Batch, m store.Meta) error {
		p, err := policy.DecodePolicy([]byte(`{"name":"p-t1","kind":"ToolPolicy","scope":{"org":"o1","team":"t1"},` +
			`"spec":{"tool_name":"Bash","action":"deny","reason":"` + reason + `"}}`))
		if err != nil {
			return err
		}
		_, _, err = b.PutPolicy(m, p, nil)
		return err
	}
}

// TestPushBatchesStreamsOfAConnection: a push sends to the streams that
// share a client connection from one goroutine (drainConn), so that
// grpc-go's connection writer finds their messages queued together and
// writes them in a few syscalls rather than one each. 64 streams of 1.5 KB
// messages: 37 writes with a goroutine per stream, 6 now.
func TestPushBatchesStreamsOfAConnection(t *testing.T) {
	if raceEnabled {
		t.Skip("-race randomises the scheduler's hand-off that this measures; hack/test.sh runs it without -race")
	}
	const streams = 64
	h := newRegisterHarness(t)
	close(h.release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var gss []discoveryv1.PolicyDiscoveryService_StreamPoliciesClient
	for range streams {
		gss = append(gss, h.openAcked(ctx, t, h.client))
	}
	// One P, as on a node whose CPUs are busy with other connections:
	// a goroutine that wakes the connection writer gives it its P as soon
	// as it ends, so a writer goroutine per stream means a flush per
	// stream. With more idle Ps the writer falls behind by chance.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	before := h.serverWrites.Load()
	// Over grpc-go's minBatchSize (1,000 bytes), past which its writer
	// does not yield once before flushing a lone message.
	h.changeTeamPolicy(t, 2, "changed "+strings.Repeat("x", 1500))
	for i, gs := range gss {
		if _, err := gs.Recv(); err != nil {
			t.Fatalf("stream %d: push: %v", i, err)
		}
	}
	if w := h.serverWrites.Load() - before; w > streams/4 {
		t.Errorf("a push to %d streams on one connection took %d writes, want at most %d", streams, w, streams/4)
	} else {
		t.Logf("a push to %d streams on one connection took %d writes", streams, w)
	}
}

// TestStuckStreamDoesNotHoldUpItsConnection: a push runs the writers of a
// connection's streams one after the other (drainConn), so a stream whose
// client stopped reading, and whose send therefore blocks until the send
// timeout ends it, must not keep the streams queued behind it on the same
// connection waiting. On each of three connections, fifteen such streams
// and one that reads, in an order the push does not fix (a map's): each
// reader must get every change while the others stay stuck. Without the
// hand-off a reader fails unless it came first on its connection every
// time: about one chance in 16 per connection.
func TestStuckStreamDoesNotHoldUpItsConnection(t *testing.T) {
	const conns, stuck, rounds = 3, 15, 3
	cfg := config.Default().Discovery
	cfg.SendTimeout = time.Hour // the stuck streams stay stuck
	h := newRegisterHarnessWith(t, cfg)
	close(h.release)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var versions []chan string // each reader's, newest last
	for range conns {
		client := h.dial(t)
		for range stuck {
			h.openAcked(ctx, t, client) // and never read again
		}
		reader, got := h.openAcked(ctx, t, client), make(chan string, 100)
		go func() {
			defer close(got)
			for {
				resp, err := reader.Recv()
				if err != nil {
					return
				}
				got <- resp.GetVersionInfo()
			}
		}()
		versions = append(versions, got)
	}
	id := policy.Identity{Org: "o1", Team: "t1", Employee: "e1"}
	last := make([]string, conns) // each reader's newest version
	waitAll := func() {
		t.Helper()
		want := h.index.Set(id).Version
		deadline := time.After(10 * time.Second)
		for i, ch := range versions {
			for last[i] != want {
				select {
				case v, ok := <-ch:
					if !ok {
						t.Fatalf("connection %d: the reading stream ended before version %q", i, want)
					}
					last[i] = v
				case <-deadline:
					t.Fatalf("connection %d: the reading stream has %q, not version %q", i, last[i], want)
				}
			}
		}
	}
	// 3 KB a change: the unread streams' 64 KiB windows fill after about
	// 20, and their sends then block once grpc-go holds 64 KiB more.
	pad := strings.Repeat("x", 3000)
	index := uint64(2)
	for i := range 60 {
		h.changeTeamPolicy(t, index, "fill "+strconv.Itoa(i)+" "+pad)
		index++
	}
	waitAll()
	for i := range rounds {
		h.changeTeamPolicy(t, index, "round "+strconv.Itoa(i))
		index++
		waitAll()
	}
}
