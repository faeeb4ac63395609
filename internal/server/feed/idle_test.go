package feed

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// WebSocket opcodes, for the hand-made frames below.
const (
	opContinuation = 0x0
	opText         = 0x1
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
)

var pongJSON = []byte(`{"type":"pong"}`)

// connGoroutines counts the goroutines running feed connection code: its
// writer, its reader, or a handler serving one.
func connGoroutines() int {
	return servertest.Goroutines("server/feed.(*conn).", "server/feed.(*Hub).serve")
}

// TestIdleConnectionsHaveNoGoroutines: once a polled connection has
// written its init, it runs no goroutine at all; without the poller it
// keeps exactly one, its reader. Both still serve updates.
func TestIdleConnectionsHaveNoGoroutines(t *testing.T) {
	const n = 20
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noPoll: mode.noPoll})
			seedData(f)
			clients := make([]*client, n)
			for i := range clients {
				clients[i], _ = f.connect(t, alice, "")
			}
			want := 0
			if mode.noPoll {
				want = n
			}
			poll.Eventually(t, "idle connections", func() error {
				if got := connGoroutines(); got != want {
					return fmt.Errorf("%d goroutines run feed connection code, want %d", got, want)
				}
				return nil
			}, poll.Within(msgTimeout))

			f.apply(f.putPolicy("after-idle", policy.Scope{}, "x"))
			for _, c := range clients {
				if m := c.nextOf(feedv1.TypeUpsert); m.Policy.Name != "after-idle" {
					t.Fatalf("got %+v", m)
				}
			}
		})
	}
}

// TestClientClose: a client's close is answered at once, the connection
// leaves the hub, and (polled) leaves no goroutine behind.
func TestClientClose(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noPoll: mode.noPoll})
			seedData(f)
			c := f.dial(t, dialOpts{token: f.token("alice", "acme", "red"), noRead: true})
			poll.Eventually(t, "connected", func() error {
				if n := len(f.hub.Clients()); n != 1 {
					return fmt.Errorf("%d connections", n)
				}
				return nil
			}, poll.Within(msgTimeout))

			// The library's Close fails unless the server answers the
			// close frame within its own 5 s.
			if err := c.ws.Close(websocket.StatusNormalClosure, "bye"); err != nil {
				t.Fatalf("close: %v", err)
			}
			poll.Eventually(t, "the connection gone", func() error {
				if n := len(f.hub.Clients()); n != 0 {
					return fmt.Errorf("%d connections", n)
				}
				if n := connGoroutines(); n != 0 {
					return fmt.Errorf("%d goroutines run feed connection code", n)
				}
				return nil
			}, poll.Within(msgTimeout))

		})
	}
}

