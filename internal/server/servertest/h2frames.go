package servertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
)

// H2Recorder records what one side of HTTP/2 connections sends, so that a
// test can count its frames: wrap a server's listener to see what clients
// send, or a client's dialer to see what the server sends.
type H2Recorder struct {
	mu    sync.Mutex
	conns []*bytes.Buffer
}

// Listener wraps ln: what accepted connections receive is recorded.
func (r *H2Recorder) Listener(ln net.Listener) net.Listener {
	return &recordingListener{Listener: ln, r: r}
}

// Dial dials addr over TCP and records what the connection receives; it
// fits grpc.WithContextDialer.
func (r *H2Recorder) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return r.wrap(c), nil
}

// Pings counts the PING frames (not PING acknowledgements) recorded so far.
// A connection's last frame may be cut short by the moment of the count;
// it is left out.
func (r *H2Recorder) Pings(t testing.TB) int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, b := range r.conns {
		data := bytes.TrimPrefix(b.Bytes(), []byte(http2.ClientPreface))
		fr := http2.NewFramer(io.Discard, bytes.NewReader(data))
		fr.SetMaxReadFrameSize(1 << 24)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				var ce http2.ConnectionError
				if errors.As(err, &ce) {
					t.Fatalf("recorded bytes are not HTTP/2 frames: %v", err)
				}
				break
			}
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
				n++
			}
		}
	}
	return n
}

func (r *H2Recorder) wrap(c net.Conn) net.Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &bytes.Buffer{}
	r.conns = append(r.conns, b)
	return &recordingConn{Conn: c, r: r, b: b}
}

type recordingListener struct {
	net.Listener
	r *H2Recorder
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.r.wrap(c), nil
}

type recordingConn struct {
	net.Conn
	r *H2Recorder
	b *bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.b.Write(p[:n])
	c.r.mu.Unlock()
	return n, err
}
