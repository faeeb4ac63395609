//go:build linux

package chaos

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/policyd/policyd/internal/server/peer"
)

// identifyTimeout bounds the wait for a new connection's hello, which a
// node sends as soon as it dials.
const identifyTimeout = 10 * time.Second

// network is the set of Raft proxies, one per node, and the links currently
// cut between nodes (see docs/design.md, the chaos suite).
type network struct {
	ids map[string]int // Raft server ID → node index

	mu      sync.Mutex
	cut     map[[2]int]bool // (from, to) pairs that carry nothing
	links   map[*link]struct{}
	proxies []*proxy
	closed  bool

	unidentified atomic.Int64 // connections whose sender could not be told
	wg           sync.WaitGroup
}

// link is one proxied connection from node from to node to.
type link struct {
	from, to         int
	client, upstream net.Conn // upstream is nil while black-holed
	healed           chan struct{}
}

func (l *link) close() {
	_ = l.client.Close()
	if l.upstream != nil {
		_ = l.upstream.Close()
	}
}

// proxy fronts one node's Raft listener.
type proxy struct {
	n      *network
	to     int
	ln     net.Listener
	target string // the node's real raft.addr
}

func newNetwork(ids []string) *network {
	n := &network{ids: map[string]int{}, cut: map[[2]int]bool{}, links: map[*link]struct{}{}}
	for i, id := range ids {
		n.ids[id] = i
	}
	return n
}

// listen starts node to's proxy on a free loopback port, forwarding to
// target (which need not be listening yet).
func (n *network) listen(to int, target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy for node %d: %w", to, err)
	}
	p := &proxy{n: n, to: to, ln: ln, target: target}
	n.mu.Lock()
	n.proxies = append(n.proxies, p)
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		p.serve()
	}()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.n.wg.Add(1)
		go func() {
			defer p.n.wg.Done()
			p.handle(c)
		}()
	}
}

// handle identifies the sender from its hello, then forwards, or holds
// the connection silent while the link is cut.
func (p *proxy) handle(c net.Conn) {
	var seen bytes.Buffer
	_ = c.SetReadDeadline(time.Now().Add(identifyTimeout))
	from, err := identify(bufio.NewReader(io.TeeReader(c, &seen)), p.n.ids)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		if seen.Len() == 0 {
			_ = c.Close() // nothing sent: a probe or a dialler that gave up
			return
		}
		p.n.unidentified.Add(1)
		from = -1
	}
	l := &link{from: from, to: p.to, client: c, healed: make(chan struct{})}
	if !p.n.register(l) {
		_ = c.Close()
		return
	}
	defer p.n.unregister(l)
	if p.n.isCut(from, p.to) {
		// Black hole: read and drop until the cut heals or the sender gives
		// up, then close (the stream has lost bytes; it cannot resume).
		p.n.wg.Add(1)
		go func() {
			defer p.n.wg.Done()
			_, _ = io.Copy(io.Discard, c)
		}()
		<-l.healed
		_ = c.Close()
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close() // the node is down: the dialler sees a reset
		return
	}
	if !p.n.attach(l, up) {
		_ = up.Close()
		_ = c.Close()
		return
	}
	if _, err := up.Write(seen.Bytes()); err != nil {
		l.close()
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, up)
		l.close()
		close(done)
	}()
	_, _ = io.Copy(up, c)
	l.close()
	<-done
}

// identify reads the peer handshake's hello that opens every connection to
// a node's Raft port (Raft and the node-to-node API alike) and returns its
// sender's node index.
func identify(r *bufio.Reader, ids map[string]int) (int, error) {
	h, err := peer.ReadHello(r)
	if err != nil {
		return 0, err
	}
	i, ok := ids[h.NodeID]
	if !ok {
		return 0, fmt.Errorf("connection from unknown server %q", h.NodeID)
	}
	return i, nil
}

func (n *network) register(l *link) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.links[l] = struct{}{}
	return true
}

func (n *network) attach(l *link, up net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.cut[[2]int{l.from, l.to}] {
		return false
	}
	l.upstream = up
	return true
}

func (n *network) unregister(l *link) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.links, l)
}

func (n *network) isCut(from, to int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[[2]int{from, to}]
}

// partition cuts both directions between every node of a and every node of
// b, resetting the connections that carried them.
func (n *network) partition(a, b []int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, i := range a {
		for _, j := range b {
			n.cut[[2]int{i, j}], n.cut[[2]int{j, i}] = true, true
		}
	}
	for l := range n.links {
		if n.cut[[2]int{l.from, l.to}] && l.upstream != nil {
			l.close()
		}
	}
}

// heal restores every link; black-holed connections are closed so that
// their senders redial.
func (n *network) heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
	for l := range n.links {
		if l.upstream == nil {
			select {
			case <-l.healed:
			default:
				close(l.healed)
			}
		}
	}
}

// close stops every proxy and connection and waits for their goroutines.
func (n *network) close() error {
	n.mu.Lock()
	n.closed = true
	var errs []error
	for _, p := range n.proxies {
		if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for l := range n.links {
		l.close()
		if l.upstream == nil {
			select {
			case <-l.healed:
			default:
				close(l.healed)
			}
		}
	}
	n.mu.Unlock()
	n.wg.Wait()
	return errors.Join(errs...)
}
