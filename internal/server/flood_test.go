package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/adminclient"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// floodConns is the number of idle TCP connects TestFlood throws at the node
// (half at each listener). The issue's figure is 10,000:
//
//	go test -race -count=1 -run TestFlood -v ./internal/server/ -args -flood.conns=10000
var floodConns = flag.Int("flood.conns", 2000, "idle TCP connects thrown at the node by TestFlood")

// Flood sizes other than the idle connects; fixed, they are small next to
// them.
const (
	floodBadTokens    = 1000
	floodBadWorkers   = 50
	floodOversized    = 10 // oversized WebSocket frames, and gRPC messages
	floodNeverRead    = 10 // WebSocket connections and gRPC streams each
	floodMinWrites    = 120
	floodPolicyNames  = 10
	floodReasonBytes  = 64 << 10
	floodHeapSlack    = 64 << 20 // heap growth tolerated after the flood
	floodGoroutineGap = 40
)

// TestFlood throws a hostile flood at a real node while a WebSocket feed
// client and a gRPC discovery stream, connected before it, keep being
// served: bad tokens, oversized WebSocket frames and gRPC messages, clients
// that never read while policies are pushed, and thousands of TCP connects
// that never send a byte, more than the listeners' max_connections. The
// well-behaved clients must receive every write made during the flood, each
// hostile connection must be refused or closed with the right code, and the
// heap and the goroutine count must come back down afterwards.
func TestFlood(t *testing.T) {
	conns := *floodConns
	limit := conns / 4 // per listener: half the idle connects are over it
	raiseNoFile(t, uint64(conns+2*limit+2048))
	start := time.Now()

	c := newCluster(t, 1, func(cfg *config.Config) {
		feedE2EJWT(t)(cfg)
		cfg.HTTP.MaxConnections, cfg.GRPC.MaxConnections = limit, limit
		// Short enough that never-reading clients are cut during the test.
		cfg.Feed.SendBuffer = 16
		cfg.Feed.WriteTimeout = 3 * time.Second
		cfg.Discovery.SendTimeout = 3 * time.Second
	})
	n := c.leader()
	alice := policy.Identity{Org: "acme", Team: "red", Employee: "alice"}
	mallory := policy.Identity{Org: "acme", Team: "red", Employee: "mallory"}
	a := apiFor(t, n)
	for _, e := range []policy.Identity{alice, mallory} {
		body := fmt.Sprintf(`{"id":%q,"org":%q,"team":%q,"status":"active"}`, e.Employee, e.Org, e.Team)
		if r := a.do(http.MethodPut, "/v1/employees/"+e.Employee, []byte(body), nil); r.status != http.StatusOK {
			t.Fatalf("PUT employee %s: %d %s", e.Employee, r.status, r.body)
		}
	}
	aliceTok, malloryTok := feedE2EToken(t, alice), feedE2EToken(t, mallory)

	// The well-behaved clients, connected before the flood.
	feedCl, st := feedE2EDial(t, n, aliceTok)
	if feedCl == nil {
		t.Fatalf("alice's feed refused: %d", st)
	}
	feedCl.ws.SetReadLimit(4 << 20) // the policies written below are large
	feedCl.nextOf(feedv1.TypeInit)
	good := newGoodStream(t, n, alice, aliceTok)
	writer := newFloodWriter(t, n.HTTPAddr())
	if err := writer.put(0); err != nil { // its connection, too, predates the flood
		t.Fatal(err)
	}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapBefore, goroutinesBefore := ms.HeapAlloc, runtime.NumGoroutine()
	var heapPeak atomic.Uint64
	stopSampling := sampleHeap(&heapPeak)

	// Alice reads as a well-behaved sidecar does, all through the flood:
	// how many writes it lasts depends on the machine (the never-reading
	// clients are cut once the kernel's socket buffers are full), and
	// leaving her messages in her client's channel made her the slow one
	// when the writes outran it (without the race detector's slowdown).
	var aliceGot []string
	aliceCtx, stopAlice := context.WithCancel(context.Background())
	t.Cleanup(stopAlice) // also when the test fails before it has read everything
	aliceDone := make(chan string, 1)
	go func() {
		for {
			select {
			case m := <-feedCl.msgs:
				if m.Type != feedv1.TypeUpsert || m.Policy == nil {
					aliceDone <- fmt.Sprintf("got %s %+v during the flood, want upserts", m.Type, m.Message)
					return
				}
				aliceGot = append(aliceGot, m.Policy.Name)
			case <-aliceCtx.Done():
				aliceDone <- ""
				return
			}
		}
	}()

	writesDone := make(chan error, 1)
	stopWrites := make(chan struct{})
	go func() { writesDone <- writer.run(stopWrites) }()

	// Phase 1: hostile clients that get as far as a listener.
	var wg sync.WaitGroup
	var badStatus sync.Map // status code → *atomic.Int64
	var oversizedWS, oversizedGRPC []string
	var mu sync.Mutex
	note := func(dst *[]string, s string) { mu.Lock(); *dst = append(*dst, s); mu.Unlock() }
	wg.Go(func() { sendBadTokens(n.HTTPAddr(), &badStatus) })
	for range floodOversized {
		wg.Go(func() { note(&oversizedWS, oversizedFrame(n.HTTPAddr(), malloryTok)) })
		wg.Go(func() { note(&oversizedGRPC, oversizedMessage(n.GRPCAddr(), malloryTok)) })
	}
	lazyWS := make([]*websocket.Conn, 0, floodNeverRead)
	for range floodNeverRead {
		ws, _, err := websocket.Dial(context.Background(), "ws://"+n.HTTPAddr()+feedv1.Path, &websocket.DialOptions{ //nolint:bodyclose // Dial owns the body
			HTTPHeader: http.Header{"Authorization": {"Bearer " + malloryTok}},
		})
		if err != nil {
			t.Fatalf("never-reading feed client: %v", err)
		}
		ws.SetReadLimit(-1)
		lazyWS = append(lazyWS, ws)
	}
	lazyGRPC := openLazyStreams(t, n.GRPCAddr(), malloryTok, mallory)
	wg.Wait()

	// Phase 2: idle connects, half at each listener, beyond both caps.
	idle := floodIdle(n.HTTPAddr(), n.GRPCAddr(), conns)

	// The never-reading clients are cut once their buffers fill up.
	poll.Eventually(t, "never-reading clients disconnected", func() error {
		ws, ds := servertest.Metric(t, n.reg, "policy_ws_connections_total"), servertest.Metric(t, n.reg, "policyd_discovery_streams")
		if ws != 1 || ds != 1 {
			return fmt.Errorf("%v feed connections and %v discovery streams open, want 1 each", ws, ds)
		}
		return nil
	}, poll.Within(60*time.Second))

	close(stopWrites)
	if err := <-writesDone; err != nil {
		t.Fatal(err)
	}
	written := writer.written()
	elapsed := time.Since(start)

	// Every write reached both well-behaved clients.
	stopAlice()
	if msg := <-aliceDone; msg != "" {
		t.Fatalf("feed: %s", msg)
	}
	for len(aliceGot) < len(written) {
		m := feedCl.nextOf(feedv1.TypeUpsert)
		if m.Policy == nil {
			t.Fatalf("feed: upsert %d without a policy", len(aliceGot))
		}
		aliceGot = append(aliceGot, m.Policy.Name)
	}
	if diff := cmp.Diff(written, aliceGot); diff != "" {
		t.Fatalf("feed: upserts (-written +received):\n%s", diff)
	}
	good.waitVersion(t, versionOf(t, n, alice))

	// The hostile connections got the right answers.
	for code, cnt := range syncMapCounts(&badStatus) {
		if code != http.StatusUnauthorized {
			t.Errorf("bad tokens: %d answered %d, want 401", cnt, code)
		}
	}
	for _, s := range oversizedWS {
		if s != "closed 1009" {
			t.Errorf("oversized WebSocket frame: %s, want closed 1009 (message too big)", s)
		}
	}
	for _, s := range oversizedGRPC {
		if s != codes.ResourceExhausted.String() {
			t.Errorf("oversized gRPC message: %s, want ResourceExhausted", s)
		}
	}
	for _, ws := range lazyWS {
		if err := drainWS(ws); websocket.CloseStatus(err) != feedv1.CloseSlowConsumer && !isNetClose(err) {
			t.Errorf("never-reading feed client ended with %v, want close %d or a cut connection", err, feedv1.CloseSlowConsumer)
		}
	}
	lazyGRPC.check(t)
	if idle.timedOut.Load() != 0 || idle.dialFailed.Load() != 0 {
		t.Errorf("idle connects: %d never closed by the node, %d could not connect", idle.timedOut.Load(), idle.dialFailed.Load())
	}
	rejected := map[string]float64{}
	for _, l := range []string{"http", "grpc"} {
		rejected[l] = servertest.Metric(t, n.reg, "policyd_connections_rejected_total", "listener", l)
		if rejected[l] < float64(conns/8) {
			t.Errorf("%s: %v connections refused over max_connections %d, want at least %d", l, rejected[l], limit, conns/8)
		}
	}

	// Memory and goroutines come back.
	stopSampling()
	var heapAfter uint64
	poll.Eventually(t, "heap back down", func() error {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heapAfter = ms.HeapAlloc
		if heapAfter > heapBefore+floodHeapSlack {
			return fmt.Errorf("heap %d MiB, before the flood %d MiB", heapAfter>>20, heapBefore>>20)
		}
		return nil
	}, poll.Within(30*time.Second))

	poll.Eventually(t, "goroutines back down", func() error {
		if g := runtime.NumGoroutine(); g > goroutinesBefore+floodGoroutineGap {
			return fmt.Errorf("%d goroutines, %d before the flood", g, goroutinesBefore)
		}
		return nil
	}, poll.Within(30*time.Second))

	t.Logf("flood of %d idle connects (max_connections %d per listener), %d bad tokens, %d+%d oversized, %d+%d never-reading: "+
		"%v; %d writes delivered; heap before %d MiB, peak %d MiB, after %d MiB; goroutines %d before, %d after; "+
		"refused over the cap: http %v, grpc %v; idle connects closed by the node: %d",
		conns, limit, floodBadTokens, floodOversized, floodOversized, floodNeverRead, floodNeverRead,
		elapsed.Round(time.Second), len(written), heapBefore>>20, heapPeak.Load()>>20, heapAfter>>20,
		goroutinesBefore, runtime.NumGoroutine(), rejected["http"], rejected["grpc"], idle.closed.Load())
}

