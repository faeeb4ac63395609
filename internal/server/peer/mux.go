package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Mux serves the peer plane's listener: it authenticates every connection
// and hands it to the sub-listener of its kind.
type Mux struct {
	ln     net.Listener
	cfg    *Config
	logger *slog.Logger
	subs   map[Kind]*subListener

	refusals *rateLog
	// pending counts connections still in their handshake, in all and
	// per source address, so that strangers holding handshakes open
	// cannot take the connections members need.
	pendingMu sync.Mutex
	pending   map[string]int
	total     int
	isClosed  bool
	closed    chan struct{}
	once      sync.Once
	wg        sync.WaitGroup
}

// NewMux serves ln, whose connections the caller has already capped. Call
// Serve to accept and Close to stop.
func NewMux(ln net.Listener, cfg *Config, logger *slog.Logger) *Mux {
	m := &Mux{
		ln: ln, cfg: cfg, logger: logger,
		closed:   make(chan struct{}),
		refusals: newRateLog(logger, refusalLogInterval),
		pending:  map[string]int{},
	}
	m.subs = map[Kind]*subListener{
		KindRaft: {m: m, conns: make(chan net.Conn), done: make(chan struct{})},
		KindAPI:  {m: m, conns: make(chan net.Conn), done: make(chan struct{})},
	}
	return m
}

// refusalLogInterval bounds how often refused connections are logged.
const refusalLogInterval = 10 * time.Second

// Bounds on connections in their handshake. A member opens a handful of
// connections at a time (Raft's pool, one for the API), so a source past
// maxPendingPerSource is a stranger or a storm.
const (
	maxPending          = 512
	maxPendingPerSource = 32
)

// Listener is the sub-listener of kind k (KindRaft or KindAPI): Accept
// returns authenticated connections of that kind. Closing it does not close
// the Mux.
func (m *Mux) Listener(k Kind) net.Listener { return m.subs[k] }

// Addr is the bound address.
func (m *Mux) Addr() net.Addr { return m.ln.Addr() }

// Serve accepts until Close.
func (m *Mux) Serve() {
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.logger.Error("peer listener stopped", "err", err)
			return
		}
		src := sourceOf(c)
		switch m.admit(src) {
		case admitClosed:
			_ = c.Close()
			return
		case admitFull:
			_ = c.Close()
			m.refusals.log(slog.LevelWarn, "peer connection refused: too many handshakes in progress",
				"remote", c.RemoteAddr().String(), "max_pending", maxPending, "max_pending_per_source", maxPendingPerSource)
			continue
		}
		go func() {
			defer m.wg.Done()
			m.handle(c, src)
		}()
	}
}

type admission int

const (
	admitted admission = iota
	admitFull
	admitClosed
)

// admit counts a connection in, for its handshake goroutine. It takes the
// WaitGroup under the same lock Close raises closed under, so that no Add
// follows Close's Wait.
func (m *Mux) admit(src string) admission {
	m.pendingMu.Lock()
	defer m.pendingMu.Unlock()
	switch {
	case m.isClosed:
		return admitClosed
	case m.total >= maxPending || m.pending[src] >= maxPendingPerSource:
		return admitFull
	}
	m.total++
	m.pending[src]++
	m.wg.Add(1)
	return admitted
}

func (m *Mux) done(src string) {
	m.pendingMu.Lock()
	defer m.pendingMu.Unlock()
	m.total--
	if m.pending[src]--; m.pending[src] == 0 {
		delete(m.pending, src)
	}
}

func sourceOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

func (m *Mux) handle(raw net.Conn, src string) {
	c, info, err := m.cfg.Server(raw)
	m.done(src)
	if err != nil {
		_ = raw.Close()
		if errors.Is(err, io.EOF) && info.Kind == 0 {
			// Connected and closed without a byte: a port check, or a
			// follower's leader probe (internal/server/raftnode/leaderprobe.go).
			m.logger.Debug("peer connection closed before its handshake", "remote", raw.RemoteAddr().String())
			return
		}
		// A data dir of another cluster is an operator's mistake to fix,
		// not an attack to shrug off.
		level := slog.LevelWarn
		var mm *ClusterMismatchError
		if errors.As(err, &mm) {
			level = slog.LevelError
			if m.cfg.Mismatch != nil && m.cfg.Mismatch(mm) {
				// Not through the rate limit: it would hold back the
				// next refusal of another kind.
				m.logger.Debug("peer connection refused", "remote", raw.RemoteAddr().String(),
					"node", info.NodeID, "kind", info.Kind.String(), "err", err)
				return
			}
		}
		m.refusals.log(level, "peer connection refused", "remote", raw.RemoteAddr().String(),
			"node", info.NodeID, "kind", info.Kind.String(), "err", err)
		return
	}
	sub, ok := m.subs[info.Kind]
	if !ok { // a probe: the handshake was all it wanted
		_ = c.Close()
		return
	}
	select {
	case sub.conns <- c:
	case <-sub.done:
		_ = c.Close()
	case <-m.closed:
		_ = c.Close()
	}
}

// Close stops accepting, closes the listener and waits for handshakes in
// progress. Connections already handed over are their owners'.
func (m *Mux) Close() error {
	var err error
	m.once.Do(func() {
		m.pendingMu.Lock()
		m.isClosed = true
		m.pendingMu.Unlock()
		close(m.closed)
		err = m.ln.Close()
		m.wg.Wait()
	})
	return err
}

type subListener struct {
	m     *Mux
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (s *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	case <-s.m.closed:
		return nil, net.ErrClosed
	}
}

// Close ends Accept for this kind only; the mux then refuses its
// connections after their handshake.
func (s *subListener) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

func (s *subListener) Addr() net.Addr { return s.m.ln.Addr() }

// Dial connects to addr and runs the dialling side of the handshake for a
// stream of kind, within ctx and the handshake timeout. info tells who
// answered.
func (cfg *Config) Dial(ctx context.Context, addr string, kind Kind) (net.Conn, Info, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, Info{}, err
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	c, info, err := cfg.Client(raw, addr, kind)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		_ = raw.Close()
		return nil, info, fmt.Errorf("peer %s: %w", addr, err)
	}
	return c, info, nil
}

// rateLog logs at most one line per interval, counting the rest.
type rateLog struct {
	logger     *slog.Logger
	interval   time.Duration
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func newRateLog(logger *slog.Logger, interval time.Duration) *rateLog {
	return &rateLog{logger: logger, interval: interval}
}

func (r *rateLog) log(level slog.Level, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.interval {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed_since_last", n)
	}
	r.logger.Log(context.Background(), level, msg, args...)
}
