package loopback

import (
	"net"
	"testing"
)

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: %d is zero or repeated", ports, p)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", Addr(p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		ln.Close()
	}
}
