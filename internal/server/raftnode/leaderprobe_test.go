package raftnode

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	tests := []struct {
		name string
		addr string
		want bool
	}{
		{"listening", ln.Addr().String(), false},
		{"closed port", closedAddr, true},
		{"bad address", "127.0.0.1:notaport", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := refused(context.Background(), tc.addr, time.Second); got != tc.want {
				t.Errorf("refused(%s) = %v, want %v", tc.addr, got, tc.want)
			}
		})
	}
}
