package peer

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/tlsfiles"
)

// Kind is what a connection carries once the handshake is done.
type Kind byte

// Stream kinds. Numbers are part of the wire format.
const (
	// KindRaft is a hashicorp/raft transport connection.
	KindRaft Kind = 1
	// KindAPI is an HTTP/2 connection to the node-to-node gRPC service.
	KindAPI Kind = 2
	// KindProbe ends after the handshake: it tells the dialler who answers
	// at an address (a join checks the new member this way).
	KindProbe Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindRaft:
		return "raft"
	case KindAPI:
		return "api"
	case KindProbe:
		return "probe"
	}
	return fmt.Sprintf("Kind(%d)", byte(k))
}

func (k Kind) valid() bool { return k >= KindRaft && k <= KindProbe }

// Errors a handshake returns; each is wrapped with the details.
var (
	// ErrRefused: the other side refused the connection (its reason follows).
	ErrRefused = errors.New("peer refused the connection")
	// ErrUnauthenticated: the other side did not prove it is a member.
	ErrUnauthenticated = errors.New("peer is not authenticated")
	// ErrProtocol: the other side does not speak the handshake.
	ErrProtocol = errors.New("not a policyd peer handshake")
	// ErrNotMember: the other side's Raft configuration does not hold this
	// node (it was removed).
	ErrNotMember = errors.New("not a member of the peer's Raft configuration")
)

// ClusterMismatchError is returned when the two sides belong to different
// clusters.
type ClusterMismatchError struct {
	Local, Remote, RemoteNode string
}

func (e *ClusterMismatchError) Error() string {
	return fmt.Sprintf("cluster ID mismatch: this node belongs to cluster %s, node %q to cluster %s; "+
		"a data dir of another cluster is refused: wipe that node's data dir and join it to this cluster "+
		"(policyd cluster join), or run policyd recover on it to make its data a cluster of its own",
		e.Local, e.RemoteNode, e.Remote)
}

// Info is what a handshake established about the other side.
type Info struct {
	Kind      Kind
	NodeID    string
	ClusterID string
}

// Config is one node's side of the handshake.
type Config struct {
	// NodeID is this node's Raft server ID.
	NodeID string
	// TrustDomain of node certificates (cluster.trust_domain).
	TrustDomain string
	// Keys holds the cluster secrets; nil: no secret.
	Keys *Keyring
	// TLS secures every connection; nil: plain TCP. With a client CA,
	// both sides must present node certificates.
	TLS *tlsfiles.Reloader
	// ClusterID returns this node's cluster ID, "" while it has none.
	ClusterID func() string
	// HandshakeTimeout bounds TLS and the peer handshake together.
	HandshakeTimeout time.Duration
	// Member, if set, reports whether a node may open Raft and API
	// streams: a node removed from the configuration is told so instead
	// of being heard (probes are always answered).
	Member func(nodeID string) bool
	// Mismatch, if set, hears of every connection the mux refuses because
	// the dialler belongs to another cluster. It returns true when this
	// node reports the mismatch itself (its own data dir may be the
	// foreign one), and the mux then logs the refusal at DEBUG, not at
	// ERROR once per retry.
	Mismatch func(*ClusterMismatchError) (reported bool)
}

func (cfg *Config) clusterID() string {
	if cfg.ClusterID == nil {
		return ""
	}
	return cfg.ClusterID()
}

func (cfg *Config) timeout() time.Duration {
	if cfg.HandshakeTimeout > 0 {
		return cfg.HandshakeTimeout
	}
	return 5 * time.Second
}

// Wire format limits.
const (
	magic        = "PDP1"
	nonceSize    = 32
	macSize      = sha256.Size
	maxIDLen     = 64
	maxReasonLen = 1024

	statusOK        = 0
	statusRefused   = 1
	statusMismatch  = 2 // followed by the answerer's node ID and cluster ID
	statusNotMember = 3

	flagSecret = 1
)

// MAC labels: the two directions never produce the same MAC.
var (
	clientLabel = []byte("policyd peer handshake v1: client proof\x00")
	serverLabel = []byte("policyd peer handshake v1: server proof\x00")
)

// hello is the dialling side's first message.
type hello struct {
	kind      Kind
	secret    bool
	nonce     [nonceSize]byte
	nodeID    string
	clusterID string
}

func (h *hello) marshal() []byte {
	b := append([]byte(magic), byte(h.kind), 0)
	if h.secret {
		b[len(magic)+1] = flagSecret
	}
	b = append(b, h.nonce[:]...)
	b = appendString(b, h.nodeID)
	return appendString(b, h.clusterID)
}

