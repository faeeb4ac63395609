package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/policyd/policyd/server/limits"
	"github.com/policyd/policyd/tlsfiles"
)

// streamLayer is the Raft transport's stream layer: TCP, its accepted
// connections counted against raft.max_connections (server/limits), and
// TLS when raft.tls is set. Raft's own TCP stream layer does not let its
// listener be wrapped, hence this one.
//
// With TLS, every Raft connection is a TLS connection; with client_ca_file
// set both ends present the node certificate and verify the other's against
// it, so a process without a certificate from the cluster CA can neither
// send Raft RPCs to a member (vote, append) nor receive them.
//
// Accept does not handshake: raft's accept loop is serial, and a peer that
// connects and stalls must not hold it up. The handshake runs on the first
// read, in the transport's per-connection goroutine, bounded by the
// transport's I/O deadlines; a refused peer shows in the raft log as a
// failed decode with the TLS error. A connection over the cap is closed
// before any of that.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	tls       *tlsfiles.Reloader // nil: plain TCP
	server    *tls.Config
}

// errNotAdvertisable mirrors raft's own TCP transport: peers cannot dial an
// unspecified address.
var errNotAdvertisable = errors.New("local bind address is not advertisable")

// newStreamLayer listens on bind. adv is the address peers dial; nil
// advertises the bound address. conns, if not nil, counts and caps the
// accepted connections; r, if not nil, secures them with TLS.
func newStreamLayer(bind string, adv net.Addr, conns *limits.Conns, r *tlsfiles.Reloader) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	if adv == nil {
		adv = ln.Addr()
	}
	if a, ok := adv.(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("%v: %w", adv, errNotAdvertisable)
	}
	if conns != nil {
		ln = conns.Listener(ln)
	}
	s := &streamLayer{ln: ln, advertise: adv, tls: r}
	if r != nil {
		s.server = r.ServerConfig()
	}
	return s, nil
}

func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil || s.tls == nil {
		return c, err
	}
	return tls.Server(c, s.server), nil
}

func (s *streamLayer) Close() error { return s.ln.Close() }

func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial connects within timeout. With TLS it completes the handshake within
// timeout too, verifying that the peer's certificate names the host it was
// dialled by.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(address))
	}
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		return nil, fmt.Errorf("raft peer address %q: %w", address, err)
	}
	return tls.DialWithDialer(d, "tcp", string(address), s.tls.ClientConfig(host))
}

var _ raft.StreamLayer = (*streamLayer)(nil)
