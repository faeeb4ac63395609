package limits

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Caps are one listener's connection caps; 0 means no cap.
type Caps struct {
	// Max bounds the listener's open connections (max_connections).
	Max int
	// PerIP bounds the open connections from one source IP address
	// (max_connections_per_ip).
	PerIP int
}

// The reason label of policyd_connections_rejected_total: which cap refused
// the connection, named after its config key.
const (
	reasonMax   = "max_connections"
	reasonPerIP = "max_connections_per_ip"
)

// logEvery rate-limits the refusal warning of one listener: a flood would
// otherwise log a line per connection. The counter has every refusal.
const logEvery = 10 * time.Second

// Conns counts one listener's open connections against its caps.
type Conns struct {
	name string
	caps Caps
	open atomic.Int64
	// mu guards byIP, which is only kept with a per-IP cap. An entry is
	// deleted when its last connection closes, so it holds at most one
	// entry per open connection.
	mu   sync.Mutex
	byIP map[netip.Addr]int

	openGauge                  prometheus.Gauge
	rejectedMax, rejectedPerIP prometheus.Counter
	logger                     *slog.Logger
	lastLog                    atomic.Int64 // unix nanoseconds of the last warning
}

// NewConns caps the listener called name (the metric label) at caps.
func NewConns(name string, caps Caps, m *Metrics, logger *slog.Logger) *Conns {
	c := &Conns{
		name:      name,
		caps:      caps,
		openGauge: m.connsOpen.WithLabelValues(name),
		// Both series exist from the start, so that a rate over them
		// works before the first refusal.
		rejectedMax:   m.connsRejected.WithLabelValues(name, reasonMax),
		rejectedPerIP: m.connsRejected.WithLabelValues(name, reasonPerIP),
		logger:        logger,
	}
	if caps.PerIP > 0 {
		c.byIP = map[netip.Addr]int{}
	}
	return c
}

// admit counts a new connection from remote and reports whether it is
// within the caps, with the source address it is counted under. A
// connection refused here is not counted.
func (c *Conns) admit(remote net.Addr) (netip.Addr, bool) {
	if n := c.open.Add(1); c.caps.Max > 0 && n > int64(c.caps.Max) {
		c.open.Add(-1)
		c.refuse(reasonMax, c.caps.Max, remote)
		return netip.Addr{}, false
	}
	var ip netip.Addr
	if c.caps.PerIP > 0 {
		ip = sourceIP(remote)
		c.mu.Lock()
		n := c.byIP[ip]
		if n >= c.caps.PerIP {
			c.mu.Unlock()
			c.open.Add(-1)
			c.refuse(reasonPerIP, c.caps.PerIP, remote)
			return netip.Addr{}, false
		}
		c.byIP[ip] = n + 1
		c.mu.Unlock()
	}
	c.openGauge.Inc()
	return ip, true
}

func (c *Conns) refuse(reason string, limit int, remote net.Addr) {
	if reason == reasonPerIP {
		c.rejectedPerIP.Inc()
	} else {
		c.rejectedMax.Inc()
	}
	if now := time.Now().UnixNano(); now-c.lastLog.Load() > int64(logEvery) {
		c.lastLog.Store(now)
		c.logger.Warn("connection refused: "+reason+" reached", "listener", c.name, "reason", reason,
			reason, limit, "peer", remote)
	}
}

func (c *Conns) done(ip netip.Addr) {
	if c.caps.PerIP > 0 {
		c.mu.Lock()
		if n := c.byIP[ip] - 1; n > 0 {
			c.byIP[ip] = n
		} else {
			delete(c.byIP, ip)
		}
		c.mu.Unlock()
	}
	c.open.Add(-1)
	c.openGauge.Dec()
}

// sourceIP is the address a connection is counted under for the per-IP
// cap: the IP without its port, IPv4-mapped IPv6 as IPv4 (a dual-stack
// listener reports IPv4 clients that way). An IPv6 client counts per
// address, not per prefix: a host holding many addresses is bounded by
// max_connections, not max_connections_per_ip.
func sourceIP(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{} // not IP (a Unix socket): all share one count
}

// Open is the number of connections counted now.
func (c *Conns) Open() int { return int(c.open.Load()) }

// Listener returns ln with every accepted connection counted until it is
// closed, whoever closes it: the server, or the feed after net/http handed
// it over (hijacked). A connection over a cap is closed at once and Accept
// goes on to the next. Wrap the TCP listener itself, under any TLS
// listener, so that a refused connection costs no handshake.
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
		if ip, ok := l.c.admit(nc.RemoteAddr()); ok {
			return &conn{Conn: nc, c: l.c, ip: ip}, nil
		}
		_ = nc.Close()
	}
}

// conn is a counted connection. Reads and writes go straight to the
// socket; it only counts Close.
type conn struct {
	net.Conn
	c    *Conns
	ip   netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.c.done(c.ip) })
	return err
}

var errNoSocket = errors.New("connection has no socket descriptor")

// SyscallConn exposes the socket, which the WebSocket feed watches with
// epoll and reads directly while a connection is idle: conn buffers
// nothing, so reading the descriptor is reading the connection.
func (c *conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errNoSocket
	}
	return sc.SyscallConn()
}

// CloseWrite keeps net/http's lingering close (half-close, then wait, so
// that an error response is not lost to a reset) working through the
// wrapper.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
