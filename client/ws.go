package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// wsHandshakeTimeout bounds one WebSocket handshake.
const wsHandshakeTimeout = 10 * time.Second

// wsTransport follows the WebSocket feed.
type wsTransport struct {
	c  *Client
	tr *http.Transport
	hc *http.Client
	// takesDecisions is, by server, whether its last init said it takes
	// decision_log frames: a resume that is answered with a replay, not an
	// init, goes by it. Only Run's goroutine uses it.
	takesDecisions map[string]bool
}

func newWSTransport(c *Client) *wsTransport {
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: c.cfg.TLS.Clone()}
	return &wsTransport{c: c, tr: tr, hc: &http.Client{Transport: tr}, takesDecisions: map[string]bool{}}
}

// close releases idle HTTP connections (left by refused handshakes).
func (w *wsTransport) close() { w.tr.CloseIdleConnections() }

func (w *wsTransport) session(ctx context.Context, server string) (synced bool, err error) {
	c := w.c
	u, err := feedURL(server, c.cfg.TLS != nil)
	if err != nil {
		return false, err
	}
	_, _, since, has := c.snapshot()
	token, err := c.token(ctx)
	if err != nil {
		return false, err
	}
	q := url.Values{}
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	} else if c.cfg.Employee != "" {
		q.Set(feedv1.QueryEmployee, c.cfg.Employee)
	}
	// A server that predates the parameter ignores it (see capabilities).
	q.Set(feedv1.QueryCapabilities, strings.Join(c.capabilities(), ","))
	resume := has && since > 0
	if resume {
		q.Set(feedv1.QuerySince, strconv.FormatUint(since, 10))
	}
	u.RawQuery = q.Encode()

	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(wsHandshakeTimeout, func() { cancel(errors.New("handshake timed out")) })
	// The response body needs no closing: Dial replaces it (see its doc).
	conn, resp, err := websocket.Dial(sctx, u.String(), &websocket.DialOptions{HTTPClient: w.hc, HTTPHeader: hdr}) //nolint:bodyclose // Dial owns the body

	timer.Stop()
	if err != nil {
		w.tr.CloseIdleConnections()
		if cause := context.Cause(sctx); cause != nil && ctx.Err() == nil {
			err = cause
		}
		return false, handshakeError(u, resp, err)
	}
	defer conn.CloseNow() //nolint:errcheck // best effort: the session is over
	conn.SetReadLimit(int64(c.cfg.MaxMessageBytes))
	c.count(func(s *Stats) { s.Connects++; s.Server = server })
	c.logger.Info("policy feed connected", "server", server, "since", since)

	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.pingLoop(sctx, conn, cancel)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		// A report written is taken as delivered: the feed has no answer
		// to it, and a node drops one that comes too soon.
		c.shadowLoop(sctx, max(c.cfg.ShadowReportInterval, wsMinShadowInterval), func(ctx context.Context, deltas []ShadowCount) error {
			b, err := json.Marshal(feedv1.ShadowReport{Type: feedv1.TypeShadowReport, Counts: feedShadowCounts(deltas)})
			if err != nil {
				return err
			}
			return conn.Write(ctx, websocket.MessageText, b)
		})
	}()

	// takes says whether this connection's server takes decision_log
	// frames; an init says, and sets it.
	var takes atomic.Bool
	takes.Store(resume && w.takesDecisions[server])
	if c.dlog != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A batch written is taken as delivered, as a shadow report is.
			// The library serializes it with the pongs and reports written
			// on the same connection.
			c.shipLoop(sctx, takes.Load, func(ctx context.Context, records [][]byte, drops decisionsv1.Drops) (shipResult, error) {
				raw := make([]json.RawMessage, len(records))
				for i, r := range records {
					raw[i] = r
				}
				b, err := json.Marshal(decisionsv1.Batch{Type: decisionsv1.TypeDecisionLog, Records: raw, Dropped: drops})
				if err != nil {
					return shipResult{}, err
				}
				if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
					return shipResult{}, err
				}
				return shipResult{accepted: uint64(len(records))}, nil
			})
		}()
	}

	if resume {
		// The server replays what was missed, or sends init: the cached
		// set is current enough to be in force.
		synced = true
		c.synced()
	}
	// The session's end closes the connection, which ends a read in
	// progress. Reads themselves take no context: the library registers a
	// context.AfterFunc for every read given one that can end, two
	// allocations per message for what one registration does here.
	stopClosing := context.AfterFunc(sctx, func() { _ = conn.CloseNow() })
	defer stopClosing()
	var buf bytes.Buffer
	for {
		typ, data, err := readMessage(conn, &buf)
		if err != nil {
			if code := websocket.CloseStatus(err); code == feedv1.CloseRevoked {
				var ce websocket.CloseError
				errors.As(err, &ce)
				return synced, &revokedError{reason: ce.Reason}
			}
			if cause := context.Cause(sctx); cause != nil && !errors.Is(cause, context.Canceled) {
				err = cause
			}
			return synced, err
		}
		c.count(func(*Stats) {})
		if typ != websocket.MessageText {
			c.logger.Debug("ignoring a binary feed frame", "bytes", len(data))
			continue
		}
		m, err := decodeFeedMessage(data)
		if err != nil {
			// A message we cannot read may be a change we would miss:
			// reconnect, and the replay brings it again.
			return synced, err
		}
		if m.Type == feedv1.TypeInit {
			takes.Store(m.DecisionLog)
			w.takesDecisions[server] = m.DecisionLog
		}
		done, err := w.handle(sctx, conn, &m, server)
		if err != nil {
			return synced, err
		}
		if done && !synced {
			synced = true
			c.synced()
		}
	}
}

