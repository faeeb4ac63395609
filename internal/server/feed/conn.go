package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/utf8field"
)

// maxReasonBytes is the longest close reason a close frame can carry.
const maxReasonBytes = 123

// conn is one feed connection. An idle one has no goroutine: its writes
// run on a goroutine started when there is something to write (drain),
// its reads on one started when its socket is readable (readTask, started
// by the poller), its ping on a timer. See docs/sidecars.md, the feed in detail.
type conn struct {
	h           *Hub
	ws          *websocket.Conn
	wire        *wire  // the hijacked socket, cut when a close stalls
	id          uint64 // unique in the hub; the poller's key
	addr        string // client_address: peer address and id
	peer        string
	connectedAt time.Time

	// caps is what the client declared at the handshake.
	caps policyset.Caps

	// Guarded by h.mu.
	ident policy.Identity
	// set is the set the messages queued so far bring the client to:
	// its stable set or a rollout's candidate (policyset.SetFor).
	set     *policyset.Set
	base    uint64 // changes at or below it are in what was sent
	indexed bool

	lastPong atomic.Int64           // unix nanos; the connect time until the first pong
	sent     atomic.Pointer[string] // nil until the first set-changing message

	// mu guards the fields below. Lock order: h.mu, then mu, then the
	// poller's.
	mu sync.Mutex
	// queue holds the messages not yet written, at most
	// feed.send_buffer; nil when empty, so that an idle connection holds
	// no queue.
	queue   []outMsg
	started bool // serve has set the connection up: work may start
	writing bool // drain runs: it does every write
	reading bool // a read task runs
	pingDue bool
	// closeReq: closeWith was called and set the close fields; drain
	// writes nothing else, then closes.
	closeReq    bool
	closeCode   websocket.StatusCode
	closeReason string
	final       []byte // sent before the close frame (revoke), or nil
	ended       bool   // the close has begun: nothing new starts
	readerDone  chan struct{}
	pinger      *time.Timer
	polled      *poller // the poller that watches the socket, or nil
}

func newConn(h *Hub, ws *websocket.Conn, w *wire, peer string, ident policy.Identity, caps policyset.Caps) *conn {
	now := time.Now()
	id := h.seq.Add(1)
	c := &conn{
		h:           h,
		ws:          ws,
		wire:        w,
		id:          id,
		addr:        fmt.Sprintf("%s#%d", peer, id),
		peer:        peer,
		connectedAt: now,
		ident:       ident,
		caps:        caps,
	}
	c.lastPong.Store(now.UnixNano())
	limit := h.cfg.MaxMessageBytes
	if caps.Shadow {
		limit = max(limit, maxShadowReportBytes)
	}
	if caps.DecisionLog && h.deps.Decisions != nil {
		limit = max(limit, maxDecisionLogBytes)
	}
	ws.SetReadLimit(limit)
	return c
}

// sentDigest is the digest of the last set-changing message written.
func (c *conn) sentDigest() string {
	if d := c.sent.Load(); d != nil {
		return *d
	}
	return ""
}

// enqueueResult is what enqueue did with a message.
type enqueueResult int

const (
	enqueued enqueueResult = iota
	enqueueClosing
	enqueueFull
)

// enqueue queues m unless the connection is closing or limit messages are
// queued already. It never blocks.
func (c *conn) enqueue(m outMsg, limit int) enqueueResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closeReq:
		return enqueueClosing
	case len(c.queue) >= limit:
		return enqueueFull
	}
	c.queue = append(c.queue, m)
	c.kickLocked()
	return enqueued
}

// queued is the number of messages not yet written.
func (c *conn) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// closeWith asks the connection to close: write final (if any), then the
// close frame with code and reason. Only the first call counts. It never
// blocks.
func (c *conn) closeWith(code websocket.StatusCode, reason string, final []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeReq {
		return
	}
	c.closeReq = true
	c.closeCode, c.closeReason, c.final = code, truncateReason(reason), final
	c.queue = nil
	c.kickLocked()
}

// kickLocked starts drain unless it runs or the connection is not set up
// yet (serve starts it then).
func (c *conn) kickLocked() {
	if c.started && !c.writing && !c.ended {
		c.writing = true
		go c.drain()
	}
}