// challenge is the answering side's first message (after status OK).
type challenge struct {
	nonce     [nonceSize]byte
	nodeID    string
	clusterID string
}

func (ch *challenge) marshal() []byte {
	b := append([]byte{statusOK}, ch.nonce[:]...)
	b = appendString(b, ch.nodeID)
	return appendString(b, ch.clusterID)
}

func appendString(b []byte, s string) []byte {
	return append(append(b, byte(len(s))), s...)
}

// readHello reads and checks a hello; raw is its bytes, for the MAC.
func readHello(r io.Reader) (h hello, raw []byte, err error) {
	rec := &recorder{r: r}
	var head [len(magic) + 2 + nonceSize]byte
	if _, err := io.ReadFull(rec, head[:]); err != nil {
		return h, nil, fmt.Errorf("%w: read hello: %w", ErrProtocol, err)
	}
	if string(head[:len(magic)]) != magic {
		return h, nil, fmt.Errorf("%w: bad magic %q", ErrProtocol, head[:len(magic)])
	}
	h.kind = Kind(head[len(magic)])
	if !h.kind.valid() {
		return h, nil, fmt.Errorf("%w: unknown stream kind %d", ErrProtocol, head[len(magic)])
	}
	flags := head[len(magic)+1]
	if flags&^flagSecret != 0 {
		return h, nil, fmt.Errorf("%w: unknown flags %#x", ErrProtocol, flags)
	}
	h.secret = flags&flagSecret != 0
	copy(h.nonce[:], head[len(magic)+2:])
	if h.nodeID, err = readID(rec, "node ID"); err != nil {
		return h, nil, err
	}
	if h.clusterID, err = readID(rec, "cluster ID"); err != nil {
		return h, nil, err
	}
	if h.nodeID == "" {
		return h, nil, fmt.Errorf("%w: empty node ID", ErrProtocol)
	}
	return h, rec.buf.Bytes(), nil
}

// ReadHello reads the hello that opens a connection: who dials and for
// what. It is for what sits between nodes and must tell connections apart
// (the chaos suite's fault-injecting proxy); it proves nothing.
func ReadHello(r io.Reader) (Info, error) {
	h, _, err := readHello(r)
	return Info{Kind: h.kind, NodeID: h.nodeID, ClusterID: h.clusterID}, err
}

// readChallenge reads the answer to a hello: a challenge, or a refusal.
func readChallenge(r io.Reader, h *hello) (c challenge, raw []byte, err error) {
	rec := &recorder{r: r}
	if err := readStatus(rec); err != nil {
		var mm *ClusterMismatchError
		if errors.As(err, &mm) {
			mm.Local = h.clusterID
		}
		return c, nil, err
	}
	if _, err := io.ReadFull(rec, c.nonce[:]); err != nil {
		return c, nil, fmt.Errorf("%w: read challenge: %w", ErrProtocol, err)
	}
	if c.nodeID, err = readID(rec, "node ID"); err != nil {
		return c, nil, err
	}
	if c.clusterID, err = readID(rec, "cluster ID"); err != nil {
		return c, nil, err
	}
	return c, rec.buf.Bytes(), nil
}

// readStatus reads a status byte, and the reason after a refusal.
func readStatus(r io.Reader) error {
	var st [1]byte
	if _, err := io.ReadFull(r, st[:]); err != nil {
		return fmt.Errorf("%w: read status: %w", ErrProtocol, err)
	}
	switch st[0] {
	case statusOK:
		return nil
	case statusMismatch:
		node, err := readID(r, "node ID")
		if err != nil {
			return err
		}
		cluster, err := readID(r, "cluster ID")
		if err != nil {
			return err
		}
		return &ClusterMismatchError{Remote: cluster, RemoteNode: node}
	case statusNotMember:
		return ErrNotMember
	case statusRefused:
		var n [2]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return fmt.Errorf("%w: read refusal: %w", ErrProtocol, err)
		}
		l := int(binary.BigEndian.Uint16(n[:]))
		if l > maxReasonLen {
			return fmt.Errorf("%w: refusal of %d bytes", ErrProtocol, l)
		}
		reason := make([]byte, l)
		if _, err := io.ReadFull(r, reason); err != nil {
			return fmt.Errorf("%w: read refusal: %w", ErrProtocol, err)
		}
		return fmt.Errorf("%w: %s", ErrRefused, strings.ToValidUTF8(string(reason), "?"))
	}
	return fmt.Errorf("%w: unknown status %d", ErrProtocol, st[0])
}

