package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/policyd/policyd/adminclient"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// This file is the simulated sidecar fleet shared by the propagation and
// idle-memory scenarios: gRPC discovery streams and WebSocket feed
// connections, each recording, on receipt, which policy-set version it
// holds, plus the REST helpers that seed the policies and employees they
// watch.

// inactivityEnv keeps the nodes from closing discovery streams that only
// ACK (idle ones send nothing at all): the default
// discovery.max_client_inactive (2m) is shorter than a 10k-connection run.
// It comes first in the node environment, so a -node-env setting of the
// same variable wins (exec.Cmd keeps the last value of a duplicate key).
const inactivityEnv = "POLICYD_DISCOVERY_MAX_CLIENT_INACTIVE=1h"

// maxRecvMsgSize is the gRPC receive limit of the simulated sidecars: a
// snapshot carries the whole policy set of the scope.
const maxRecvMsgSize = 256 << 20

// maxFeedMessage is the WebSocket read limit of the simulated sidecars (the
// library's default is 32 KiB, smaller than an init with many policies).
const maxFeedMessage = 256 << 20

// streamWindow is grpc-go's default per-stream flow-control window; a
// shared ClientConn gets streams-per-conn of them as its connection window,
// so that multiplexing does not throttle a push compared with one TCP
// connection per sidecar.
const streamWindow = 64 << 10

// sidecarFlags are the flags shared by the sidecar scenarios (propagation
// and idle-memory): how many sidecars of each kind, on how many nodes, and
// how they connect.
type sidecarFlags struct {
	streams         int
	ws              int
	nodes           int
	policies        int
	streamsPerConn  int
	dialConcurrency int
	connectTimeout  time.Duration
}

// sidecarFlagDefaults are a scenario's defaults and help texts for the
// sidecar flags that differ between scenarios.
type sidecarFlagDefaults struct {
	streams, ws, nodes, policies, streamsPerConn int
	streamsUsage, wsUsage, nodesUsage            string
	policiesUsage, streamsPerConnUsage           string
}

func (c *sidecarFlags) register(fs *flag.FlagSet, d sidecarFlagDefaults) {
	fs.IntVar(&c.streams, "streams", d.streams, d.streamsUsage)
	fs.IntVar(&c.ws, "ws", d.ws, d.wsUsage)
	fs.IntVar(&c.nodes, "nodes", d.nodes, d.nodesUsage)
	fs.IntVar(&c.policies, "policies", d.policies, d.policiesUsage)
	fs.IntVar(&c.streamsPerConn, "streams-per-conn", d.streamsPerConn, d.streamsPerConnUsage)
	fs.IntVar(&c.dialConcurrency, "dial-concurrency", 64, "connection attempts in flight while opening")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", 3*time.Minute, "how long every sidecar may take to connect and hold the initial version")
}

// validate checks the sidecar flags; minPolicies is the smallest valid
// -policies.
func (c *sidecarFlags) validate(minPolicies int) []error {
	var errs []error
	if c.streams < 0 || c.ws < 0 || c.streams+c.ws == 0 {
		errs = append(errs, fmt.Errorf("-streams and -ws must not be negative, and not both 0 (got %d, %d)", c.streams, c.ws))
	}
	if c.nodes < 1 {
		errs = append(errs, fmt.Errorf("-nodes must be at least 1, got %d", c.nodes))
	}
	switch {
	case c.policies >= minPolicies:
	case minPolicies == 0:
		errs = append(errs, fmt.Errorf("-policies must not be negative, got %d", c.policies))
	default:
		errs = append(errs, fmt.Errorf("-policies must be at least %d, got %d", minPolicies, c.policies))
	}
	if c.streamsPerConn < 1 {
		errs = append(errs, fmt.Errorf("-streams-per-conn must be at least 1, got %d", c.streamsPerConn))
	}
	if c.dialConcurrency < 1 {
		errs = append(errs, fmt.Errorf("-dial-concurrency must be at least 1, got %d", c.dialConcurrency))
	}
	if c.connectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("-connect-timeout must be positive, got %v", c.connectTimeout))
	}
	return errs
}

