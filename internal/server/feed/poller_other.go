//go:build !linux

package feed

import (
	"errors"
	"net"
	"syscall"
)

// poller is Linux-only (epoll); elsewhere every connection keeps a reader
// goroutine for its lifetime.
type poller struct{}

func newPoller() (*poller, error) {
	return nil, errors.New("no connection poller on this platform")
}

func (*poller) close()            {}
func (*poller) add(*conn) error   { return errors.ErrUnsupported }
func (*poller) rearm(*conn) error { return errors.ErrUnsupported }
func (*poller) remove(*conn)      {}

// rawConnOf returns nil: without the poller, reads always block.
func rawConnOf(net.Conn) syscall.RawConn { return nil }

func tryRead(syscall.RawConn, []byte) (int, error) { return 0, errors.ErrUnsupported }

func writeVec(syscall.RawConn, []byte, []byte) (int, error) { return 0, errors.ErrUnsupported }
