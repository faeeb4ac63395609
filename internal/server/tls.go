package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/tlsfiles"
)

// nodeTLS holds the certificate sets of the node's listeners; a nil field
// means that listener is plain TCP.
//
// A node is a client of its peers on the peer plane only (raft.tls: Raft
// and the node-to-node API share it, internal/server/peer). It presents its own
// certificate as client certificate and verifies the peer against
// client_ca_file, the cluster CA: one CA both signs and admits members, as
// in etcd's peer TLS, and the certificate's node identity (a URI SAN) keeps
// sidecar and operator certificates of the same CA off the peer plane.
type nodeTLS struct {
	http, grpc, raft *tlsfiles.Reloader
}

// setupTLS loads the configured certificate sets. It runs before any
// listener is bound, so a bad file fails start-up with nothing to undo.
func (n *Node) setupTLS() error {
	for _, s := range []struct {
		key string
		cfg config.TLS
		dst **tlsfiles.Reloader
	}{
		{"http.tls", n.cfg.HTTP.TLS, &n.tls.http},
		{"grpc.tls", n.cfg.GRPC.TLS, &n.tls.grpc},
		{"raft.tls", n.cfg.Raft.TLS, &n.tls.raft},
	} {
		if !s.cfg.Enabled() {
			continue
		}
		r, err := tlsfiles.New(s.cfg, n.logger.With("component", "tls", "listener", s.key))
		if err != nil {
			return fmt.Errorf("%s: %w", s.key, err)
		}
		*s.dst = r
	}
	if r := n.tls.raft; r != nil {
		if !r.MutualTLS() {
			// Peers verify this node's certificate against
			// client_ca_file; without one they fall back to the system
			// roots, which rarely sign cluster certificates.
			n.logger.Warn("raft.tls has no client_ca_file: TLS does not authenticate peers, and peers verify each other against the system roots")
		} else if ids := tlsfiles.NodeIDs(r.Leaf(), n.cfg.Cluster.TrustDomain); !slices.Contains(ids, n.id) {
			return fmt.Errorf("raft.tls: the certificate %s does not name this node: it needs the URI SAN %s (it names nodes %v)",
				n.cfg.Raft.TLS.CertFile, tlsfiles.NodeURI(n.cfg.Cluster.TrustDomain, n.id), ids)
		}
	}
	return nil
}

// grpcServerOptions secures the gRPC listener when grpc.tls is set.
func (n *Node) grpcServerOptions() []grpc.ServerOption {
	if n.tls.grpc == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(n.tls.grpc.ServerConfig("h2")))}
}

// httpListener wraps the bound HTTP listener in TLS when http.tls is set.
// HTTP/1.1 only: the WebSocket feed upgrades an HTTP/1.1 connection, and the
// admin API gains nothing from HTTP/2.
func (n *Node) httpListener(ln net.Listener) net.Listener {
	if n.tls.http == nil {
		return ln
	}
	return tls.NewListener(ln, n.tls.http.ServerConfig("http/1.1"))
}

// applyTLS re-reads every certificate set (SIGHUP). Each failure keeps that
// listener's previous certificate.
func (n *Node) applyTLS(config.Config) (applied, needRestart []string, err error) {
	var errs []error
	for _, s := range []struct {
		key string
		r   *tlsfiles.Reloader
	}{{"http.tls", n.tls.http}, {"grpc.tls", n.tls.grpc}, {"raft.tls", n.tls.raft}} {
		if s.r == nil {
			continue
		}
		if err := s.r.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.key, err))
			continue
		}
		applied = append(applied, s.key)
	}
	return applied, nil, errors.Join(errs...)
}