// TestConnLimitsPerIP: with max_connections_per_ip, one source address
// cannot take more than its share of a listener, while another address of
// the same host still gets in. Every 127.0.0.0/8 address reaches a
// loopback listener on Linux, so 127.0.0.2 stands for a second client host.
func TestConnLimitsPerIP(t *testing.T) {
	const perIP = 3
	c := newCluster(t, 1, func(cfg *config.Config) {
		cfg.HTTP.MaxConnectionsPerIP, cfg.GRPC.MaxConnectionsPerIP = perIP, perIP
	})
	n := c.leader()
	tests := []struct {
		listener string
		// hold makes a client from ip that has been served and keeps its
		// connection open until close.
		hold func(t *testing.T, ip string) (close func())
		// probe sends one request over a new connection from ip.
		probe func(ip string) error
	}{
		{
			listener: "http",
			hold: func(t *testing.T, ip string) func() {
				hc := httpFrom(ip, true)
				if err := getHealthz(hc, n.HTTPAddr()); err != nil {
					t.Fatalf("HTTP client %s within the cap: %v", ip, err)
				}
				t.Cleanup(hc.CloseIdleConnections)
				return hc.CloseIdleConnections
			},
			probe: func(ip string) error { return getHealthz(httpFrom(ip, false), n.HTTPAddr()) },
		},
		{
			listener: "grpc",
			hold: func(t *testing.T, ip string) func() {
				cc, err := grpcFrom(n.GRPCAddr(), ip)
				if err == nil {
					err = checkHealth(cc)
				}
				if err != nil {
					t.Fatalf("gRPC client %s within the cap: %v", ip, err)
				}
				t.Cleanup(func() { _ = cc.Close() })
				return func() { _ = cc.Close() }
			},
			probe: func(ip string) error {
				cc, err := grpcFrom(n.GRPCAddr(), ip)
				if err != nil {
					return err
				}
				defer cc.Close()
				return checkHealth(cc)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.listener, func(t *testing.T) {
			var held []func()
			for range perIP {
				held = append(held, tc.hold(t, "127.0.0.1"))
			}
			refused := func() float64 {
				return servertest.Metric(t, n.reg, "policyd_connections_rejected_total", "listener", tc.listener, "reason", "max_connections_per_ip")
			}
			before := refused()
			if err := tc.probe("127.0.0.1"); err == nil {
				t.Fatalf("connection %d from 127.0.0.1 (max_connections_per_ip %d) was served", perIP+1, perIP)
			}
			if got := refused(); got <= before {
				t.Fatalf("refusals for max_connections_per_ip: %v, want more than %v", got, before)
			}
			if err := tc.probe("127.0.0.2"); err != nil {
				t.Fatalf("first connection from 127.0.0.2 while 127.0.0.1 is at its cap: %v", err)
			}
			// A closed connection gives its address's slot back.
			held[0]()
			poll.Eventually(t, "127.0.0.1 served again after one of its connections closed", func() error {
				return tc.probe("127.0.0.1")
			}, poll.Within(10*time.Second))

		})
	}
}

// TestConnLimitsFeed: WebSocket feed connections count against
// http.max_connections until they close, and still get the feed's epoll
// poller through the counting wrapper (no goroutine while idle).
func TestConnLimitsFeed(t *testing.T) {
	const limit = 4
	c := newCluster(t, 1, func(cfg *config.Config) {
		feedE2EJWT(t)(cfg)
		cfg.HTTP.MaxConnections = limit
	})
	n := c.leader()
	alice := policy.Identity{Org: "acme", Team: "red", Employee: "alice"}
	body := fmt.Sprintf(`{"id":%q,"org":%q,"team":%q,"status":"active"}`, alice.Employee, alice.Org, alice.Team)
	a := apiFor(t, n)
	if r := a.do(http.MethodPut, "/v1/employees/"+alice.Employee, []byte(body), nil); r.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", r.status, r.body)
	}
	a.hc.CloseIdleConnections()
	tok := feedE2EToken(t, alice)
	poll.Eventually(t, "the admin client's connection closed", func() error {
		if v := servertest.Metric(t, n.reg, "policyd_connections_open", "listener", "http"); v != 0 {
			return fmt.Errorf("%v HTTP connections open", v)
		}
		return nil
	}, poll.Within(10*time.Second))

	var feeds []*feedE2EClient
	for range limit {
		fc, st := feedE2EDial(t, n, tok)
		if fc == nil {
			t.Fatalf("feed connection within http.max_connections refused: %d", st)
		}
		fc.nextOf(feedv1.TypeInit)
		feeds = append(feeds, fc)
	}
	if v := servertest.Metric(t, n.reg, "policyd_connections_open", "listener", "http"); v != limit {
		t.Fatalf("%v HTTP connections counted with %d feed connections open, want %d", v, limit, limit)
	}
	poll.Eventually(t, "idle feed connections without goroutines (polled)", func() error {
		if g := servertest.Goroutines("server/feed.(*conn)."); g != 0 {
			return fmt.Errorf("%d goroutines run feed connection code", g)
		}
		return nil
	}, poll.Within(10*time.Second))

	before := servertest.Metric(t, n.reg, "policyd_connections_rejected_total", "listener", "http", "reason", "max_connections")
	if err := getHealthz(httpFrom("127.0.0.1", false), n.HTTPAddr()); err == nil {
		t.Fatalf("HTTP request served with %d feed connections open (http.max_connections %d)", limit, limit)
	}
	if got := servertest.Metric(t, n.reg, "policyd_connections_rejected_total", "listener", "http", "reason", "max_connections"); got <= before {
		t.Fatalf("refusals for max_connections: %v, want more than %v", got, before)
	}
	// A feed connection that closes gives its slot back.
	_ = feeds[0].ws.CloseNow()
	poll.Eventually(t, "HTTP served after a feed connection closed", func() error {
		return getHealthz(httpFrom("127.0.0.1", false), n.HTTPAddr())
	}, poll.Within(10*time.Second))

}

