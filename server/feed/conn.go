package feed

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/policy"
)

// maxReasonBytes is the longest close reason a close frame can carry.
const maxReasonBytes = 123

// conn is one feed connection. It has two goroutines: its handler, which
// reads (only pongs are expected), and writeLoop, which does every write.
type conn struct {
	h           *Hub
	ws          *websocket.Conn
	raw         net.Conn // the hijacked socket, cut when a close stalls
	addr        string   // client_address: peer address and a counter
	peer        string
	connectedAt time.Time

	// Guarded by h.mu.
	ident   policy.Identity
	base    uint64 // changes at or below it are in what was sent
	indexed bool

	queue    chan outMsg
	lastPong atomic.Int64 // unix nanos; the connect time until the first pong
	sent     atomic.Pointer[string]

	closeOnce   sync.Once
	closing     chan struct{} // closed by closeWith; the fields below are set first
	closeCode   websocket.StatusCode
	closeReason string
	final       []byte // sent before the close frame (revoke), or nil
	writerDone  chan struct{}
}

func newConn(h *Hub, ws *websocket.Conn, raw net.Conn, peer string, ident policy.Identity) *conn {
	now := time.Now()
	c := &conn{
		h:           h,
		ws:          ws,
		raw:         raw,
		addr:        fmt.Sprintf("%s#%d", peer, h.seq.Add(1)),
		peer:        peer,
		connectedAt: now,
		ident:       ident,
		queue:       make(chan outMsg, h.cfg.SendBuffer),
		closing:     make(chan struct{}),
		writerDone:  make(chan struct{}),
	}
	c.lastPong.Store(now.UnixNano())
	empty := ""
	c.sent.Store(&empty)
	return c
}

// sentDigest is the digest of the last set-changing message written.
func (c *conn) sentDigest() string { return *c.sent.Load() }

// closeWith asks the writer to close the connection: write final (if any),
// then the close frame with code and reason. Only the first call counts. It
// never blocks.
func (c *conn) closeWith(code websocket.StatusCode, reason string, final []byte) {
	c.closeOnce.Do(func() {
		c.closeCode, c.closeReason, c.final = code, truncateReason(reason), final
		close(c.closing)
	})
}

// cut closes the socket at once, without a close handshake. Every blocked
// read and write of the connection returns.
func (c *conn) cut() {
	if c.raw != nil {
		_ = c.raw.Close()
	}
}

// writeLoop does every write of the connection: queued messages, pings and
// the final close. It returns once the connection is closed.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	interval := c.h.cfg.PingInterval
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		// A pending close wins over queued messages: after a revoke or a
		// slow-consumer decision nothing else is sent.
		select {
		case <-c.closing:
			c.finish()
			return
		default:
		}
		select {
		case <-c.closing:
			c.finish()
			return
		case m := <-c.queue:
			if err := c.write(m.data); err != nil {
				c.closeWith(websocket.StatusAbnormalClosure, "write failed: "+err.Error(), nil)
				continue
			}
			c.written(m)
		case <-ticker.C:
			if since := time.Since(time.Unix(0, c.lastPong.Load())); since >= 2*interval {
				c.closeWith(feedv1.ClosePongTimeout, "no pong for two ping intervals", nil)
				continue
			}
			if err := c.write(pingMessage); err != nil {
				c.closeWith(websocket.StatusAbnormalClosure, "write failed: "+err.Error(), nil)
			}
		}
	}
}

// written records a message that reached the socket.
func (c *conn) written(m outMsg) {
	if m.digest != "" {
		d := m.digest
		c.sent.Store(&d)
	}
	if m.policy {
		c.h.metrics.sent.Inc()
		if !m.at.IsZero() {
			c.h.metrics.latency.Observe(float64(time.Since(m.at)) / float64(time.Millisecond))
		}
	}
}

// write writes one text message within the write timeout.
func (c *conn) write(data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.h.cfg.WriteTimeout)
	defer cancel()
	return c.ws.Write(ctx, websocket.MessageText, data)
}

// finish sends the final message, if any, and closes the connection with
// the requested code. The whole close is bounded: past the grace the
// socket is cut, so a peer that stopped reading cannot hold the goroutine.
func (c *conn) finish() {
	grace := min(c.h.cfg.WriteTimeout, maxCloseGrace)
	t := time.AfterFunc(grace, c.cut)
	defer t.Stop()
	if c.closeCode == websocket.StatusAbnormalClosure {
		// The socket failed; there is nobody to say goodbye to.
		_ = c.ws.CloseNow()
		return
	}
	if c.final != nil {
		_ = c.write(c.final)
	}
	_ = c.ws.Close(c.closeCode, c.closeReason)
}

// clientMessage is what a client may send: only {"type":"pong"} is valid.
type clientMessage struct {
	Type string `json:"type"`
}

// readLoop reads the client's messages until the connection ends. Only
// pong is accepted; anything else closes the connection.
func (c *conn) readLoop() {
	c.ws.SetReadLimit(c.h.cfg.MaxMessageBytes)
	for {
		typ, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.readFailed(err)
			return
		}
		if code, reason, ok := classifyFrame(typ, data); !ok {
			c.closeWith(code, reason, nil)
			return
		}
		c.lastPong.Store(time.Now().UnixNano())
	}
}

// classifyFrame decides what a frame the client sent means: ok for a pong,
// otherwise the close code and reason to end the connection with. It is
// pure (no connection, no clock) so that the decoding of untrusted frames
// can be fuzzed apart from the socket; readLoop is its only caller. The
// reason already fits a close frame.
func classifyFrame(typ websocket.MessageType, data []byte) (code websocket.StatusCode, reason string, ok bool) {
	if typ != websocket.MessageText {
		return websocket.StatusUnsupportedData, "binary frames are not accepted", false
	}
	var m clientMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return feedv1.CloseInvalidMessage, "invalid JSON message", false
	}
	if m.Type != feedv1.TypePong {
		// The type is the client's text, of any length: cut here too, not
		// only in closeWith, so the result stands on its own.
		return feedv1.CloseInvalidMessage, truncateReason(fmt.Sprintf("unexpected message type %q", m.Type)), false
	}
	return 0, "", true
}

// readFailed turns the error that ended the read loop into the close.
func (c *conn) readFailed(err error) {
	switch code := websocket.CloseStatus(err); {
	case errors.Is(err, websocket.ErrMessageTooBig):
		c.closeWith(websocket.StatusMessageTooBig, "message too big", nil)
	case code != -1:
		// The client closed; the library has answered its close frame.
		c.closeWith(code, "closed by client", nil)
	default:
		c.closeWith(websocket.StatusAbnormalClosure, "read failed", nil)
	}
}

// truncateReason cuts a close reason to what a close frame can carry,
// without splitting a UTF-8 sequence.
func truncateReason(s string) string {
	if len(s) <= maxReasonBytes {
		return s
	}
	s = s[:maxReasonBytes]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// hijackRecorder remembers the socket the WebSocket library hijacks, so
// that a stalled close can be cut.
type hijackRecorder struct {
	http.ResponseWriter
	conn net.Conn
}

// Hijack implements http.Hijacker.
func (w *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.conn = nc
	}
	return nc, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *hijackRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
