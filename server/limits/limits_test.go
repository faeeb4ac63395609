package limits

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGate(t *testing.T) {
	m := newMetrics(t)
	g := NewGate(2, 50*time.Millisecond, m)
	ctx := context.Background()
	r1, err := g.Enter(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := g.Enter(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	// Full: the third waits max_wait and is refused.
	if _, err := g.Enter(ctx, "test"); !errors.Is(err, ErrBusy) {
		t.Fatalf("third set-up: %v, want ErrBusy", err)
	}
	if got := testutil.ToFloat64(m.admRejected.WithLabelValues("test")); got != 1 {
		t.Fatalf("rejections %v, want 1", got)
	}
	// A cancelled caller gives up with its context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.Enter(cctx, "test"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled set-up: %v, want context.Canceled", err)
	}
	// A waiter gets the slot a release frees; a second release is a no-op.
	got := make(chan error, 1)
	go func() {
		g := NewGate(1, time.Minute, m)
		r, err := g.Enter(ctx, "test")
		if err != nil {
			got <- err
			return
		}
		done := make(chan error, 1)
		go func() {
			r, err := g.Enter(ctx, "test")
			if err == nil {
				r()
			}
			done <- err
		}()
		r()
		r()
		got <- <-done
	}()
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	r1()
	r1()
	r2()
	if v := testutil.ToFloat64(m.admInFlight); v != 0 {
		t.Fatalf("in flight %v after every release, want 0", v)
	}
}

func TestGateHTTP(t *testing.T) {
	g := NewGate(1, 20*time.Millisecond, newMetrics(t))
	release, err := g.Enter(context.Background(), "websocket")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	called := false
	h := g.HTTP("websocket", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ws/policies", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || called {
		t.Fatalf("busy gate: %d, Retry-After %q, handler called %v; want 503 with Retry-After, not called",
			rec.Code, rec.Header().Get("Retry-After"), called)
	}
}

type fakeStream struct {
	grpc.ServerStream
	recvs int
}

func (s *fakeStream) Context() context.Context { return context.Background() }
func (s *fakeStream) RecvMsg(any) error        { s.recvs++; return io.EOF }

func TestStreamInterceptor(t *testing.T) {
	m := newMetrics(t)
	g := NewGate(1, 20*time.Millisecond, m)
	icpt := g.StreamInterceptor("grpc", "/svc/Gated")
	info := func(method string) *grpc.StreamServerInfo { return &grpc.StreamServerInfo{FullMethod: method} }

	// The slot is held during set-up and given back at the first read.
	err := icpt(nil, &fakeStream{}, info("/svc/Gated"), func(_ any, ss grpc.ServerStream) error {
		if v := testutil.ToFloat64(m.admInFlight); v != 1 {
			t.Errorf("in flight during set-up: %v, want 1", v)
		}
		_ = ss.RecvMsg(nil)
		if v := testutil.ToFloat64(m.admInFlight); v != 0 {
			t.Errorf("in flight after the first read: %v, want 0", v)
		}
		// Another stream can set up while this one lives on.
		return icpt(nil, &fakeStream{}, info("/svc/Gated"), func(any, grpc.ServerStream) error { return nil })
	})
	if err != nil {
		t.Fatal(err)
	}

	// Busy: Unavailable; ungated methods pass.
	release, _ := g.Enter(context.Background(), "grpc")
	defer release()
	err = icpt(nil, &fakeStream{}, info("/svc/Gated"), func(any, grpc.ServerStream) error { return nil })
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("busy gate: %v, want Unavailable", err)
	}
	if err := icpt(nil, &fakeStream{}, info("/svc/Other"), func(any, grpc.ServerStream) error { return nil }); err != nil {
		t.Fatalf("ungated method: %v", err)
	}
}

func TestListenerCap(t *testing.T) {
	m := newMetrics(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := NewConns("test", 2, m, slog.New(slog.DiscardHandler))
	capped := c.Listener(ln)
	defer capped.Close()

	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			nc, err := capped.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- nc
		}
	}()
	var clients []net.Conn
	for range 3 {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		clients = append(clients, nc)
	}
	first, second := <-accepted, <-accepted
	// The third is over the cap: closed by the listener, never returned.
	_ = clients[2].SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := clients[2].Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("third connection: read %v, want it closed by the server", err)
	}
	if got := testutil.ToFloat64(m.connsRejected.WithLabelValues("test")); got != 1 {
		t.Fatalf("rejected %v, want 1", got)
	}
	// Closing one (twice) frees exactly one slot.
	_ = first.Close()
	_ = first.Close()
	if c.Open() != 1 {
		t.Fatalf("open %d after one close, want 1", c.Open())
	}
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fourth := <-accepted
	_ = fourth.Close()
	_ = second.Close()
	if c.Open() != 0 {
		t.Fatalf("open %d after every close, want 0", c.Open())
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestConnState(t *testing.T) {
	m := newMetrics(t)
	c := NewConns("http", 1, m, slog.New(slog.DiscardHandler))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = c.ConnState(nil)
	srv.Start()
	defer srv.Close()

	hold, err := net.Dial("tcp", srv.Listener.Addr().String()) // takes the one slot, sends nothing
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "first connection counted", func() bool { return c.Open() == 1 })
	resp, err := http.Get(srv.URL) //nolint:noctx // test client
	if err == nil {
		resp.Body.Close()
		t.Fatalf("request over the cap answered %d, want the connection closed", resp.StatusCode)
	}
	_ = hold.Close()
	eventually(t, "slot freed and one rejection counted", func() bool {
		return c.Open() == 0 && testutil.ToFloat64(m.connsRejected.WithLabelValues("http")) == 1
	})
	// The slot is free again.
	resp, err = http.Get(srv.URL) //nolint:noctx // test client
	if err != nil {
		t.Fatalf("request after the slot freed: %v", err)
	}
	resp.Body.Close()
}

// eventually polls cond until it holds, failing the test after a deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for: %s", what)
		case <-tick.C:
		}
	}
}
