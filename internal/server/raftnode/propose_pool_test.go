package raftnode

import (
	"context"
	"errors"
	"net"
	"testing"
)

// TestPeerPoolClosed: once closed, the pool opens no connection, which
// nothing would close; a late caller gets an Unavailable error.
func TestPeerPoolClosed(t *testing.T) {
	p := newPeerPool(func(ctx context.Context, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}, nil)
	if _, err := p.client("127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	p.Close()
	_, err := p.client("127.0.0.1:2")
	var u interface{ Unavailable() bool }
	if !errors.As(err, &u) || !u.Unavailable() {
		t.Fatalf("client after Close = %v, want an Unavailable error", err)
	}
	if len(p.conns) != 0 {
		t.Errorf("%d connections after Close", len(p.conns))
	}
}
