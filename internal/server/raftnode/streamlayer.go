package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/server/limits"
	"github.com/policyd/policyd/internal/server/peer"
)

// StreamLayer is the Raft transport's stream layer over the peer plane's
// listener (internal/server/peer): every connection, accepted or dialled, is past
// TLS (raft.tls) and the peer handshake before raft sees a byte of it, so a
// process that is not a member can neither send Raft RPCs (vote, append,
// snapshot) nor receive them. The same listener carries the node-to-node
// API (the peer API); raft's own TCP stream layer cannot share a port,
// hence this one.
//
// Accept hands over connections the mux has authenticated on goroutines of
// its own, so raft's serial accept loop is never held up by a peer that
// stalls in its handshake.
type StreamLayer struct {
	mux       *peer.Mux
	advertise net.Addr
	cfg       *peer.Config
	// notMember is called when a peer says this node is not in its
	// configuration.
	notMember func()
}

// errNotAdvertisable mirrors raft's own TCP transport: peers cannot dial an
// unspecified address.
var errNotAdvertisable = errors.New("local bind address is not advertisable")

// NewStreamLayer listens on bind and builds the peer plane's mux there;
// the caller starts it (Serve) if it is to accept connections. adv is the address peers dial; nil
// advertises the bound address. conns, if not nil, counts and caps the
// accepted connections.
func NewStreamLayer(bind string, adv net.Addr, conns *limits.Conns, cfg *peer.Config, logger *slog.Logger) (*StreamLayer, error) {
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
	return &StreamLayer{mux: peer.NewMux(ln, cfg, logger), advertise: adv, cfg: cfg}, nil
}

// Accept returns the next authenticated Raft connection.
func (s *StreamLayer) Accept() (net.Conn, error) { return s.mux.Listener(peer.KindRaft).Accept() }

// Close closes the whole peer plane: raft closes its transport only when
// the node stops.
func (s *StreamLayer) Close() error { return s.mux.Close() }

// Addr is the address peers dial.
func (s *StreamLayer) Addr() net.Addr { return s.advertise }

// Dial connects and completes the peer handshake within timeout.
func (s *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, _, err := s.cfg.Dial(ctx, string(address), peer.KindRaft)
	if errors.Is(err, peer.ErrNotMember) && s.notMember != nil {
		s.notMember()
	}
	return c, err
}

var _ raft.StreamLayer = (*StreamLayer)(nil)
