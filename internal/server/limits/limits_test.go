package limits

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/internal/poll"
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

// capDialer dials a listener from a chosen loopback source address; every
// 127.0.0.0/8 address reaches a 127.0.0.1 listener on Linux.
func capDial(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// acceptAll accepts from ln until it is closed, sending what it accepts.
func acceptAll(t *testing.T, ln net.Listener) <-chan net.Conn {
	t.Helper()
	accepted := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- nc
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return accepted
}

func rejected(m *Metrics, listener, reason string) int {
	return int(testutil.ToFloat64(m.connsRejected.WithLabelValues(listener, reason)))
}

func TestListenerCaps(t *testing.T) {
	const a, b = "127.0.0.1", "127.0.0.2"
	tests := []struct {
		name string
		caps Caps
		from []string // dialled in order
		want []bool   // accepted
		// refused by max_connections and by max_connections_per_ip
		wantMax, wantPerIP int
	}{
		{name: "no caps", from: []string{a, a, a, b}, want: []bool{true, true, true, true}},
		{name: "max", caps: Caps{Max: 2}, from: []string{a, b, b, a},
			want: []bool{true, true, false, false}, wantMax: 2},
		{name: "per IP", caps: Caps{PerIP: 2}, from: []string{a, a, a, b, b, b},
			want: []bool{true, true, false, true, true, false}, wantPerIP: 2},
		{name: "both", caps: Caps{Max: 3, PerIP: 2}, from: []string{a, a, a, b, b},
			want: []bool{true, true, false, true, false}, wantMax: 1, wantPerIP: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMetrics(t)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			c := NewConns("test", tc.caps, m, slog.New(slog.DiscardHandler))
			accepted := acceptAll(t, c.Listener(ln))
			refusedSoFar := func() int { return rejected(m, "test", reasonMax) + rejected(m, "test", reasonPerIP) }

			var server []net.Conn
			for i, from := range tc.from {
				client := capDial(t, ln.Addr().String(), from)
				// The listener has decided once the dial is counted one way
				// or the other.
				poll.Eventually(t, fmt.Sprintf("dial %d decided", i), poll.Holds(func() bool { return c.Open()+refusedSoFar() == i+1 }))
				if got := len(server) < c.Open(); got != tc.want[i] {
					t.Fatalf("dial %d from %s: accepted %v, want %v", i, from, got, tc.want[i])
				}
				if !tc.want[i] {
					// Closed by the listener, never returned by Accept.
					_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
					if _, err := client.Read(make([]byte, 1)); err == nil || isTimeout(err) {
						t.Fatalf("dial %d from %s: read %v, want the connection closed by the server", i, from, err)
					}
					continue
				}
				server = append(server, <-accepted)
			}
			if got, want := rejected(m, "test", reasonMax), tc.wantMax; got != want {
				t.Errorf("refused by max_connections: %d, want %d", got, want)
			}
			if got, want := rejected(m, "test", reasonPerIP), tc.wantPerIP; got != want {
				t.Errorf("refused by max_connections_per_ip: %d, want %d", got, want)
			}
			if got, want := int(testutil.ToFloat64(m.connsOpen.WithLabelValues("test"))), len(server); got != want {
				t.Errorf("open gauge %d, want %d", got, want)
			}

			// Closing one (twice) frees exactly its slot: the same source
			// gets in again.
			_ = server[0].Close()
			_ = server[0].Close()
			if got, want := c.Open(), len(server)-1; got != want {
				t.Fatalf("open %d after one close, want %d", got, want)
			}
			capDial(t, ln.Addr().String(), tc.from[0])
			server[0] = <-accepted
			for _, nc := range server {
				_ = nc.Close()
			}
			if c.Open() != 0 || len(c.byIP) != 0 {
				t.Fatalf("after every close: open %d, per-IP counts %v; want none", c.Open(), c.byIP)
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestHijackedConnsStayCounted: a connection net/http hands over (the
// feed's upgrade) counts until the new owner closes it, so max_connections
// bounds upgraded connections too.
func TestHijackedConnsStayCounted(t *testing.T) {
	m := newMetrics(t)
	c := NewConns("http", Caps{Max: 1}, m, slog.New(slog.DiscardHandler))
	hijacked := make(chan net.Conn, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		nc, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
		_ = rw.Flush()
		hijacked <- nc
	}))
	srv.Listener = c.Listener(srv.Listener)
	srv.Start()
	defer srv.Close()

	upgraded := capDial(t, srv.Listener.Addr().String(), "127.0.0.1")
	if _, err := io.WriteString(upgraded, "GET / HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	nc := <-hijacked
	if got := c.Open(); got != 1 {
		t.Fatalf("open %d after the hijack, want 1", got)
	}
	// The hijacked connection holds the only slot: a new one is refused.
	resp, err := http.Get(srv.URL) //nolint:noctx // test client
	if err == nil {
		resp.Body.Close()
		t.Fatalf("request while the hijacked connection is open answered %d, want the connection closed", resp.StatusCode)
	}
	if got := rejected(m, "http", reasonMax); got != 1 {
		t.Fatalf("refused %d, want 1", got)
	}
	// Closing it gives the slot back.
	_ = nc.Close()
	if got := c.Open(); got != 0 {
		t.Fatalf("open %d after the hijacked connection closed, want 0", got)
	}
	resp, err = http.Get(srv.URL) //nolint:noctx // test client
	if err != nil {
		t.Fatalf("request after the slot freed: %v", err)
	}
	resp.Body.Close()
}

// TestCountedConnExposesSocket: the feed's poller reads an idle
// connection's socket directly, which must read the connection itself.
func TestCountedConnExposesSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := acceptAll(t, NewConns("http", Caps{Max: 1}, newMetrics(t), slog.New(slog.DiscardHandler)).Listener(ln))
	client := capDial(t, ln.Addr().String(), "127.0.0.1")
	if _, err := io.WriteString(client, "ping"); err != nil {
		t.Fatal(err)
	}
	nc := <-accepted
	defer nc.Close()
	sc, ok := nc.(syscall.Conn)
	if !ok {
		t.Fatalf("%T does not expose its socket (syscall.Conn)", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	err = rc.Read(func(fd uintptr) bool {
		buf := make([]byte, 16)
		n, err := syscall.Read(int(fd), buf)
		if err == syscall.EAGAIN {
			return false // not there yet: wait for readiness
		}
		got = buf[:max(n, 0)]
		return true
	})
	if err != nil || string(got) != "ping" {
		t.Fatalf("read from the socket: %q, %v; want %q", got, err, "ping")
	}
}