// TestClientFrames sends what the library's client cannot: several
// frames in one write, frames with the handshake, fragmented messages and
// control frames, and checks the server reads each as it must.
func TestClientFrames(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noPoll: mode.noPoll})
			seedData(f)
			pong := clientFrame(true, opText, pongJSON)
			invalid := clientFrame(true, opText, []byte(`{"type":"nope"}`))

			t.Run("with the handshake", func(t *testing.T) {
				c := f.rawDial(t, alice, append(frames(pong, pong), invalid...))
				if code := c.closeCode(); code != feedv1.CloseInvalidMessage {
					t.Fatalf("close code %d, want %d", code, feedv1.CloseInvalidMessage)
				}
			})
			t.Run("pong with the handshake", func(t *testing.T) {
				c := f.rawDial(t, alice, pong)
				c.nextText() // init
				f.waitPong(t, c.addr)
			})
			t.Run("several in one write", func(t *testing.T) {
				c := f.rawDial(t, alice, nil)
				c.nextText() // init
				c.write(frames(pong, pong, invalid))
				if code := c.closeCode(); code != feedv1.CloseInvalidMessage {
					t.Fatalf("close code %d, want %d", code, feedv1.CloseInvalidMessage)
				}
			})
			t.Run("fragmented pong around a ping", func(t *testing.T) {
				c := f.rawDial(t, alice, nil)
				c.nextText() // init
				c.write(clientFrame(false, opText, pongJSON[:4]))
				c.write(clientFrame(true, opPing, []byte("mid")))
				if got := c.nextControl(opPong); string(got) != "mid" {
					t.Fatalf("pong payload %q, want %q", got, "mid")
				}
				c.write(frames(clientFrame(false, opContinuation, pongJSON[4:9]), clientFrame(true, opContinuation, pongJSON[9:])))
				f.waitPong(t, c.addr)
				// Still open and reading.
				c.write(clientFrame(true, opPing, []byte("after")))
				if got := c.nextControl(opPong); string(got) != "after" {
					t.Fatalf("pong payload %q, want %q", got, "after")
				}
			})
			t.Run("protocol ping", func(t *testing.T) {
				c := f.rawDial(t, alice, nil)
				c.nextText() // init
				c.write(clientFrame(true, opPing, []byte("hello")))
				if got := c.nextControl(opPong); string(got) != "hello" {
					t.Fatalf("pong payload %q, want %q", got, "hello")
				}
				if mode.noPoll {
					return
				}
				// The SDK pings this way: no reader may stay blocked after
				// a control frame.
				poll.Eventually(t, "no connection goroutine", func() error {
					if n := connGoroutines(); n != 0 {
						return fmt.Errorf("%d goroutines run feed connection code", n)
					}
					return nil
				}, poll.Within(msgTimeout))

			})
			t.Run("close frame", func(t *testing.T) {
				c := f.rawDial(t, alice, nil)
				c.nextText() // init
				payload := binary.BigEndian.AppendUint16(nil, uint16(websocket.StatusNormalClosure))
				c.write(clientFrame(true, opClose, payload))
				if code := c.closeCode(); code != int(websocket.StatusNormalClosure) {
					t.Fatalf("close code %d, want %d", code, websocket.StatusNormalClosure)
				}
			})
			t.Run("half a frame then the rest", func(t *testing.T) {
				c := f.rawDial(t, alice, nil)
				c.nextText() // init
				fr := clientFrame(true, opText, pongJSON)
				c.write(fr[:3])
				c.write(fr[3:])
				f.waitPong(t, c.addr)
				c.write(invalid)
				if code := c.closeCode(); code != feedv1.CloseInvalidMessage {
					t.Fatalf("close code %d, want %d", code, feedv1.CloseInvalidMessage)
				}
			})
		})
	}
}

func frames(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// waitPong waits until the connection whose client address starts with
// the local address addr has had a pong recorded.
func (f *fixture) waitPong(t *testing.T, addr string) {
	t.Helper()
	poll.Eventually(t, "the pong recorded", func() error {
		for _, cl := range f.hub.Clients() {
			if strings.HasPrefix(cl.ClientAddress, addr+"#") {
				if cl.LastActiveUnixNano > cl.ConnectedAtUnixNano {
					return nil
				}
				return errors.New("no pong recorded")
			}
		}
		return fmt.Errorf("no connection from %s", addr)
	}, poll.Within(msgTimeout))

}

// rawClient is a hand-made WebSocket client over a plain socket.
type rawClient struct {
	t    *testing.T
	nc   net.Conn
	br   *bufio.Reader
	addr string // local address, the server's peer address
}

// rawDial connects as id, sending extra right after the handshake request
// in the same write.
func (f *fixture) rawDial(t *testing.T, id policy.Identity, extra []byte) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	req := "GET " + feedv1.Path + " HTTP/1.1\r\nHost: feed\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
		"Authorization: Bearer " + f.token(id.Employee, id.Org, id.Team) + "\r\n\r\n"
	c := &rawClient{t: t, nc: nc, br: bufio.NewReader(nc), addr: nc.LocalAddr().String()}
	c.write(append([]byte(req), extra...))
	_ = nc.SetReadDeadline(time.Now().Add(msgTimeout))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake status %d", resp.StatusCode)
	}
	return c
}

func (c *rawClient) write(b []byte) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(msgTimeout))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