// maxKeptReadBuffer is the largest read buffer a session keeps between
// messages: one that a large init grew past it is let go with that
// message, not held while the feed is idle.
const maxKeptReadBuffer = 64 << 10

// readMessage reads the next message into buf and returns its bytes, valid
// until the next call. Conn.Read's io.ReadAll allocates and grows a fresh
// buffer for every message, which in a fleet of busy sidecars cost a tenth
// of its CPU in allocation and collection; the decoder copies what it keeps.
func readMessage(conn *websocket.Conn, buf *bytes.Buffer) (websocket.MessageType, []byte, error) {
	buf.Reset()
	typ, r, err := conn.Reader(context.Background())
	if err != nil {
		return 0, nil, err
	}
	if _, err := buf.ReadFrom(r); err != nil {
		return 0, nil, err
	}
	data := buf.Bytes()
	if buf.Cap() > maxKeptReadBuffer {
		*buf = bytes.Buffer{} // data alone holds the large array now
	}
	return typ, data, nil
}

// decodeFeedMessage decodes one text frame of the feed.
func decodeFeedMessage(data []byte) (feedv1.Message, error) {
	var m feedv1.Message
	if err := json.Unmarshal(data, &m); err != nil {
		return feedv1.Message{}, fmt.Errorf("undecodable feed message: %w", err)
	}
	return m, nil
}

// handle processes one message. synced reports that the client now holds a
// set from this connection.
func (w *wsTransport) handle(ctx context.Context, conn *websocket.Conn, m *feedv1.Message, server string) (synced bool, err error) {
	if m.Type == feedv1.TypePing {
		b, _ := json.Marshal(feedv1.Pong{Type: feedv1.TypePong})
		wctx, cancel := context.WithTimeout(ctx, maxHealthTimeout)
		defer cancel()
		if err := conn.Write(wctx, websocket.MessageText, b); err != nil {
			return false, fmt.Errorf("send pong: %w", err)
		}
		return false, nil
	}
	return w.c.applyFeed(m, server)
}