// fileMargin is the descriptors bench and a node use besides the sidecars'
// connections: listeners, Raft and cluster connections, data files, the
// load client's pool.
const fileMargin = 256

// filesNeeded is the open-files limit the sidecars need: bench holds every
// WebSocket connection and one gRPC connection per streamsPerConn streams,
// and the node that serves them (all of them with one node) the other end.
func (c *sidecarFlags) filesNeeded() uint64 {
	conns := c.ws + (c.streams+c.streamsPerConn-1)/c.streamsPerConn
	return uint64(conns + fileMargin)
}

// checkFileLimit fails a run that would run out of file descriptors part
// way through opening, with the remedy, instead of reporting connection
// errors; limit 0 means unknown and passes.
func (c *sidecarFlags) checkFileLimit(limit uint64) error {
	if need := c.filesNeeded(); limit != 0 && limit < need {
		return fmt.Errorf("the open-files limit is %d, and %d WebSocket connections plus %d gRPC streams (%d per connection) need about %d: raise the hard limit (ulimit -Hn) or open fewer", limit, c.ws, c.streams, c.streamsPerConn, need)
	}
	return nil
}

// Names of what the fleet watches. Policies and employees are in orgs
// bench-o<k>, team bench-t; sidecar i of a kind is in org i mod orgs.
func orgName(k int) string { return "bench-o" + strconv.Itoa(k) }

const teamName = "bench-t"

func propPolicyName(org, p int) string {
	return "bench-p" + strconv.Itoa(org) + "-" + strconv.Itoa(p)
}

// sidecarKind is the transport of a simulated sidecar.
type sidecarKind int

const (
	kindGRPC sidecarKind = iota
	kindWS
)

func (k sidecarKind) String() string {
	if k == kindGRPC {
		return "grpc"
	}
	return "ws"
}

// sidecarID is the client address (gRPC) or employee id (WebSocket) of
// sidecar i of kind k.
func sidecarID(k sidecarKind, i int) string { return "bench-" + k.String() + "-" + strconv.Itoa(i) }

// notHeld marks, in a holdWait, a sidecar that does not hold the version.
const notHeld = math.MinInt64

// sidecar is one simulated sidecar: its last received version and when it
// arrived, and the wait (if any) that is looking for a version it lacks.
type sidecar struct {
	idx  int // index in fleet.cars
	kind sidecarKind
	node int // index of the node it is connected to
	org  int
	id   string

	mu      sync.Mutex
	version string        // the version of the last set-carrying message
	at      time.Duration // when it arrived, since fleet.base
	watch   *holdWait     // waits for this sidecar to hold a version; nil if none
	dead    bool
}

// received records, on the receiving goroutine, that the sidecar now holds
// version since at, and reports it to a wait looking for that version.
func (c *sidecar) received(version string, at time.Duration) {
	c.mu.Lock()
	c.version, c.at = version, at
	w := c.watch
	if w != nil && w.want[c.org] == version {
		c.watch = nil
	} else {
		w = nil
	}
	c.mu.Unlock()
	if w != nil {
		w.arrive(c.idx, at)
	}
}

// died marks the sidecar's connection as ended; a wait counting on it stops
// doing so. It reports whether this call was the first.
func (c *sidecar) died() bool {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return false
	}
	c.dead = true
	w := c.watch
	c.watch = nil
	c.mu.Unlock()
	if w != nil {
		w.countDown()
	}
	return true
}

// holdWait waits for every sidecar of some orgs to hold the given version of
// its org's policy set. Arrivals come from the receiving goroutines; the
// hand-over is under each sidecar's mutex (see fleet.watch), so every
// sidecar arrives (or is counted down as dead) exactly once.
type holdWait struct {
	want      map[int]string // org → version; read-only once built
	at        []atomic.Int64 // per sidecar: when it held the version, or notHeld
	expected  []int          // indexes of the sidecars waited for
	remaining atomic.Int64
	done      chan struct{}
}

func (w *holdWait) arrive(idx int, at time.Duration) {
	w.at[idx].Store(int64(at))
	w.countDown()
}

func (w *holdWait) countDown() {
	if w.remaining.Add(-1) == 0 {
		close(w.done)
	}
}