// TestConnLimitsRaft: a flood of connects to a follower's Raft listener is
// refused beyond raft.max_connections, and the cluster keeps committing
// and replicating to that follower over the peers' established
// connections.
func TestConnLimitsRaft(t *testing.T) {
	const limit, flood = 16, 40
	c := newCluster(t, 3, func(cfg *config.Config) { cfg.Raft.MaxConnections = limit })
	a := apiFor(t, c.leader())
	a.putPolicy("acme.before-flood", "acme", "warm the peers' connections up")
	c.waitConverged()
	f := c.follower()
	open := func() float64 { return servertest.Metric(t, f.reg, "policyd_connections_open", "listener", "raft") }
	if v := open(); v < 1 || v > limit {
		t.Fatalf("%v Raft connections counted on %s before the flood, want between 1 and %d", v, f.ID(), limit)
	}

	for range flood {
		nc, err := net.DialTimeout("tcp", f.RaftAddr(), 5*time.Second)
		if err != nil {
			t.Fatalf("connect to the Raft listener: %v", err)
		}
		t.Cleanup(func() { _ = nc.Close() })
	}
	// At most limit of them are admitted, and Raft keeps those open.
	poll.Eventually(t, "the Raft listener full and the rest refused", func() error {
		rejected := servertest.Metric(t, f.reg, "policyd_connections_rejected_total", "listener", "raft", "reason", "max_connections")
		if v := open(); v != limit || rejected < flood-limit {
			return fmt.Errorf("%v open (want %d), %v refused (want at least %d)", v, limit, rejected, flood-limit)
		}
		return nil
	}, poll.Within(10*time.Second))

	for i := range 5 {
		a.putPolicy(fmt.Sprintf("acme.during-flood-%d", i), "acme", "committed while the follower's Raft listener is full")
	}
	c.waitConverged()
}