// applyFeed applies one feed message other than ping to the client's state.
// It needs no connection, so that what a server sends can be fuzzed against
// the state apart from the socket; handle is its only caller. synced
// reports that the client now holds a set from this connection.
func (c *Client) applyFeed(m *feedv1.Message, server string) (synced bool, err error) {
	set, held, index, has := c.snapshot()
	switch m.Type {
	case feedv1.TypeRevoke:
		return false, &revokedError{reason: m.Reason}
	case feedv1.TypeInit:
		c.count(func(s *Stats) { s.FullSyncs++ })
		if has && m.Digest == held && m.Digest != "" {
			c.setIndex(m.Version, true)
			return true, nil
		}
		next := make([]Policy, 0, len(m.Policies))
		for _, p := range m.Policies {
			next = append(next, fromFeed(p))
		}
		if err := c.install(sortByName(next), m.Digest, m.Version, true, server); err != nil {
			if !has {
				// Deltas cannot be applied without a base: start over.
				return false, fmt.Errorf("initial policy set rejected: %w", err)
			}
			c.setIndex(m.Version, true)
			return true, nil
		}
		return true, nil
	case feedv1.TypeUpsert, feedv1.TypeDelete:
		if !has {
			return false, fmt.Errorf("feed sent %s before init", m.Type)
		}
		if m.Version != 0 && m.Version <= index {
			c.logger.Debug("skipping a feed message already applied", "type", m.Type, "version", m.Version, "index", index)
			return false, nil
		}
		var next []Policy
		switch {
		case m.Type == feedv1.TypeDelete:
			next, _ = withDelete(set, m.PolicyName)
		case m.Policy == nil:
			return false, errors.New("feed upsert without a policy")
		default:
			next = withUpsert(set, fromFeed(*m.Policy))
		}
		digest := m.Digest
		if digest == "" {
			digest = held
		}
		c.count(func(s *Stats) { s.Deltas++ })
		if err := c.install(next, digest, m.Version, false, server); err != nil {
			c.setIndex(m.Version, false) // skipped: no NACK over WebSocket
		}
		return false, nil
	default:
		c.logger.Debug("ignoring an unknown feed message", "type", m.Type)
		return false, nil
	}
}

// pingLoop sends a WebSocket ping every HealthInterval and ends the session
// when no pong comes back.
func (w *wsTransport) pingLoop(ctx context.Context, conn *websocket.Conn, cancel context.CancelCauseFunc) {
	interval := w.c.cfg.HealthInterval
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, pcancel := context.WithTimeout(ctx, min(interval, maxHealthTimeout))
		err := conn.Ping(pctx)
		pcancel()
		if err != nil {
			if ctx.Err() == nil {
				cancel(fmt.Errorf("no pong from the server: %w", err))
			}
			return
		}
	}
}

// setIndex records the Raft index of a message that was received but not
// applied.
func (c *Client) setIndex(index uint64, full bool) {
	c.mu.Lock()
	if full || index > c.index {
		c.index = index
	}
	c.mu.Unlock()
}

// handshakeError describes a failed handshake; 401 and 403 are
// authentication refusals.
func handshakeError(u *url.URL, resp *http.Response, err error) error {
	redacted := *u
	redacted.RawQuery = ""
	if resp == nil {
		return fmt.Errorf("connect %s: %w", redacted.String(), err)
	}
	msg, reason := http.StatusText(resp.StatusCode), ""
	if resp.Body != nil {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		var env struct {
			Error struct{ Code, Message, Reason string } `json:"error"`
		}
		if json.Unmarshal(raw, &env) == nil && env.Error.Message != "" {
			msg, reason = env.Error.Message, env.Error.Reason
		} else if s := strings.TrimSpace(string(raw)); s != "" {
			msg = s
		}
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return &authError{msg: fmt.Sprintf("%s: HTTP %d: %s", redacted.String(), resp.StatusCode, msg), err: err,
			unknown: resp.StatusCode == http.StatusUnauthorized && reason == feedv1.ReasonUnknownEmployee}
	}
	return fmt.Errorf("connect %s: HTTP %d %s: %w", redacted.String(), resp.StatusCode, msg, err)
}
