package raftnode

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// TestForwardNotSent drives a real gRPC client (the peer pool's) against
// peers that fail in each way a leader can fail, and checks what fromStatus
// makes of the error: ErrNoLeader (not sent: withLeader retries it with the
// next leader) only when no request can have reached the peer.
func TestForwardNotSent(t *testing.T) {
	tests := []struct {
		name    string
		peer    func(t *testing.T) string // returns the address
		notSent bool
	}{
		{"port closed", closedPort, true},
		{"connection reset before the server preface", func(t *testing.T) string {
			return rawPeer(t, func(c net.Conn) {
				readClientPreface(c)
				c.(*net.TCPConn).SetLinger(0) //nolint:errcheck // best effort: a reset rather than a FIN
				c.Close()
			})
		}, true},
		{"connection closed before the server preface", func(t *testing.T) string {
			return rawPeer(t, func(c net.Conn) {
				readClientPreface(c)
				c.Close()
			})
		}, true},
		{"not HTTP/2", func(t *testing.T) string {
			return rawPeer(t, func(c net.Conn) {
				readClientPreface(c)
				c.Write([]byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")) //nolint:errcheck // the client sees what it sees
				c.Close()
			})
		}, true},
		{"connection cut during the call", cutDuringCall, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.peer(t)
			pool := newPeerPool(func(ctx context.Context, addr string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			}, nil)
			defer pool.Close()
			c, err := pool.client(addr)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = c.Apply(ctx, &clusterv1.ApplyRequest{})
			if err == nil {
				t.Fatal("Apply succeeded, want an error")
			}
			got := fromStatus(err)
			if errors.Is(got, ErrNoLeader) != tc.notSent {
				t.Errorf("fromStatus(%v) = %v; not sent = %v, want %v", err, got, errors.Is(got, ErrNoLeader), tc.notSent)
			}
			var u interface{ Unavailable() bool }
			if !errors.As(got, &u) {
				t.Errorf("fromStatus(%v) = %v, want an unavailable error (503)", err, got)
			}
		})
	}
}

// readClientPreface reads what a gRPC client sends first: the HTTP/2
// connection preface and its SETTINGS frame's header.
func readClientPreface(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a failed read only ends the exchange sooner
	_, _ = io.ReadFull(c, make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")+9))
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// rawPeer accepts TCP connections and hands each to serve, never speaking
// HTTP/2.
func rawPeer(t *testing.T, serve func(net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			serve(c)
		}
	})
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return l.Addr().String()
}

// cutServer is a cluster service whose Apply cuts every connection of its
// listener: the request has reached the peer, so its outcome is unknown.
type cutServer struct {
	clusterv1.UnimplementedClusterServer
	l *trackingListener
}

func (s *cutServer) Apply(ctx context.Context, _ *clusterv1.ApplyRequest) (*clusterv1.ApplyResponse, error) {
	s.l.cutAll()
	<-ctx.Done()
	return nil, ctx.Err()
}

type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) cutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

func cutDuringCall(t *testing.T) string {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &trackingListener{Listener: inner}
	srv := grpc.NewServer()
	clusterv1.RegisterClusterServer(srv, &cutServer{l: l})
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(l) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return inner.Addr().String()
}
