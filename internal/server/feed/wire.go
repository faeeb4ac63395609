package feed

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
)

// Buffer sizes of a connection's socket, as the WebSocket library sees it.
// net/http hands a hijacked connection over with a 4 KiB read and a 4 KiB
// write buffer, which would stay with it for its lifetime: most of an idle
// connection's memory. The feed replaces them with small ones.
const (
	// readBufferSize: clients only send pongs (21 bytes framed) and
	// close frames; larger frames are read in more syscalls.
	readBufferSize = 128
	// writeBufferSize: the library writes a frame's header into this
	// buffer, and a payload that does not fit flushes it and goes to the
	// wire directly. The wire holds such a flush back and sends it with
	// the rest of the frame in one writev (see wire.Write), so every frame
	// is one write syscall whatever its size, and the buffer only has to
	// hold a header (at most 10 bytes from a server) and then some.
	writeBufferSize = 16
	// fallbackWriteBufferSize is the write buffer of a connection without
	// a socket to writev on (TLS, other platforms), which the wire writes
	// through: a frame that fits (ping, delete, revoke, close, most
	// upserts) is one write, and one TLS record; a longer one is two.
	fallbackWriteBufferSize = 1024
)

// errWouldBlock is what a non-blocking wire returns when the socket holds
// nothing and the client is between messages. The read task that gets it
// ends; the poller starts the next when the socket becomes readable.
var errWouldBlock = errors.New("feed: no data ready")

// wire is a connection's socket, as handed to the WebSocket library. Its
// Read can refuse to wait for data (errWouldBlock) while the client is
// between two messages, which is what lets an idle connection have no
// reader goroutine: see docs/sidecars.md, idle connections.
//
// The library only reads through a bufio.Reader over the wire, and a
// bufio.Reader only calls Read when it holds nothing: every byte the wire
// returned before has been taken by the library by then. So the wire knows
// where the library is in the frame stream by parsing (frames) what it
// returns, and refuses to wait only at a message boundary, where a failed
// read leaves the library's state as it was (the frame header is read
// from its first byte). Mid-frame, or in blocking mode, it waits as any
// socket read does.
type wire struct {
	net.Conn
	rc syscall.RawConn // nil: the socket cannot be polled; reads always block
	// pending holds what the client sent after its handshake, read by
	// net/http already: returned first.
	pending []byte
	// nonblocking: refuse to wait at a message boundary. Set while the
	// poller watches the socket, cleared before the close handshake, which
	// the library reads through the wire itself.
	nonblocking atomic.Bool
	// frames is only used by Read, which the library serializes.
	frames frameTracker
	// out follows the frames the library writes, and held is the start
	// of one (a buffer flush) not yet sent; only Write uses them, which
	// the library serializes too.
	out   frameTracker
	held  [writeBufferSize]byte
	nheld int
}

// Write implements net.Conn. The library writes a frame as its header
// and the payload's first bytes (a flush of its small buffer), then the
// rest of the payload in one call. A write that leaves a frame unfinished
// and fits in held is kept, and sent together with the next write, which
// for the library's frames is the rest of the same frame: one writev per
// frame instead of two writes. Nothing is held once a frame is complete,
// so nothing waits for a later message. A connection without a socket to
// writev on (rc nil) is written through.
func (w *wire) Write(p []byte) (int, error) {
	if w.rc == nil {
		return w.Conn.Write(p) // with a larger buffer: fallbackWriteBufferSize
	}
	w.out.feed(p)
	complete := w.out.atFrameBoundary()
	if !complete && w.nheld+len(p) <= len(w.held) {
		w.nheld += copy(w.held[w.nheld:], p)
		return len(p), nil
	}
	if w.nheld == 0 {
		return w.Conn.Write(p)
	}
	held := w.nheld
	w.nheld = 0
	n, err := writeVec(w.rc, w.held[:held], p)
	return max(n-held, 0), err
}

// Read implements net.Conn.
func (w *wire) Read(p []byte) (int, error) {
	if len(w.pending) > 0 {
		n := copy(p, w.pending)
		w.frames.feed(p[:n])
		if w.pending = w.pending[n:]; len(w.pending) == 0 {
			w.pending = nil
		}
		return n, nil
	}
	var (
		n   int
		err error
	)
	if w.rc != nil && w.nonblocking.Load() && w.frames.atMessageBoundary() {
		n, err = tryRead(w.rc, p)
	} else {
		n, err = w.Conn.Read(p)
	}
	w.frames.feed(p[:max(n, 0)])
	return n, err
}

