package feed

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"
)

// pollEvents is how many readiness events one epoll_wait returns at most.
const pollEvents = 256

// poller tells idle connections that their socket has become readable, so
// that they need no goroutine blocked in a read while idle (see
// docs/sidecars.md, idle connections). It is an epoll instance of its own, next to the
// Go runtime's: every connection's socket is registered level-triggered
// and one-shot, so one event starts one read task, and the task re-arms
// the registration when it is done. Events carry the connection's id, not
// its file descriptor, so that an event that raced with a close (and the
// descriptor's reuse) finds no connection rather than the wrong one.
type poller struct {
	epfd int
	wake [2]int // a pipe: a byte on wake[1] ends run
	done chan struct{}

	mu    sync.Mutex
	conns map[uint64]*conn
}

// newPoller opens an epoll instance and starts its goroutine; close stops
// it.
func newPoller() (*poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	p := &poller{epfd: epfd, done: make(chan struct{}), conns: map[uint64]*conn{}}
	if err := syscall.Pipe2(p.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		_ = syscall.Close(epfd)
		return nil, os.NewSyscallError("pipe2", err)
	}
	// The wake pipe's event carries id 0, which no connection has.
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p.wake[0], &ev); err != nil {
		p.closeFDs()
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	go p.run()
	return p, nil
}

// run dispatches readiness events until close.
func (p *poller) run() {
	defer close(p.done)
	events := make([]syscall.EpollEvent, pollEvents)
	for {
		n, err := syscall.EpollWait(p.epfd, events, -1)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// Cannot happen with a valid epfd and buffer. Without the
			// poller idle connections read nothing: the ping timeout
			// closes them and they reconnect.
			p.failAll(os.NewSyscallError("epoll_wait", err))
			return
		}
		for _, ev := range events[:n] {
			id := eventID(ev)
			if id == 0 {
				return
			}
			p.mu.Lock()
			c := p.conns[id]
			p.mu.Unlock()
			if c != nil {
				c.readable()
			}
		}
	}
}

// failAll closes every registered connection after the poller failed.
func (p *poller) failAll(err error) {
	p.mu.Lock()
	conns := make([]*conn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.h.logger.Error("feed poller failed, closing connection", "conn", c.addr, "err", err)
		c.closeWith(websocket.StatusInternalError, "internal error", nil)
	}
}

// close stops run and releases the epoll instance. Connections still
// registered are not read any more.
func (p *poller) close() {
	// The pipe is non-blocking and empty: the write cannot fail but for a
	// closed descriptor, which close is never called twice to produce.
	_, _ = syscall.Write(p.wake[1], []byte{0})
	<-p.done
	p.closeFDs()
}

func (p *poller) closeFDs() {
	_ = syscall.Close(p.wake[0])
	_ = syscall.Close(p.wake[1])
	_ = syscall.Close(p.epfd)
}

// add registers c's socket; c is told (readable) when it has something to
// read.
func (p *poller) add(c *conn) error {
	p.mu.Lock()
	p.conns[c.id] = c
	p.mu.Unlock()
	if err := p.ctl(c, syscall.EPOLL_CTL_ADD); err != nil {
		p.mu.Lock()
		delete(p.conns, c.id)
		p.mu.Unlock()
		return err
	}
	return nil
}

// rearm asks for the next readiness event of c after the last one.
func (p *poller) rearm(c *conn) error { return p.ctl(c, syscall.EPOLL_CTL_MOD) }

// remove unregisters c. The socket may be closed already (which removed it
// from the epoll set), hence no error.
func (p *poller) remove(c *conn) {
	p.mu.Lock()
	delete(p.conns, c.id)
	p.mu.Unlock()
	_ = p.ctl(c, syscall.EPOLL_CTL_DEL)
}

// ctl runs epoll_ctl on c's socket. It goes through RawConn.Control, which
// holds the descriptor open for the call: a descriptor closed and reused
// meanwhile cannot be registered in c's name.
func (p *poller) ctl(c *conn, op int) error {
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT}
	setEventID(&ev, c.id)
	var cerr error
	err := c.wire.rc.Control(func(fd uintptr) {
		cerr = syscall.EpollCtl(p.epfd, op, int(fd), &ev)
	})
	if err != nil {
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	if cerr != nil {
		return os.NewSyscallError("epoll_ctl", cerr)
	}
	return nil
}

// eventID and setEventID use the event's 64-bit data field (Fd and Pad in
// Go's struct, on every Linux architecture) for a connection id.
func eventID(ev syscall.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

func setEventID(ev *syscall.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

// rawConnOf returns the descriptor access of a socket the poller can watch
// and tryRead can read: a connection that exposes its socket (syscall.Conn:
// a plain TCP or Unix socket, or the node's counted connection from
// internal/server/limits, which buffers nothing). A TLS connection (or anything
// else) has buffers of its own above the socket, so readiness of the socket
// says nothing about it: such a connection gets a reader goroutine for its
// lifetime instead.
func rawConnOf(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// tryRead reads what the socket holds without waiting: errWouldBlock when
// it holds nothing.
func tryRead(rc syscall.RawConn, p []byte) (int, error) {
	var (
		n    int
		rerr error
	)
	err := rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), p)
			if rerr != syscall.EINTR {
				return true // one attempt: never wait for readiness
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case rerr == syscall.EAGAIN:
		return 0, errWouldBlock
	case rerr != nil:
		return 0, os.NewSyscallError("read", rerr)
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// writeVec writes a and then b to the socket in one writev, or in more if
// the socket takes them in parts. It waits for room as a blocking write
// does, within the connection's write deadline. It is how the wire sends
// a frame held back in two parts as one segment: net.Buffers only uses
// writev on a *net.TCPConn, and the server's connections come wrapped
// (counted by the connection limits).
func writeVec(rc syscall.RawConn, a, b []byte) (int, error) {
	iov := [][]byte{a, b}
	var (
		total int
		werr  error
	)
	err := rc.Write(func(fd uintptr) bool {
		for len(iov) > 0 {
			n, err := unix.Writev(int(fd), iov)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // wait until writable, then call again
			case err != nil:
				werr = os.NewSyscallError("writev", err)
				return true
			case n == 0:
				werr = io.ErrShortWrite
				return true
			}
			total += n
			iov = consumed(iov, n)
		}
		return true
	})
	if err == nil {
		err = werr
	}
	return total, err
}

// consumed is what is left of iov after its first n bytes were written.
func consumed(iov [][]byte, n int) [][]byte {
	for len(iov) > 0 && n >= len(iov[0]) {
		n -= len(iov[0])
		iov = iov[1:]
	}
	if len(iov) > 0 {
		iov[0] = iov[0][n:]
	}
	return iov
}