// TestConnLimitsDrift: the drift webhook's listener is capped at
// drift.max_connections, before the TLS handshake. No API server answers
// here: the webhook's informers only retry in the background.
func TestConnLimitsDrift(t *testing.T) {
	const limit = 2
	p := newPKI(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 1, func(cfg *config.Config) {
		cfg.Kubernetes.Kubeconfig = kubeconfig
		cfg.Drift.Addr, cfg.Drift.TLS, cfg.Drift.MaxConnections = "127.0.0.1:0", p.issue(t, "drift"), limit
	})
	n := c.leader()
	clientTLS := p.clientTLS(t, "kube-apiserver")
	handshake := func() (*tls.Conn, error) {
		tc, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n.DriftAddr(), clientTLS)
		if err == nil {
			t.Cleanup(func() { _ = tc.Close() })
		}
		return tc, err
	}
	var held []*tls.Conn
	for range limit {
		tc, err := handshake()
		if err != nil {
			t.Fatalf("connection within drift.max_connections: %v", err)
		}
		held = append(held, tc)
	}
	if _, err := handshake(); err == nil {
		t.Fatalf("connection %d handshook (drift.max_connections %d), want it closed", limit+1, limit)
	}
	if got := servertest.Metric(t, n.reg, "policyd_connections_rejected_total", "listener", "drift", "reason", "max_connections"); got != 1 {
		t.Fatalf("refusals on the drift listener: %v, want 1", got)
	}
	_ = held[0].Close()
	poll.Eventually(t, "a drift connection after one closed", func() error {
		_, err := handshake()
		return err
	}, poll.Within(10*time.Second))

}