// readID reads a node or cluster ID; both have the node ID form (a cluster
// ID is hex).
func readID(r io.Reader, what string) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", fmt.Errorf("%w: read %s: %w", ErrProtocol, what, err)
	}
	if n[0] > maxIDLen {
		return "", fmt.Errorf("%w: %s of %d bytes", ErrProtocol, what, n[0])
	}
	b := make([]byte, n[0])
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("%w: read %s: %w", ErrProtocol, what, err)
	}
	if len(b) > 0 && (!utf8.Valid(b) || !config.ValidNodeID(string(b))) {
		return "", fmt.Errorf("%w: %s %q is not a valid ID", ErrProtocol, what, strings.ToValidUTF8(string(b), "?"))
	}
	return string(b), nil
}

// recorder keeps what it reads, for the transcript.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func refusal(reason string) []byte {
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	b := []byte{statusRefused, 0, 0}
	binary.BigEndian.PutUint16(b[1:], uint16(len(reason))) //nolint:gosec // bounded above
	return append(b, reason...)
}

func mac(key, label []byte, transcript ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(label)
	for _, t := range transcript {
		m.Write(t)
	}
	return m.Sum(nil)
}

func newNonce() (n [nonceSize]byte) {
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails (Go 1.24)
	return n
}

// refuse sends reason to the dialler and returns err.
func refuse(c net.Conn, reason string, err error) error {
	_, _ = c.Write(refusal(reason))
	return err
}

// accept runs the answering side of the handshake on c, which is already
// past TLS if any; certIDs are the node IDs the peer's certificate names.
func (cfg *Config) accept(c net.Conn, certIDs []string) (Info, error) {
	h, helloRaw, err := readHello(c)
	if err != nil {
		return Info{}, err
	}
	info := Info{Kind: h.kind, NodeID: h.nodeID, ClusterID: h.clusterID}
	keys := cfg.Keys.all()
	switch {
	case len(keys) > 0 && !h.secret:
		return info, refuse(c, "this cluster requires the cluster secret: set cluster.secret_file",
			fmt.Errorf("%w: node %q has no cluster secret", ErrUnauthenticated, h.nodeID))
	case len(keys) == 0 && h.secret:
		return info, refuse(c, "this node has no cluster secret: set the same cluster.secret_file on every node",
			fmt.Errorf("%w: node %q uses a cluster secret and this node has none", ErrUnauthenticated, h.nodeID))
	case cfg.mutualTLS() && !slices.Contains(certIDs, h.nodeID):
		reason := fmt.Sprintf("the client certificate does not name node %q (URI SAN %s)", h.nodeID, tlsfiles.NodeURI(cfg.TrustDomain, h.nodeID))
		return info, refuse(c, reason, fmt.Errorf("%w: %s", ErrUnauthenticated, reason))
	}
	local := cfg.clusterID()
	if local != "" && h.clusterID != "" && local != h.clusterID {
		b := appendString(appendString([]byte{statusMismatch}, cfg.NodeID), local)
		_, _ = c.Write(b)
		return info, &ClusterMismatchError{Local: local, Remote: h.clusterID, RemoteNode: h.nodeID}
	}
	ch := challenge{nonce: newNonce(), nodeID: cfg.NodeID, clusterID: local}
	chRaw := ch.marshal()
	if _, err := c.Write(chRaw); err != nil {
		return info, fmt.Errorf("send challenge: %w", err)
	}
	final := byte(statusOK)
	if h.kind != KindProbe && cfg.Member != nil && !cfg.Member(h.nodeID) {
		final = statusNotMember
	}
	if len(keys) == 0 {
		if _, err := c.Write([]byte{final}); err != nil {
			return info, err
		}
		if final != statusOK {
			return info, fmt.Errorf("node %q: %w", h.nodeID, ErrNotMember)
		}
		return info, nil
	}
	proof := make([]byte, macSize)
	if _, err := io.ReadFull(c, proof); err != nil {
		return info, fmt.Errorf("%w: read proof: %w", ErrProtocol, err)
	}
	for _, k := range keys {
		if !hmac.Equal(proof, mac(k, clientLabel, helloRaw, chRaw)) {
			continue
		}
		if final != statusOK {
			_, _ = c.Write([]byte{final})
			return info, fmt.Errorf("node %q: %w", h.nodeID, ErrNotMember)
		}
		_, err := c.Write(append([]byte{statusOK}, mac(k, serverLabel, helloRaw, chRaw)...))
		return info, err
	}
	return info, refuse(c, "the cluster secret does not match",
		fmt.Errorf("%w: node %q proved no cluster secret this node holds", ErrUnauthenticated, h.nodeID))
}