// heldAt returns when sidecar idx held the version, if it did.
func (w *holdWait) heldAt(idx int) (time.Duration, bool) {
	v := w.at[idx].Load()
	return time.Duration(v), v != notHeld
}

// fleetSpec describes the sidecars to open.
type fleetSpec struct {
	grpc, ws  int
	grpcAddrs []string // per node: discovery listener
	httpAddrs []string // per node: HTTP listener (feed)
	// nodes is the number of nodes the sidecars are spread over, round
	// robin (sidecar i of a kind on node i mod nodes): the first nodes of
	// the address lists.
	nodes int
	orgs  int
	// grpcScope is what a gRPC sidecar asks for: "employee" (its own
	// identity, as a real sidecar does: one server-side group per stream),
	// "team" or "org" (every stream of an org shares one group).
	grpcScope string
	// grpcHead makes a gRPC sidecar read only version_info and nonce of
	// a response (responseHead), as a WebSocket sidecar reads only type
	// and digest, instead of decoding every policy.
	grpcHead        bool
	streamsPerConn  int
	dialConcurrency int
	// nackEvery makes every nackEvery-th gRPC sidecar NACK every response
	// (0: none), so that the console has rejecting sidecars to show.
	nackEvery int
}

// fleet is the open sidecars.
type fleet struct {
	base   time.Time
	cars   []*sidecar
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conns  []*grpc.ClientConn
	wsMu   sync.Mutex
	ws     []*websocket.Conn
	http   *http.Client
	// readBufs recycles the buffers WebSocket messages are read into:
	// with 10,000 receivers, a fresh slice per message
	// (websocket.Conn.Read) makes the load generator's garbage collector
	// compete with the node for the CPUs.
	readBufs sync.Pool

	closing atomic.Bool
	// Per kind: messages received, sidecars whose connection ended.
	msgs   [2]atomic.Int64
	deaths [2]atomic.Int64
	errMu  sync.Mutex
	errs   []string // the first few connection errors
}

// maxKeptErrors bounds fleet.errs.
const maxKeptErrors = 5

// since is the fleet's clock: monotonic time since the fleet was created.
func (f *fleet) since() time.Duration { return time.Since(f.base) }

// fail records that c's connection ended with err.
func (f *fleet) fail(c *sidecar, err error) {
	if !c.died() || f.closing.Load() {
		return
	}
	f.deaths[c.kind].Add(1)
	f.errMu.Lock()
	if len(f.errs) < maxKeptErrors {
		f.errs = append(f.errs, fmt.Sprintf("%s on node%d: %v", c.id, c.node+1, err))
	}
	f.errMu.Unlock()
}

// errors returns the first connection errors.
func (f *fleet) errors() []string {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return append([]string(nil), f.errs...)
}

// count returns how many sidecars of kind k there are.
func (f *fleet) count(k sidecarKind) int {
	n := 0
	for _, c := range f.cars {
		if c.kind == k {
			n++
		}
	}
	return n
}

// openFleet connects every sidecar of spec: gRPC streams first, then
// WebSocket connections, at most spec.dialConcurrency at a time. It returns
// once every connection attempt is done; the sidecars then receive on their
// own goroutines. A failed attempt marks its sidecar dead (see
// fleet.deaths), it is not an error: the caller's wait reports it.
func openFleet(ctx context.Context, spec fleetSpec) (*fleet, error) {
	fctx, cancel := context.WithCancel(context.Background())
	f := &fleet{
		base: time.Now(), ctx: fctx, cancel: cancel,
		http: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: spec.dialConcurrency}},
	}
	for i := range spec.grpc {
		f.cars = append(f.cars, &sidecar{idx: len(f.cars), kind: kindGRPC, node: i % spec.nodes, org: i % spec.orgs, id: sidecarID(kindGRPC, i)})
	}
	for i := range spec.ws {
		f.cars = append(f.cars, &sidecar{idx: len(f.cars), kind: kindWS, node: i % spec.nodes, org: i % spec.orgs, id: sidecarID(kindWS, i)})
	}

	clients, err := f.sharedConns(spec.grpcAddrs, spec.streamsPerConn)
	if err != nil {
		f.close()
		return nil, err
	}

	sem := make(chan struct{}, spec.dialConcurrency)
	var opening sync.WaitGroup
	for _, c := range f.cars {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		opening.Go(func() {
			defer func() { <-sem }()
			if c.kind == kindGRPC {
				nack := spec.nackEvery > 0 && c.idx%spec.nackEvery == 0 // gRPC sidecars come first
				f.openStream(c, clients[c.idx], grpcScope(spec.grpcScope, c), spec.grpcHead, nack)
			} else {
				f.openFeed(c, spec.httpAddrs[c.node])
			}
		})
	}
	opening.Wait()
	if err := ctx.Err(); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// sharedConns dials one ClientConn per streamsPerConn gRPC sidecars of a