// localDialer dials from ip, any 127.0.0.0/8 address on Linux loopback.
func localDialer(ip string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
}

// httpFrom is an HTTP client connecting from ip; keepAlive keeps its
// connection open after a request.
func httpFrom(ip string, keepAlive bool) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: localDialer(ip).DialContext, DisableKeepAlives: !keepAlive},
		Timeout:   5 * time.Second,
	}
}

func getHealthz(hc *http.Client, addr string) error {
	resp, err := hc.Get("http://" + addr + "/healthz") //nolint:noctx // the client has a timeout
	if err != nil {
		return err
	}
	// Read to the end, so that a kept-alive connection stays open.
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET /healthz: %d", resp.StatusCode)
	}
	return err
}

// grpcFrom is a gRPC client connecting from ip.
func grpcFrom(addr, ip string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return localDialer(ip).DialContext(ctx, "tcp", a)
		}))
}

func checkHealth(cc *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// raiseNoFile raises the soft descriptor limit to need (both ends of every
// loopback connection are in this process), or skips.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Skipf("cannot read RLIMIT_NOFILE: %v", err)
	}
	if rl.Max < need {
		t.Skipf("RLIMIT_NOFILE hard limit %d is below the %d descriptors this flood needs; lower -flood.conns or raise the limit", rl.Max, need)
	}
	if rl.Cur >= need {
		return
	}
	old := rl.Cur
	rl.Cur = need
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Skipf("cannot raise RLIMIT_NOFILE to %d: %v", need, err)
	}
	t.Cleanup(func() {
		rl.Cur = old
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	})
}

// sampleHeap records the largest HeapAlloc seen until the returned func is
// called.
func sampleHeap(peak *atomic.Uint64) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); <-ended }
}