// frameTracker follows the frame structure of a client's byte stream
// (RFC 6455 section 5.2): it only needs each frame's length and whether it
// ends a data message. It never fails: bytes that make no valid frame are
// the library's to refuse.
type frameTracker struct {
	hdr       [14]byte // the current frame's header, as far as seen
	nhdr      int      // header bytes seen; 0 between frames
	payload   uint64   // payload bytes of the current frame not yet seen
	inMessage bool     // a data message has begun and its final frame has not ended
	final     bool     // the current frame ends a data message
}

// atMessageBoundary reports whether the bytes fed so far end with a whole
// data message (or nothing): no frame begun, no fragmented message open.
func (t *frameTracker) atMessageBoundary() bool {
	return t.nhdr == 0 && t.payload == 0 && !t.inMessage
}

// feed takes the next bytes of the stream.
func (t *frameTracker) feed(p []byte) {
	for len(p) > 0 {
		if t.payload > 0 {
			n := uint64(len(p))
			if n > t.payload {
				n = t.payload
			}
			t.payload -= n
			p = p[n:]
			if t.payload == 0 {
				t.frameEnded()
			}
			continue
		}
		t.hdr[t.nhdr] = p[0]
		t.nhdr++
		p = p[1:]
		need, ok := t.headerLen()
		if !ok || t.nhdr < need {
			continue
		}
		t.payload = t.payloadLen()
		t.nhdr = 0
		// Control frames (opcode 8 and up) may come between the frames of
		// a data message and do not change whether one is open.
		t.final = false
		if opcode := t.hdr[0] & 0x0f; opcode < 8 {
			t.inMessage = true
			t.final = t.hdr[0]&0x80 != 0 // FIN
		}
		if t.payload == 0 {
			t.frameEnded()
		}
	}
}

// atFrameBoundary reports whether the bytes fed so far end with a whole
// frame (or nothing).
func (t *frameTracker) atFrameBoundary() bool {
	return t.nhdr == 0 && t.payload == 0
}

// frameEnded records the end of the current frame's payload.
func (t *frameTracker) frameEnded() {
	if t.final {
		t.inMessage = false
		t.final = false
	}
}

// headerLen is the length of the current header, once its second byte is
// known.
func (t *frameTracker) headerLen() (int, bool) {
	if t.nhdr < 2 {
		return 0, false
	}
	n := 2
	switch t.hdr[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if t.hdr[1]&0x80 != 0 {
		n += 4 // masking key
	}
	return n, true
}

// payloadLen decodes the payload length of a complete header.
func (t *frameTracker) payloadLen() uint64 {
	switch l := t.hdr[1] & 0x7f; l {
	case 126:
		return uint64(t.hdr[2])<<8 | uint64(t.hdr[3])
	case 127:
		var v uint64
		for _, b := range t.hdr[2:10] {
			v = v<<8 | uint64(b)
		}
		return v
	default:
		return uint64(l)
	}
}

// hijacker hands the WebSocket library the feed's wire instead of the
// socket net/http hijacked, with small buffers (see readBufferSize).
type hijacker struct {
	http.ResponseWriter
	wire *wire // set by a successful Hijack
}

// Hijack implements http.Hijacker.
func (h *hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, rw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// net/http flushed the response already; this is in case it did not.
	if err := rw.Flush(); err != nil {
		_ = nc.Close()
		return nil, nil, err
	}
	w := &wire{Conn: nc, rc: rawConnOf(nc)}
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Peek(n) // cannot fail: n bytes are buffered
		w.pending = append([]byte(nil), b...)
	}
	h.wire = w
	wsize := writeBufferSize
	if w.rc == nil {
		wsize = fallbackWriteBufferSize
	}
	return w, bufio.NewReadWriter(bufio.NewReaderSize(w, readBufferSize), bufio.NewWriterSize(w, wsize)), nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (h *hijacker) Unwrap() http.ResponseWriter { return h.ResponseWriter }