// node (addrs[node]) and returns, per sidecar, the one it uses (nil for a
// WebSocket sidecar).
func (f *fleet) sharedConns(addrs []string, streamsPerConn int, opts ...grpc.DialOption) ([]*grpc.ClientConn, error) {
	out := make([]*grpc.ClientConn, len(f.cars))
	current := make([]*grpc.ClientConn, len(addrs))
	perNode := make([]int, len(addrs))
	for _, c := range f.cars {
		if c.kind != kindGRPC {
			continue
		}
		if perNode[c.node]%streamsPerConn == 0 {
			cc, err := f.dialGRPC(addrs[c.node], streamsPerConn, opts...)
			if err != nil {
				return nil, err
			}
			current[c.node] = cc
		}
		perNode[c.node]++
		out[c.idx] = current[c.node]
	}
	return out, nil
}

// dialGRPC creates a ClientConn for streams streams to addr, with opts
// after bench's own.
func (f *fleet) dialGRPC(addr string, streams int, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
		grpc.WithInitialConnWindowSize(int32(min(streams*streamWindow, math.MaxInt32))),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", addr, err)
	}
	f.conns = append(f.conns, cc)
	return cc, nil
}

// grpcScope is the scope sidecar c asks for.
func grpcScope(mode string, c *sidecar) *discoveryv1.Scope {
	switch mode {
	case "org":
		return &discoveryv1.Scope{Org: orgName(c.org)}
	case "team":
		return &discoveryv1.Scope{Org: orgName(c.org), Team: teamName}
	default:
		return &discoveryv1.Scope{Org: orgName(c.org), Team: teamName, Employee: c.id}
	}
}

// openStream opens c's discovery stream on cc, sends the initial request
// and starts its receiver, which ACKs every response (nack: NACKs it,
// keeping the version it accepted before, none). head: read responses
// with headCodec.
func (f *fleet) openStream(c *sidecar, cc *grpc.ClientConn, scope *discoveryv1.Scope, head, nack bool) {
	var opts []grpc.CallOption
	if head {
		opts = append(opts, grpc.ForceCodecV2(headCodec{encoding.GetCodecV2(protoenc.Name)}))
	}
	st, err := cc.NewStream(f.ctx, &discoveryv1.PolicyDiscoveryService_ServiceDesc.Streams[0],
		discoveryv1.PolicyDiscoveryService_StreamPolicies_FullMethodName, opts...)
	if err != nil {
		f.fail(c, fmt.Errorf("open stream: %w", err))
		return
	}
	req := &discoveryv1.PolicyDiscoveryRequest{ClientAddress: c.id, Scope: scope}
	if err := st.SendMsg(req); err != nil {
		f.fail(c, fmt.Errorf("initial request: %w", err))
		return
	}
	f.wg.Go(func() {
		var full discoveryv1.PolicyDiscoveryResponse
		var hd responseHead
		for {
			var err error
			if head {
				err = st.RecvMsg(&hd)
			} else {
				full.Reset()
				if err = st.RecvMsg(&full); err == nil {
					hd = responseHead{version: full.GetVersionInfo(), nonce: full.GetNonce()}
				}
			}
			at := f.since()
			if err != nil {
				f.fail(c, err)
				return
			}
			f.msgs[kindGRPC].Add(1)
			c.received(hd.version, at)
			// ACK. SendMsg marshals req before returning, so it can be
			// reused.
			req.VersionInfo, req.ResponseNonce = hd.version, hd.nonce
			if nack {
				req.VersionInfo, req.ErrorDetail = "", nackDetail
			}
			if err := st.SendMsg(req); err != nil {
				f.fail(c, fmt.Errorf("ACK: %w", err))
				return
			}
		}
	})
}