// floodWriter PUTs large policies over one kept-alive connection, made
// before the flood (a new one could be refused at max_connections).
type floodWriter struct {
	hc     *http.Client
	client *adminclient.Client // over hc, of the one node
	mu     sync.Mutex
	names  []string
}

func newFloodWriter(t *testing.T, addr string) *floodWriter {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 30 * time.Second}
	client, err := adminclient.New(adminclient.Config{Servers: []string{"http://" + addr}, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	return &floodWriter{hc: hc, client: client}
}

func (w *floodWriter) put(i int) error {
	name := fmt.Sprintf("acme.flood-%d", i%floodPolicyNames)
	reason := fmt.Sprintf("write %d %s", i, strings.Repeat("x", floodReasonBytes))
	var lastErr error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		_, err := w.client.PutPolicy(context.Background(), name, toolPolicy(name, "acme", reason), adminclient.AnyRevision)
		var ae *adminclient.Error
		if errors.As(err, &ae) {
			return fmt.Errorf("PUT %s: %w", name, err)
		}
		if err != nil {
			// A new connection may be refused while the listener is
			// full: retry, as any client would.
			lastErr = err
			<-time.After(100 * time.Millisecond) // client back-off
			continue
		}
		w.mu.Lock()
		w.names = append(w.names, name)
		w.mu.Unlock()
		return nil
	}
	return fmt.Errorf("PUT %s: %w", name, lastErr)
}

// run writes until stop is closed, and at least floodMinWrites times.
func (w *floodWriter) run(stop <-chan struct{}) error {
	defer w.hc.CloseIdleConnections()
	for i := 1; ; i++ {
		if i > floodMinWrites {
			select {
			case <-stop:
				return nil
			default:
			}
		}
		if err := w.put(i); err != nil {
			return err
		}
	}
}

func (w *floodWriter) written() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.names...)
}

// sendBadTokens sends floodBadTokens WebSocket upgrades with a bad token
// from floodBadWorkers clients at once and counts the statuses.
func sendBadTokens(addr string, statuses *sync.Map) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: floodBadWorkers}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range floodBadWorkers {
		wg.Go(func() {
			for next.Add(1) <= floodBadTokens {
				code := -1 // transport error
				req, _ := http.NewRequest(http.MethodGet, "http://"+addr+feedv1.Path, nil)
				req.Header = http.Header{
					"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
					"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}, "Authorization": {"Bearer not.a.token"},
				}
				if resp, err := hc.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					code = resp.StatusCode
				}
				v, _ := statuses.LoadOrStore(code, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
			}
		})
	}
	wg.Wait()
}

func syncMapCounts(m *sync.Map) map[int]int64 {
	out := map[int]int64{}
	m.Range(func(k, v any) bool {
		out[k.(int)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// oversizedFrame connects with a valid token, sends a frame larger than
// feed.max_message_bytes and reports how the connection ended.
func oversizedFrame(addr, token string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+addr+feedv1.Path, &websocket.DialOptions{ //nolint:bodyclose // Dial owns the body
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
	})
	if err != nil {
		return "dial: " + err.Error()
	}
	defer func() { _ = ws.CloseNow() }()
	ws.SetReadLimit(-1)
	_ = ws.Write(ctx, websocket.MessageText, bytes.Repeat([]byte("a"), 1<<20))
	err = drainWS(ws)
	if s := websocket.CloseStatus(err); s != -1 {
		return fmt.Sprintf("closed %d", s)
	}
	return fmt.Sprintf("ended without a close frame: %v", err)
}

// drainWS reads until the connection ends.
func drainWS(ws *websocket.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer func() { _ = ws.CloseNow() }()
	for {
		if _, _, err := ws.Read(ctx); err != nil {
			return err
		}
	}
}

func isNetClose(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, net.ErrClosed)
}

// oversizedMessage opens a discovery stream with a valid token and sends a
// request larger than the node's gRPC receive limit; it reports the code
// the stream ended with.
func oversizedMessage(addr, token string) string {
	cc, err := grpcClient(addr)
	if err != nil {
		return err.Error()
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), 30*time.Second)
	defer cancel()
	s, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).StreamPolicies(ctx)
	if err != nil {
		return "open: " + err.Error()
	}
	_ = s.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: strings.Repeat("a", 5<<20)})
	for {
		if _, err := s.Recv(); err != nil {
			return status.Code(err).String()
		}
	}
}

