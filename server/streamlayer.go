package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/policyd/policyd/tlsfiles"
)

// tlsStreamLayer is the Raft transport's stream layer over TLS (raft.tls).
// Every Raft connection is a TLS connection; with client_ca_file set both
// ends present the node certificate and verify the other's against it, so a
// process without a certificate from the cluster CA can neither send Raft
// RPCs to a member (vote, append) nor receive them.
//
// Accept does not handshake: raft's accept loop is serial, and a peer that
// connects and stalls must not hold it up. The handshake runs on the first
// read, in the transport's per-connection goroutine, bounded by the
// transport's I/O deadlines; a refused peer shows in the raft log as a
// failed decode with the TLS error.
type tlsStreamLayer struct {
	ln        net.Listener
	advertise net.Addr
	tls       *tlsfiles.Reloader
	server    *tls.Config
}

// errNotAdvertisable mirrors raft's own TCP transport: peers cannot dial an
// unspecified address.
var errNotAdvertisable = errors.New("local bind address is not advertisable")

// newTLSStreamLayer listens on bind. adv is the address peers dial; nil
// advertises the bound address.
func newTLSStreamLayer(bind string, adv net.Addr, r *tlsfiles.Reloader) (*tlsStreamLayer, error) {
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
	return &tlsStreamLayer{ln: ln, advertise: adv, tls: r, server: r.ServerConfig()}, nil
}

func (s *tlsStreamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(c, s.server), nil
}

func (s *tlsStreamLayer) Close() error { return s.ln.Close() }

func (s *tlsStreamLayer) Addr() net.Addr { return s.advertise }

// Dial connects and completes the handshake within timeout, verifying that
// the peer's certificate names the host it was dialled by.
func (s *tlsStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		return nil, fmt.Errorf("raft peer address %q: %w", address, err)
	}
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), s.tls.ClientConfig(host))
}

var _ raft.StreamLayer = (*tlsStreamLayer)(nil)