// start sets up an attached connection: its ping timer and its reader
// (registered with p, or a goroutine of its own when p is nil or cannot
// watch the socket). It reports whether there is something to write, in
// which case the caller must run drain.
func (c *conn) start(p *poller) (drainNow bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started = true
	if !c.closeReq {
		c.pinger = time.AfterFunc(c.h.cfg.PingInterval, c.pingTick)
		c.startReadingLocked(p)
	}
	if c.closeReq || c.pingDue || len(c.queue) > 0 {
		c.writing = true
		return true
	}
	return false
}

// startReadingLocked registers the socket with p, or starts a reader
// goroutine for the connection's lifetime when that is not possible.
func (c *conn) startReadingLocked(p *poller) {
	if p != nil && c.wire.rc != nil {
		c.wire.nonblocking.Store(true)
		err := p.add(c)
		if err == nil {
			c.polled = p
			if c.wire.pending != nil {
				// Sent with the handshake: the socket may never become
				// readable for it.
				c.reading = true
				go c.readTask()
			}
			return
		}
		c.wire.nonblocking.Store(false)
		c.h.logger.Warn("feed connection not polled, reading with a goroutine", "conn", c.addr, "err", err)
	}
	c.reading = true
	go c.readTask()
}

// pingTick runs every feed.ping_interval: it closes a connection that has
// not answered for two intervals, else has drain send a ping.
func (c *conn) pingTick() {
	interval := c.h.cfg.PingInterval
	if time.Since(time.Unix(0, c.lastPong.Load())) >= 2*interval {
		c.closeWith(feedv1.ClosePongTimeout, "no pong for two ping intervals", nil)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeReq || c.ended {
		return
	}
	c.pingDue = true
	c.kickLocked()
	c.pinger.Reset(interval)
}

// drain does every write of the connection, until there is nothing left
// to write: pings, queued messages and, once asked, the close. Only one
// drain runs at a time (writing), and no lock is held across a write.
func (c *conn) drain() {
	for {
		c.mu.Lock()
		if c.closeReq {
			// A pending close wins over queued messages: after a revoke or
			// a slow-consumer decision nothing else is sent.
			c.mu.Unlock()
			c.end()
			return
		}
		var m outMsg
		switch {
		case c.pingDue:
			c.pingDue = false
			m = outMsg{data: pingMessage}
		case len(c.queue) > 0:
			m = c.queue[0]
			c.queue[0] = outMsg{}
			if c.queue = c.queue[1:]; len(c.queue) == 0 {
				c.queue = nil // release the array: idle connections hold none
			}
		default:
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if err := c.write(m.data); err != nil {
			c.closeWith(websocket.StatusAbnormalClosure, "write failed: "+err.Error(), nil)
			continue
		}
		c.written(m)
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

// end closes the connection as asked by closeWith and detaches it from
// the hub, once its reader has stopped. It runs on drain's goroutine.
func (c *conn) end() {
	c.mu.Lock()
	c.ended = true
	if c.pinger != nil {
		c.pinger.Stop()
	}
	p := c.polled
	c.polled = nil
	c.mu.Unlock()
	if p != nil {
		p.remove(c)
	}
	c.finish()
	// The socket is closed: a read in progress returns.
	c.mu.Lock()
	var wait chan struct{}
	if c.reading {
		c.readerDone = make(chan struct{})
		wait = c.readerDone
	}
	c.mu.Unlock()
	if wait != nil {
		<-wait
	}
	c.h.detach(c)
}

// cut closes the socket at once, without a close handshake. Every blocked
// read and write of the connection returns.
func (c *conn) cut() {
	if c.wire != nil {
		_ = c.wire.Close()
	}
}

// finish sends the final message, if any, and closes the connection with
// the requested code. The whole close is bounded: past the grace the
// socket is cut, so a peer that stopped reading cannot hold the goroutine.
// closeReq must have been seen set, under mu.
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
	// The library reads the client's close frame itself, through the
	// wire: it must wait for it.
	c.wire.nonblocking.Store(false)
	_ = c.ws.Close(c.closeCode, c.closeReason)
}

// readable is called by the poller when the socket has something to read.
func (c *conn) readable() {
	c.mu.Lock()
	defer c.mu.Unlock()
	// While closing, the library reads the close handshake itself.
	if c.reading || c.closeReq || c.ended {
		return
	}
	c.reading = true
	go c.readTask()
}

// clientMessage is what a client may send: {"type":"pong"}, a
// shadow_report (feedv1.ShadowReport) or, when invited, a decision_log
// (decisionsv1.Batch).
type clientMessage struct {
	Type string `json:"type"`
}

// readTask reads the client's messages: while polled, until the client is
// between messages and the socket holds nothing more; otherwise until the
// connection ends. Only pong, shadow_report and an invited decision_log
// are accepted; anything else closes the connection.
func (c *conn) readTask() {
	rearm := false
	for {
		typ, data, err := c.ws.Read(context.Background())
		if errors.Is(err, errWouldBlock) {
			rearm = true
			break
		}
		if err != nil {
			c.readFailed(err)
			break
		}
		fr, code, reason, ok := classifyFrame(typ, data, c.h.takesDecisions(c))
		if !ok {
			c.closeWith(code, reason, nil)
			break
		}
		c.lastPong.Store(time.Now().UnixNano())
		switch {
		case fr.shadow != nil:
			c.h.shadowReport(c, fr.shadow)
		case fr.decisions != nil:
			c.h.decisionLog(c, fr.decisions)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reading = false
	switch {
	case c.readerDone != nil:
		close(c.readerDone)
	case !rearm || c.closeReq || c.ended || c.polled == nil:
	default:
		if err := c.polled.rearm(c); err != nil {
			// Keep reading rather than stop: a goroutine until the end.
			c.h.logger.Warn("feed connection not polled any more, reading with a goroutine", "conn", c.addr, "err", err)
			c.wire.nonblocking.Store(false)
			c.reading = true
			go c.readTask()
		}
	}
}

// readFrame is a frame classifyFrame accepted: a pong (both nil), a
// shadow report or a decision batch.
type readFrame struct {
	shadow    *feedv1.ShadowReport
	decisions *decisionsv1.Batch
}

// classifyFrame decides what a frame the client sent means: ok for a pong,
// a shadow_report or, when decisions is true (the connection was invited),
// a decision_log; otherwise the close code and reason to end the
// connection with. It is pure (no connection, no clock) so that the
// decoding of untrusted frames can be fuzzed apart from the socket;
// readTask is its only caller. The reason already fits a close frame. A
// well-formed report's counts and a batch's records are checked by the
// node's aggregate and decision log, which ignore and count bad ones
// without closing.
func classifyFrame(typ websocket.MessageType, data []byte, decisions bool) (fr readFrame, code websocket.StatusCode, reason string, ok bool) {
	if typ != websocket.MessageText {
		return fr, websocket.StatusUnsupportedData, "binary frames are not accepted", false
	}
	// A text frame must be UTF-8 (RFC 6455), and encoding/json would take
	// invalid bytes and lone surrogate escapes for U+FFFD.
	if err := utf8field.JSON(data); err != nil {
		return fr, feedv1.CloseInvalidMessage, truncateReason(err.Error()), false
	}
	if !utf8.Valid(data) {
		return fr, feedv1.CloseInvalidMessage, "message is not valid UTF-8", false
	}
	var m clientMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return fr, feedv1.CloseInvalidMessage, "invalid JSON message", false
	}
	switch m.Type {
	case feedv1.TypePong:
		return fr, 0, "", true
	case feedv1.TypeShadowReport:
		var r feedv1.ShadowReport
		if err := json.Unmarshal(data, &r); err != nil {
			return fr, feedv1.CloseInvalidMessage, "invalid shadow_report message", false
		}
		fr.shadow = &r
		return fr, 0, "", true
	case decisionsv1.TypeDecisionLog:
		if !decisions {
			break
		}
		var b decisionsv1.Batch
		if err := json.Unmarshal(data, &b); err != nil {
			return fr, feedv1.CloseInvalidMessage, "invalid decision_log message", false
		}
		fr.decisions = &b
		return fr, 0, "", true
	}
	// The type is the client's text, of any length: cut here too, not
	// only in closeWith, so the result stands on its own.
	return fr, feedv1.CloseInvalidMessage, truncateReason(fmt.Sprintf("unexpected message type %q", m.Type)), false
}

// readFailed turns the error that ended a read into the close.
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
