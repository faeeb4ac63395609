package limits

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Conns counts one listener's open connections against its cap.
type Conns struct {
	name   string
	max    int64 // 0 = no cap
	open   atomic.Int64
	m      *Metrics
	logger *slog.Logger
	// lastLog rate-limits the rejection warning: a flood would otherwise
	// log a line per connection.
	lastLog atomic.Int64
}

// NewConns caps the listener called name (the metric label) at maxConns
// open connections; 0 means no cap.
func NewConns(name string, maxConns int, m *Metrics, logger *slog.Logger) *Conns {
	return &Conns{name: name, max: int64(maxConns), m: m, logger: logger}
}

// admit counts a new connection and reports whether it is within the cap. A
// connection refused here is not counted.
func (c *Conns) admit(addr net.Addr) bool {
	if n := c.open.Add(1); c.max > 0 && n > c.max {
		c.open.Add(-1)
		c.m.connsRejected.WithLabelValues(c.name).Inc()
		if now := time.Now().UnixNano(); now-c.lastLog.Load() > int64(10*time.Second) {
			c.lastLog.Store(now)
			c.logger.Warn("connection refused: listener at max_connections", "listener", c.name,
				"max_connections", c.max, "peer", addr)
		}
		return false
	}
	c.m.connsOpen.WithLabelValues(c.name).Inc()
	return true
}

func (c *Conns) done() {
	c.open.Add(-1)
	c.m.connsOpen.WithLabelValues(c.name).Dec()
}

// Open is the number of connections counted now.
func (c *Conns) Open() int { return int(c.open.Load()) }

// Listener returns ln with every accepted connection counted; one over the
// cap is closed at once and Accept goes on to the next. Use it where nothing
// needs the accepted *net.TCPConn itself (gRPC).
func (c *Conns) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, c: c} }

type listener struct {
	net.Listener
	c *Conns
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.c.admit(nc.RemoteAddr()) {
			return &conn{Conn: nc, c: l.c}, nil
		}
		_ = nc.Close()
	}
}

type conn struct {
	net.Conn
	c    *Conns
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.c.done)
	return err
}

// ConnState is an http.Server.ConnState hook counting the server's
// connections: counted from StateNew until closed or hijacked (upgraded to
// the WebSocket feed). A new connection over the cap is closed at once; the
// server then sees it fail and reports StateClosed, which is not counted
// again. Chain with prev, an existing hook, if any.
func (c *Conns) ConnState(prev func(net.Conn, http.ConnState)) func(net.Conn, http.ConnState) {
	var refused sync.Map // net.Conn → struct{}: closed at StateNew, never counted
	return func(nc net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			if !c.admit(nc.RemoteAddr()) {
				refused.Store(nc, struct{}{})
				_ = nc.Close()
			}
		case http.StateClosed, http.StateHijacked:
			if _, wasRefused := refused.LoadAndDelete(nc); !wasRefused {
				c.done()
			}
		}
		if prev != nil {
			prev(nc, st)
		}
	}
}