// nackDetail is what a NACKing simulated sidecar reports.
var nackDetail = &discoveryv1.ErrorDetail{Message: "bench: simulated rejection"}

// Field numbers of PolicyDiscoveryResponse (api/discovery/v1) that
// responseHead reads.
const (
	responseVersionField = 1
	responseNonceField   = 3
)

// responseHeadFields is every field of PolicyDiscoveryResponse by number
// and name: the two responseHead reads and the ones it skips on purpose,
// as a sidecar that only records and ACKs a response needs neither. A field
// the proto gains fails TestResponseHeadHandlesEveryField until it is
// placed here.
var responseHeadFields = map[protowire.Number]string{
	responseVersionField: "version_info",
	responseNonceField:   "nonce",
	2:                    "policies",  // skipped: what the generator avoids decoding
	4:                    "unchanged", // skipped: an unchanged answer is ACKed like any other
}

// responseHead is what a sidecar needs of a PolicyDiscoveryResponse to
// record and ACK it: version_info and nonce.
type responseHead struct {
	version, nonce string
}

// parse reads the head of the encoded response b. Every field is walked,
// so a message that is not well-formed protobuf is an error, but the
// policies are not decoded.
func (h *responseHead) parse(b []byte) error {
	*h = responseHead{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("decode response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == responseVersionField || num == responseNonceField) {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("decode response field %d: %w", num, protowire.ParseError(n))
			}
			if num == responseVersionField {
				h.version = string(v)
			} else {
				h.nonce = string(v)
			}
			b = b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return fmt.Errorf("decode response field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return nil
}

// headCodec is the proto codec, except that it decodes into a
// *responseHead.
type headCodec struct{ encoding.CodecV2 }

func (c headCodec) Unmarshal(data mem.BufferSlice, v any) error {
	h, ok := v.(*responseHead)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return h.parse(buf.ReadOnlyData())
}

// pongMessage answers the feed's ping.
var pongMessage = []byte(`{"type":"` + feedv1.TypePong + `"}`)

// openFeed connects c to the feed on addr and starts its reader.
func (f *fleet) openFeed(c *sidecar, addr string) {
	u := "ws://" + addr + feedv1.Path + "?" + feedv1.QueryEmployee + "=" + url.QueryEscape(c.id)
	ws, resp, err := websocket.Dial(f.ctx, u, &websocket.DialOptions{HTTPClient: f.http}) //nolint:bodyclose // Dial owns the body
	if err != nil {
		if resp != nil {
			err = fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
		}
		f.fail(c, fmt.Errorf("dial feed: %w", err))
		return
	}
	ws.SetReadLimit(maxFeedMessage)
	f.wsMu.Lock()
	f.ws = append(f.ws, ws)
	f.wsMu.Unlock()
	f.wg.Go(func() {
		for {
			buf, err := readMessage(f.ctx, ws, &f.readBufs)
			at := f.since()
			if err != nil {
				f.fail(c, err)
				return
			}
			data := buf.Bytes()
			typ, _ := jsonTopString(data, "type")
			switch typ {
			case feedv1.TypeInit, feedv1.TypeUpsert, feedv1.TypeDelete:
				f.msgs[kindWS].Add(1)
				digest, _ := jsonTopString(data, "digest")
				c.received(digest, at)
			case feedv1.TypePing:
				if err := ws.Write(f.ctx, websocket.MessageText, pongMessage); err != nil {
					f.fail(c, fmt.Errorf("pong: %w", err))
					return
				}
			case feedv1.TypeRevoke:
				f.fail(c, errors.New("revoked: "+string(data)))
				return
			}
			f.readBufs.Put(buf)
		}
	})
}

// readMessage reads ws's next message into a buffer from pool, which the
// caller puts back once done with its bytes.
func readMessage(ctx context.Context, ws *websocket.Conn, pool *sync.Pool) (*bytes.Buffer, error) {
	_, r, err := ws.Reader(ctx)
	if err != nil {
		return nil, err
	}
	buf, _ := pool.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	buf.Reset()
	if _, err := buf.ReadFrom(r); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return buf, nil
}

// watch starts waiting for every live sidecar of the orgs in want to hold
// want[org]. Sidecars that already hold it count at once (with the time
// they received it, which may be before the caller's reference point);
// dead ones are counted down without holding it.
func (f *fleet) watch(want map[int]string) *holdWait {
	w := &holdWait{want: want, at: make([]atomic.Int64, len(f.cars)), done: make(chan struct{})}
	for i := range w.at {
		w.at[i].Store(notHeld)
	}
	w.remaining.Store(1) // the caller's hold, released below
	for _, c := range f.cars {
		v, ok := want[c.org]
		if !ok {
			continue
		}
		w.expected = append(w.expected, c.idx)
		w.remaining.Add(1)
		c.mu.Lock()
		switch {
		case c.dead:
			c.mu.Unlock()
			w.countDown()
		case c.version == v:
			at := c.at
			c.mu.Unlock()
			w.arrive(c.idx, at)
		default:
			c.watch = w
			c.mu.Unlock()
		}
	}
	w.countDown()
	return w
}

// wait waits until every sidecar w expects holds its version or is dead,
// timeout passes or ctx ends, then detaches w from the sidecars. It reports
// whether every expected sidecar arrived in time (dead ones do not).
func (f *fleet) wait(ctx context.Context, w *holdWait, timeout time.Duration) (complete bool, err error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	for _, idx := range w.expected {
		c := f.cars[idx]
		c.mu.Lock()
		if c.watch == w {
			c.watch = nil
		}
		c.mu.Unlock()
	}
	for _, idx := range w.expected {
		if _, ok := w.heldAt(idx); !ok {
			return false, err
		}
	}
	return true, err
}

// close ends every sidecar's connection and waits for its receiver. The
// gRPC connections are closed last: every stream on them ends with the
// fleet's context, and an SDK sidecar's shared connection (GRPCConn) must
// outlive its Run.
func (f *fleet) close() {
	f.closing.Store(true)
	f.cancel()
	f.wsMu.Lock()
	for _, ws := range f.ws {
		_ = ws.CloseNow()
	}
	f.wsMu.Unlock()
	f.wg.Wait()
	for _, cc := range f.conns {
		_ = cc.Close()
	}
	f.http.CloseIdleConnections()
}

// jsonTopString returns the value of the string field key of the JSON
// object msg, looking at top-level fields only (a nested object's field of
// the same name does not count). It reports false when msg is not an
// object, the field is missing or its value is not a string. It scans msg
// once without decoding it, so that thousands of receivers can read a
// message's type and digest cheaply; a value with escapes is decoded
// properly.
func jsonTopString(msg []byte, key string) (string, bool) {
	i := skipSpace(msg, 0)
	if i >= len(msg) || msg[i] != '{' {
		return "", false
	}
	depth, expectKey := 0, false
	for ; i < len(msg); i++ {
		switch ch := msg[i]; ch {
		case '{', '[':
			depth++
			expectKey = depth == 1
		case '}', ']':
			depth--
			if depth == 0 {
				return "", false
			}
		case ',':
			expectKey = depth == 1
		case '"':
			end := stringEnd(msg, i)
			if end < 0 {
				return "", false
			}
			if depth != 1 || !expectKey {
				i = end
				continue
			}
			expectKey = false
			name := msg[i+1 : end]
			i = end
			if string(name) != key {
				continue
			}
			j := skipSpace(msg, end+1)
			if j >= len(msg) || msg[j] != ':' {
				return "", false
			}
			j = skipSpace(msg, j+1)
			if j >= len(msg) || msg[j] != '"' {
				return "", false
			}
			vend := stringEnd(msg, j)
			if vend < 0 {
				return "", false
			}
			raw := msg[j : vend+1]
			if bytes.IndexByte(raw, '\\') < 0 {
				return string(raw[1 : len(raw)-1]), true
			}
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return "", false
			}
			return s, true
		}
	}
	return "", false
}

// stringEnd returns the index of the quote that closes the JSON string
// opening at msg[open], or -1.
func stringEnd(msg []byte, open int) int {
	for j := open + 1; j < len(msg); j++ {
		switch msg[j] {
		case '\\':
			j++
		case '"':
			return j
		}
	}
	return -1
}

func skipSpace(msg []byte, i int) int {
	for i < len(msg) && (msg[i] == ' ' || msg[i] == '\t' || msg[i] == '\n' || msg[i] == '\r') {
		i++
	}
	return i
}

// restPut is one PUT of the setup.
type restPut struct {
	path string // e.g. /v1/policies/x
	body []byte
}

// putAll sends every PUT, round robin over addrs, workers at a time, and
// fails on the first that does not get a 2xx.
func putAll(ctx context.Context, client *http.Client, addrs []string, puts []restPut, workers int) error {
	apis, err := nodeAPIs(client, addrs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(workers, len(puts)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(puts) {
					return
				}
				addr := addrs[i%len(addrs)]
				// Do: puts hold policies and employees alike, by path.
				if err := apis[i%len(apis)].Do(ctx, http.MethodPut, puts[i].path, nil, puts[i].body, nil); err != nil {
					cancel(fmt.Errorf("PUT %s to %s: %w", puts[i].path, addr, err))
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// propPolicyBody is the JSON of policy name in org, with seq in its reason
// so that every write changes the policy. With size above its natural
// length (about 150 bytes), the reason is padded so that the body is size
// bytes: production policies run to kilobytes, and a message's size
// decides how many writes a socket takes.
func propPolicyBody(name, org string, seq, size int) []byte {
	const suffix = `"}}`
	b := make([]byte, 0, max(256, size))
	b = append(b, `{"name":"`...)
	b = append(b, name...)
	b = append(b, `","kind":"ToolPolicy","scope":{"org":"`...)
	b = append(b, org...)
	b = append(b, `"},"labels":{"bench":"propagation"},"spec":{"tool_name":"Bash","action":"deny","reason":"bench propagation write `...)
	b = strconv.AppendInt(b, int64(seq), 10)
	if pad := size - len(b) - len(suffix); pad > 0 {
		b = append(b, ' ')
		for range pad - 1 {
			b = append(b, 'x')
		}
	}
	return append(b, suffix...)
}

// employeeBody is the JSON of an active employee.
func employeeBody(id, org string) []byte {
	b, _ := json.Marshal(map[string]string{"id": id, "org": org, "team": teamName, "status": "active"})
	return b
}

// seedPolicies creates perOrg policies in each of orgs orgs (seq 0), of
// size bytes (see propPolicyBody).
func seedPolicies(ctx context.Context, client *http.Client, addrs []string, orgs, perOrg, size int) error {
	var puts []restPut
	for k := range orgs {
		for p := range perOrg {
			name := propPolicyName(k, p)
			puts = append(puts, restPut{"/v1/policies/" + name, propPolicyBody(name, orgName(k), 0, size)})
		}
	}
	return putAll(ctx, client, addrs, puts, 16)
}

// seedEmployees creates the employees of the first n WebSocket sidecars.
func seedEmployees(ctx context.Context, client *http.Client, addrs []string, n, orgs int) error {
	puts := make([]restPut, n)
	for i := range n {
		id := sidecarID(kindWS, i)
		puts[i] = restPut{"/v1/employees/" + id, employeeBody(id, orgName(i%orgs))}
	}
	return putAll(ctx, client, addrs, puts, 32)
}

// orgVersion returns the policy-set version of org as node addr has it
// (GET /v1/policies?org=…): with only org-scoped policies in the cluster,
// that is also the version of every identity in the org. consistent makes
// the node catch up with the leader first.
func orgVersion(ctx context.Context, client *http.Client, addr, org string, consistent bool) (string, error) {
	api, err := nodeAPI(client, addr)
	if err != nil {
		return "", err
	}
	list, err := api.Policies(ctx, adminclient.PolicyFilter{Org: org, Consistent: consistent})
	if err != nil {
		return "", fmt.Errorf("GET /v1/policies?org=%s from %s: %w", org, addr, err)
	}
	if list.Version == "" {
		return "", fmt.Errorf("GET /v1/policies?org=%s from %s: no version in the answer", org, addr)
	}
	return list.Version, nil
}