// open runs the dialling side of the handshake on c, which is already past
// TLS if any; certIDs are the node IDs the answering side's certificate
// names.
func (cfg *Config) open(c net.Conn, kind Kind, certIDs []string) (Info, error) {
	keys := cfg.Keys
	h := hello{kind: kind, secret: keys.primary() != nil, nonce: newNonce(), nodeID: cfg.NodeID, clusterID: cfg.clusterID()}
	helloRaw := h.marshal()
	if _, err := c.Write(helloRaw); err != nil {
		return Info{}, fmt.Errorf("send hello: %w", err)
	}
	ch, chRaw, err := readChallenge(c, &h)
	if err != nil {
		return Info{}, err
	}
	info := Info{Kind: kind, NodeID: ch.nodeID, ClusterID: ch.clusterID}
	if cfg.mutualTLS() && !slices.Contains(certIDs, ch.nodeID) {
		return info, fmt.Errorf("%w: the server certificate does not name node %q (URI SAN %s)",
			ErrUnauthenticated, ch.nodeID, tlsfiles.NodeURI(cfg.TrustDomain, ch.nodeID))
	}
	if local := cfg.clusterID(); local != "" && ch.clusterID != "" && local != ch.clusterID {
		return info, &ClusterMismatchError{Local: local, Remote: ch.clusterID, RemoteNode: ch.nodeID}
	}
	key := keys.primary()
	if key == nil {
		return info, readStatus(c)
	}
	if _, err := c.Write(mac(key, clientLabel, helloRaw, chRaw)); err != nil {
		return info, fmt.Errorf("send proof: %w", err)
	}
	if err := readStatus(c); err != nil {
		return info, err
	}
	proof := make([]byte, macSize)
	if _, err := io.ReadFull(c, proof); err != nil {
		return info, fmt.Errorf("%w: read server proof: %w", ErrProtocol, err)
	}
	if !hmac.Equal(proof, mac(key, serverLabel, helloRaw, chRaw)) {
		return info, fmt.Errorf("%w: node %q did not prove the cluster secret", ErrUnauthenticated, ch.nodeID)
	}
	return info, nil
}

func (cfg *Config) mutualTLS() bool { return cfg.TLS != nil && cfg.TLS.MutualTLS() }

// Server runs TLS, if configured, and the answering side of the handshake
// on a freshly accepted connection, within the handshake timeout. On error
// the caller closes raw.
func (cfg *Config) Server(raw net.Conn) (net.Conn, Info, error) {
	_ = raw.SetDeadline(time.Now().Add(cfg.timeout()))
	c := raw
	var certIDs []string
	if cfg.TLS != nil {
		tc := tls.Server(raw, cfg.TLS.ServerConfig())
		if err := tc.Handshake(); err != nil {
			return nil, Info{}, fmt.Errorf("%w: tls: %w", ErrUnauthenticated, err)
		}
		certIDs = certNodeIDs(tc.ConnectionState().PeerCertificates, cfg.TrustDomain)
		c = tc
	}
	info, err := cfg.accept(c, certIDs)
	if err != nil {
		return nil, info, err
	}
	_ = raw.SetDeadline(time.Time{})
	return c, info, nil
}

// Client runs TLS, if configured, and the dialling side of the handshake on
// raw, connected to addr, within the handshake timeout. On error the caller
// closes raw.
func (cfg *Config) Client(raw net.Conn, addr string, kind Kind) (net.Conn, Info, error) {
	_ = raw.SetDeadline(time.Now().Add(cfg.timeout()))
	c := raw
	var certIDs []string
	if cfg.TLS != nil {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, Info{}, fmt.Errorf("peer address %q: %w", addr, err)
		}
		tc := tls.Client(raw, cfg.TLS.ClientConfig(host))
		if err := tc.Handshake(); err != nil {
			return nil, Info{}, fmt.Errorf("%w: tls: %w", ErrUnauthenticated, err)
		}
		certIDs = certNodeIDs(tc.ConnectionState().PeerCertificates, cfg.TrustDomain)
		c = tc
	}
	info, err := cfg.open(c, kind, certIDs)
	if err != nil {
		return nil, info, err
	}
	_ = raw.SetDeadline(time.Time{})
	return c, info, nil
}

func certNodeIDs(chain []*x509.Certificate, trustDomain string) []string {
	if len(chain) == 0 {
		return nil
	}
	return tlsfiles.NodeIDs(chain[0], trustDomain)
}
