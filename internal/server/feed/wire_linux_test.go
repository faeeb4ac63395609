package feed

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/policyd/policyd/internal/server/limits"
)

// dataSegsOut is the number of TCP segments carrying data that the socket
// under nc has sent. On loopback (MTU 64 KiB, no Nagle) every write
// syscall of less than a segment's worth sends exactly one, so it counts
// the writes.
func dataSegsOut(t *testing.T, nc net.Conn) uint32 {
	t.Helper()
	sc, ok := nc.(syscall.Conn)
	if !ok {
		t.Fatalf("%T has no raw socket", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var (
		info *unix.TCPInfo
		ierr error
	)
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatalf("TCP_INFO: %v", ierr)
	}
	return info.Data_segs_out
}

// TestWireOneWritePerFrame sends messages of every header size through
// the WebSocket library over a real wire and socket, and checks that each
// arrives intact and, on a socket, took one write: the library's header
// flush is held back and sent with the rest of the frame. The server's
// listeners wrap their connections (connection limits), which net.Buffers
// would write in two. TLS has no socket to writev on and is written
// through, with a larger buffer.
func TestWireOneWritePerFrame(t *testing.T) {
	m, err := limits.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	counted := limits.NewConns("test", limits.Caps{}, m, slog.New(slog.DiscardHandler))
	tests := []struct {
		name       string
		wrap       func(net.Listener) net.Listener
		tls        bool
		countsSegs bool
	}{
		{"plain TCP", nil, false, true},
		{"counted by the connection limits", counted.Listener, false, true},
		{"TLS", nil, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkOneWritePerFrame(t, tt.wrap, tt.tls, tt.countsSegs)
		})
	}
}

func checkOneWritePerFrame(t *testing.T, wrap func(net.Listener) net.Listener, useTLS, countSegs bool) {
	sizes := []struct {
		name string
		n    int
	}{
		{"empty", 0},
		{"fits the buffer with its header", writeBufferSize - 2},
		{"one byte over the buffer", writeBufferSize - 1},
		{"125, the longest 7-bit length", 125},
		{"126, the shortest 16-bit length", 126},
		{"a kilobyte", 1000},
		{"a 4 KB policy", 4096},
		{"60,000, near the 16-bit maximum", 60000},
		{"65,536, the shortest 64-bit length", 65536},
		{"a megabyte, more than a socket buffer", 1 << 20},
	}
	type conn struct {
		ws   *websocket.Conn
		wire *wire
	}
	accepted := make(chan conn, 1)
	done := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hj := &hijacker{ResponseWriter: w}
		ws, err := websocket.Accept(hj, r, nil)
		if err != nil {
			return
		}
		accepted <- conn{ws, hj.wire}
		<-done
	}))
	if wrap != nil {
		srv.Listener = wrap(srv.Listener)
	}
	if useTLS {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	defer srv.Close()
	defer close(done)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// http://… becomes ws://…, https://… wss://….
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), //nolint:bodyclose // Dial owns the response body
		&websocket.DialOptions{HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.CloseNow() }()
	client.SetReadLimit(2 << 20)
	var server conn
	select {
	case server = <-accepted:
	case <-ctx.Done():
		t.Fatal("no connection accepted")
	}
	defer func() { _ = server.ws.CloseNow() }()
	if hasSocket := server.wire.rc != nil; hasSocket != countSegs {
		t.Fatalf("wire over %T: raw socket %v, want %v", server.wire.Conn, hasSocket, countSegs)
	}

	for _, sz := range sizes {
		t.Run(sz.name, func(t *testing.T) {
			msg := bytes.Repeat([]byte{'a' + byte(sz.n%26)}, sz.n)
			var before uint32
			if countSegs {
				before = dataSegsOut(t, server.wire.Conn)
			}
			// A message larger than the socket's buffers is only written
			// as the client reads it.
			wrote := make(chan error, 1)
			go func() { wrote <- server.ws.Write(ctx, websocket.MessageText, msg) }()
			typ, got, err := client.Read(ctx)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if err := <-wrote; err != nil {
				t.Fatalf("write: %v", err)
			}
			if typ != websocket.MessageText || !bytes.Equal(got, msg) {
				t.Fatalf("got %v of %d bytes, want text of %d", typ, len(got), len(msg))
			}
			if countSegs && sz.n < 60000 {
				if segs := dataSegsOut(t, server.wire.Conn) - before; segs != 1 {
					t.Errorf("%d-byte message took %d segments, want 1", sz.n, segs)
				}
			}
			if server.wire.nheld != 0 {
				t.Errorf("%d bytes still held after a whole frame", server.wire.nheld)
			}
		})
	}

	// A close frame with a reason goes through the same path. Close
	// waits for the client's answer, which it sends when it reads.
	closed := make(chan error, 1)
	go func() { closed <- server.ws.Close(websocket.StatusGoingAway, "server shutting down") }()
	_, _, err = client.Read(ctx)
	if code := websocket.CloseStatus(err); code != websocket.StatusGoingAway {
		t.Errorf("client read after close: %v (status %v), want 1001", err, code)
	}
	if err := <-closed; err != nil && !errors.Is(err, net.ErrClosed) {
		t.Errorf("close handshake: %v", err)
	}
}