// readFrame reads one server frame (unmasked).
func (c *rawClient) readFrame() (opcode byte, payload []byte, err error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(msgTimeout))
	var hdr [2]byte
	if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(hdr[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err := io.ReadFull(c.br, ext[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err := io.ReadFull(c.br, ext[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if hdr[0]&0x80 == 0 || hdr[1]&0x80 != 0 || n > 1<<20 {
		return 0, nil, fmt.Errorf("unexpected frame header % x", hdr)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(c.br, payload); err != nil {
		return 0, nil, err
	}
	return hdr[0] & 0x0f, payload, nil
}

// nextText returns the payload of the next text frame that is not a ping.
func (c *rawClient) nextText() []byte {
	c.t.Helper()
	for {
		op, p, err := c.readFrame()
		if err != nil {
			c.t.Fatal(err)
		}
		var m feedv1.Message
		if op == opText && json.Unmarshal(p, &m) == nil && m.Type != feedv1.TypePing {
			return p
		}
	}
}

// nextControl returns the payload of the next control frame, which must
// have opcode op; data frames before it are skipped.
func (c *rawClient) nextControl(op byte) []byte {
	c.t.Helper()
	for {
		got, p, err := c.readFrame()
		if err != nil {
			c.t.Fatal(err)
		}
		if got < opClose {
			continue
		}
		if got != op {
			c.t.Fatalf("control frame %#x %q, want %#x", got, p, op)
		}
		return p
	}
}

// closeCode reads until the server's close frame and returns its code.
func (c *rawClient) closeCode() int {
	c.t.Helper()
	p := c.nextControl(opClose)
	if len(p) < 2 {
		c.t.Fatalf("close frame %q without a code", p)
	}
	return int(binary.BigEndian.Uint16(p))
}

// clientFrame is a masked client frame.
func clientFrame(fin bool, opcode byte, payload []byte) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n <= 0xffff:
		out = append(out, 0x80|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, 0x80|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	var key [4]byte
	_, _ = rand.Read(key[:])
	out = append(out, key[:]...)
	for i, b := range payload {
		out = append(out, b^key[i%4])
	}
	return out
}

// TestHubCloseWithIdleConnections: CloseAll closes polled connections
// that have no goroutine, and stops the poller.
func TestHubCloseWithIdleConnections(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	a, _ := f.connect(t, alice, "")
	b, _ := f.connect(t, bob, "")
	poll.Eventually(t, "idle connections", func() error {
		if n := connGoroutines(); n != 0 {
			return fmt.Errorf("%d goroutines run feed connection code", n)
		}
		return nil
	}, poll.Within(msgTimeout))

	ctx, cancel := context.WithTimeout(context.Background(), 2*shutdownGrace+msgTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() { f.hub.CloseAll(); close(done) }()
	for _, c := range []*client{a, b} {
		if code := c.closeCode(msgTimeout); code != websocket.StatusGoingAway {
			t.Errorf("close code %d, want 1001", code)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("CloseAll did not return")
	}
	f.hub.mu.RLock()
	p := f.hub.poll
	f.hub.mu.RUnlock()
	if p != nil {
		t.Fatal("the poller outlived CloseAll")
	}
}

// TestTLSConnectionsReadWithAGoroutine: a TLS connection cannot be polled
// (tls.Conn buffers what the socket's readiness does not show): it reads
// with a goroutine of its own, and works as any other.
func TestTLSConnectionsReadWithAGoroutine(t *testing.T) {
	f := newFixture(t, fixtureOpts{tls: true, feed: func(c *config.Feed) { c.PingInterval = 50 * time.Millisecond }})
	seedData(f)
	c, _ := f.connect(t, alice, "")
	f.apply(f.putPolicy("over-tls", policy.Scope{}, "x"))
	if m := c.nextOf(feedv1.TypeUpsert); m.Policy.Name != "over-tls" {
		t.Fatalf("got %+v", m)
	}
	// Pongs are read: the connection outlives two ping intervals.
	poll.Eventually(t, "a pong recorded", func() error {
		cl := f.hub.Clients()
		if len(cl) != 1 || cl[0].LastActiveUnixNano <= cl[0].ConnectedAtUnixNano {
			return fmt.Errorf("clients %v: want one with a pong recorded", cl)
		}
		return nil
	}, poll.Within(msgTimeout))

	if n := connGoroutines(); n < 1 {
		t.Fatalf("%d goroutines run feed connection code, want its reader", n)
	}
}