// lazyStreams are discovery streams that never read.
type lazyStreams struct {
	cancel context.CancelFunc
	ss     []discoveryv1.PolicyDiscoveryService_StreamPoliciesClient
	close  func()
}

func openLazyStreams(t *testing.T, addr, token string, id policy.Identity) *lazyStreams {
	t.Helper()
	cc, err := grpcClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token))
	l := &lazyStreams{cancel: cancel, close: func() { cancel(); _ = cc.Close() }}
	t.Cleanup(l.close)
	for i := range floodNeverRead {
		s, err := discoveryv1.NewPolicyDiscoveryServiceClient(cc).StreamPolicies(ctx)
		if err != nil {
			t.Fatalf("never-reading stream: %v", err)
		}
		err = s.Send(&discoveryv1.PolicyDiscoveryRequest{
			ClientAddress: fmt.Sprintf("lazy-%d", i),
			Scope:         &discoveryv1.Scope{Org: id.Org, Team: id.Team, Employee: id.Employee},
		})
		if err != nil {
			t.Fatalf("never-reading stream: %v", err)
		}
		l.ss = append(l.ss, s)
	}
	return l
}

// check reads what the never-reading streams were sent until they end: the
// node must have ended each of them.
func (l *lazyStreams) check(t *testing.T) {
	t.Helper()
	timer := time.AfterFunc(30*time.Second, l.cancel) // a stream the node left open ends Canceled
	defer timer.Stop()
	for i, s := range l.ss {
		var err error
		for err == nil {
			_, err = s.Recv()
		}
		if c := status.Code(err); c == codes.Canceled || c == codes.OK {
			t.Errorf("never-reading stream %d: ended with %v, want the node to end it", i, err)
		}
	}
	l.close()
}

// goodStream is a discovery stream that ACKs every response, on its own
// goroutine.
type goodStream struct {
	latest atomic.Value // string: the last version received
	err    atomic.Value // error: why the stream ended
}

func newGoodStream(t *testing.T, n *Node, id policy.Identity, token string) *goodStream {
	t.Helper()
	cc := dialGRPC(t, n.GRPCAddr())
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	d := openStream(t, cc, "good", id, withCtx(ctx))
	first := d.next()
	d.ack(first)
	g := &goodStream{}
	g.latest.Store(first.GetVersionInfo())
	go func() {
		for r := range d.resps {
			g.latest.Store(r.GetVersionInfo())
			if err := d.stream.Send(&discoveryv1.PolicyDiscoveryRequest{
				ClientAddress: d.client, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce(), Scope: d.scope,
			}); err != nil {
				g.err.Store(err)
			}
		}
	}()
	return g
}

func (g *goodStream) waitVersion(t *testing.T, want string) {
	t.Helper()
	poll.Eventually(t, "discovery stream on the final version", func() error {
		if err, ok := g.err.Load().(error); ok {
			t.Fatalf("well-behaved discovery stream failed: %v", err)
		}
		if got := g.latest.Load().(string); got != want {
			return fmt.Errorf("at version %s, want %s", got, want)
		}
		return nil
	}, poll.Within(30*time.Second))

}

// idleFlood is the outcome of the idle connects.
type idleFlood struct {
	closed, timedOut, dialFailed atomic.Int64
}

// floodIdle opens conns TCP connections, half to each address, that never
// send anything, and returns once the node has closed every one (or they
// timed out). A connection over max_connections is closed at once; the
// others when the handshake timeout passes.
func floodIdle(httpAddr, grpcAddr string, conns int) *idleFlood {
	var f idleFlood
	var wg sync.WaitGroup
	dials := make(chan struct{}, 256) // connects in flight
	for i := range conns {
		addr := httpAddr
		if i%2 == 1 {
			addr = grpcAddr
		}
		dials <- struct{}{}
		wg.Go(func() {
			nc, err := net.DialTimeout("tcp", addr, 20*time.Second)
			<-dials
			if err != nil {
				f.dialFailed.Add(1)
				return
			}
			defer nc.Close()
			_ = nc.SetReadDeadline(time.Now().Add(45 * time.Second))
			_, err = io.Copy(io.Discard, nc) // the node may send its HTTP/2 settings first
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				f.timedOut.Add(1)
				return
			}
			f.closed.Add(1)
		})
	}
	wg.Wait()
	return &f
}

func grpcClient(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}
