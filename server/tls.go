package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/policyd/policyd/config"
	"github.com/policyd/policyd/tlsfiles"
)

// nodeTLS holds the certificate sets of the node's listeners; a nil field
// means that listener is plain TCP.
//
// A node is a client of its peers on two of them: Raft (the stream layer
// dials with raft.tls) and gRPC (write forwarding, read index, membership,
// the cluster-wide client list dial with grpc.tls). On both it presents its
// own certificate as client certificate and verifies the peer against the
// same block's client_ca_file, the cluster CA: one CA both signs and admits
// members, as in etcd's peer TLS.
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
		if !r.MutualTLS() && s.key != "http.tls" {
			// Peers verify this node's certificate against
			// client_ca_file; without one they fall back to the system
			// roots, which rarely sign cluster certificates.
			n.logger.Warn(s.key+" has no client_ca_file: any client may connect, and peers verify each other against the system roots", "listener", s.key)
		}
		*s.dst = r
	}
	if n.tls.grpc != nil {
		n.peers.creds = peerCreds{n.tls.grpc}
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

// reloadTLS re-reads every certificate set (SIGHUP). Each failure keeps that
// listener's previous certificate.
func (n *Node) reloadTLS(config.Config) (applied, needRestart []string, err error) {
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

// peerCreds are the gRPC credentials of the node's connections to its peers:
// a TLS configuration taken afresh for each handshake, so a reloaded
// certificate or CA bundle is used by the next connection.
type peerCreds struct{ r *tlsfiles.Reloader }

func (c peerCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.r.ClientConfig("")).ClientHandshake(ctx, authority, raw)
}

func (c peerCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.r.ServerConfig("h2")).ServerHandshake(raw)
}

func (c peerCreds) Info() credentials.ProtocolInfo {
	return credentials.NewTLS(&tls.Config{MinVersion: tlsfiles.MinVersion}).Info()
}

func (c peerCreds) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is deprecated in grpc-go and never called by it.
func (c peerCreds) OverrideServerName(string) error { return nil }
