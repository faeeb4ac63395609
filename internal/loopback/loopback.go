// Package loopback picks free TCP ports on 127.0.0.1 for the processes that
// tests, the chaos suite and the bench harness start: they must know a
// node's addresses before it binds them (peers lists, config files).
package loopback

import (
	"fmt"
	"net"
	"strconv"
)

// FreePorts returns n distinct free TCP ports on 127.0.0.1. All listeners
// stay open until every port is chosen, so the kernel cannot hand out the
// same port twice; another process may still take one before it is bound.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Addr is 127.0.0.1:port.
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
