package feed

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/policyd/policyd/internal/third_party/raft"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/server/servertest"
	"github.com/policyd/policyd/internal/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testIssuer   = "policyd-test"
	testAudience = "policyd-feed"
	// msgTimeout bounds every wait for a message that must arrive.
	msgTimeout = 5 * time.Second
)

// testFeedConfig is the default feed configuration with pings rare enough
// not to interleave with the messages a test looks at.
func testFeedConfig() config.Feed {
	cfg := config.Default().Feed
	cfg.PingInterval = time.Hour
	return cfg
}

// testLogger sends logs to t.Log, so they show only for failing tests.
func testLogger(t testing.TB) *slog.Logger { return servertest.Logger(t) }

// fixture is a hub over a real store, fed through the real FSM (without
// Raft) and a dispatcher that does what server.Node's does, served by an
// httptest server.
type fixture struct {
	t      *testing.T
	st     *store.Store
	fsm    *raftfsm.FSM
	idx    *policyset.Index
	hub    *Hub
	srv    *httptest.Server
	hc     *http.Client
	reg    *prometheus.Registry
	secret []byte // nil: auth.mode none
	next   uint64 // the next Raft index
	// readIndex stands in for the leader's commit index in the hub's
	// CaughtUp (a consistent read); nil: the fixture's last applied index.
	readIndex atomic.Pointer[func() (uint64, error)]
	// ownWrites, when set, is the hub's Deps.OwnWrites; nil: no wait.
	ownWrites atomic.Pointer[func(ctx context.Context) error]
	// caughtUps and ownWaits count the hub's calls of each wait.
	caughtUps, ownWaits atomic.Int64
}

// waitOwnWrites is the hub's Deps.OwnWrites.
func (f *fixture) waitOwnWrites(ctx context.Context) error {
	f.ownWaits.Add(1)
	if fn := f.ownWrites.Load(); fn != nil {
		return (*fn)(ctx)
	}
	return nil
}

// setOwnWrites makes the hub's waits for its own writes run fn until the
// test ends.
func (f *fixture) setOwnWrites(t *testing.T, fn func(ctx context.Context) error) {
	f.ownWrites.Store(&fn)
	t.Cleanup(func() { f.ownWrites.Store(nil) })
}

// caughtUp is the hub's Deps.CaughtUp: it waits until the store has applied
// the read index.
func (f *fixture) caughtUp(ctx context.Context) error {
	f.caughtUps.Add(1)
	idx := f.st.AppliedIndex()
	if fn := f.readIndex.Load(); fn != nil {
		var err error
		if idx, err = (*fn)(); err != nil {
			return err
		}
	}
	return f.st.WaitApplied(ctx, idx)
}

// setReadIndex makes the fixture's consistent reads answer fn until the
// test ends.
func (f *fixture) setReadIndex(t *testing.T, fn func() (uint64, error)) {
	f.readIndex.Store(&fn)
	t.Cleanup(func() { f.readIndex.Store(nil) })
}

type fixtureOpts struct {
	feed   func(*config.Feed)
	noAuth bool // auth.mode none
	// sendBuffer, if set, is the kernel send buffer of every accepted
	// socket: small, a client that stops reading blocks the server's
	// writes after that much instead of megabytes.
	sendBuffer int
	// noPoll: every connection reads with a goroutine of its own, as
	// where there is no poller.
	noPoll bool
	// tls serves over TLS (wss://).
	tls bool
	// refusal is the hub's Deps.Refusal.
	refusal func() string
}

// readModes are the two ways a connection reads: polled (no goroutine
// while idle) and with a reader goroutine of its own (no poller on the
// platform, TLS). Tests of what clients send run in both.
var readModes = []struct {
	name   string
	noPoll bool
}{{"polled", false}, {"reader goroutine", true}}

func newFixture(t *testing.T, opts fixtureOpts) *fixture {
	t.Helper()
	logger := testLogger(t)
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"), logger)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, st: st, fsm: raftfsm.New(st, logger), reg: prometheus.NewRegistry(), next: st.AppliedIndex() + 1}
	// Subscribe before the index loads, as the node does.
	sub := st.SubscribeWithData()
	if f.idx, err = policyset.New(st); err != nil {
		t.Fatal(err)
	}
	var verifier *auth.JWTVerifier
	if !opts.noAuth {
		f.secret = make([]byte, 48)
		_, _ = rand.Read(f.secret)
		path := filepath.Join(t.TempDir(), "hmac.secret")
		if err := os.WriteFile(path, []byte(hex.EncodeToString(f.secret)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		f.secret = []byte(hex.EncodeToString(f.secret))
		if verifier, err = auth.NewJWTVerifier(config.JWT{HMACSecretFile: path, Issuer: testIssuer, Audience: testAudience}, logger); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testFeedConfig()
	if opts.feed != nil {
		opts.feed(&cfg)
	}
	f.hub, err = New(cfg, logger, Deps{NodeID: "test-node", Store: st, Policies: f.idx, Verifier: verifier, Registry: f.reg, CaughtUp: f.caughtUp,
		OwnWrites: f.waitOwnWrites, Refusal: opts.refusal})
	if err != nil {
		t.Fatal(err)
	}
	f.hub.noPoll = opts.noPoll
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); f.hub.Run(ctx) }()
	go func() { defer wg.Done(); dispatch(ctx, sub, f.idx, f.hub, logger) }()
	mux := http.NewServeMux()
	mux.Handle(feedv1.Path, f.hub)
	f.srv = httptest.NewUnstartedServer(mux)
	if opts.sendBuffer > 0 {
		f.srv.Listener = smallSendListener{f.srv.Listener, opts.sendBuffer}
	}
	if opts.tls {
		f.srv.StartTLS()
		f.hc = f.srv.Client()
	} else {
		f.srv.Start()
		f.hc = &http.Client{Transport: &http.Transport{}}
	}
	t.Cleanup(func() {
		f.hub.CloseAll()
		cancel()
		wg.Wait()
		f.srv.Close()
		f.hc.CloseIdleConnections()
		sub.Close()
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// smallSendListener sets the send buffer of the sockets it accepts.
type smallSendListener struct {
	net.Listener
	size int
}

func (l smallSendListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(l.size)
	}
	return c, err
}

// dispatch feeds committed batches to the index and then the hub, in
// commit order, like server.Node.dispatchChanges.
func dispatch(ctx context.Context, sub *store.Subscription, idx *policyset.Index, hub *Hub, logger *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-sub.Ready():
			if !ok {
				return
			}
		}
		for _, c := range sub.Next() {
			if err := idx.Update(c); err != nil {
				logger.Error("policy index update failed", "err", err)
				c = store.Change{Index: c.Index, Resync: true, At: c.At}
				_ = idx.Update(c)
			}
			hub.OnChange(c)
		}
	}
}

// apply commits cmds as one batch through the FSM and returns the index of
// the last one. Any business error fails the test.
func (f *fixture) apply(cmds ...*command.Command) uint64 {
	f.t.Helper()
	logs := make([]*raft.Log, len(cmds))
	now := time.Now()
	for i, cmd := range cmds {
		cp := cmd.Clone()
		cp.ProcessedAtUnixNano = now.UnixNano()
		cp.OriginatedAtUnixNano = now.UnixNano()
		data, err := command.Marshal(cp)
		if err != nil {
			f.t.Fatal(err)
		}
		logs[i] = &raft.Log{Index: f.next, Term: 1, Type: raft.LogCommand, Data: data}
		f.next++
	}
	for i, r := range f.fsm.ApplyBatch(logs) {
		res, ok := r.(*commandv1.Result)
		if !ok {
			f.t.Fatalf("entry %d: apply result %T", logs[i].Index, r)
		}
		if err := command.ResultErr(res); err != nil {
			f.t.Fatalf("entry %d: %v", logs[i].Index, err)
		}
	}
	last := f.next - 1
	// Wait until the hub has taken the batch in, so that a connection
	// opened next starts after it (the feed is right either way, but a
	// test then knows which messages to expect).
	poll.Eventually(f.t, fmt.Sprintf("the hub to take in index %d", last), poll.Holds(func() bool {
		f.hub.mu.RLock()
		defer f.hub.mu.RUnlock()
		return f.hub.dispatched >= last
	}), poll.Within(msgTimeout), poll.Every(time.Millisecond))
	return last
}

func must(t testing.TB) func(*command.Command, error) *command.Command {
	return func(c *command.Command, err error) *command.Command {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// toolPolicy is a valid ToolPolicy with the given scope.
func toolPolicy(name string, scope policy.Scope, reason string) *policy.Policy {
	spec, _ := json.Marshal(map[string]any{"tool_name": "Bash", "action": "deny", "reason": reason})
	return &policy.Policy{Name: name, Kind: policy.KindToolPolicy, Scope: scope, Spec: spec}
}

func (f *fixture) putPolicy(name string, scope policy.Scope, reason string) *command.Command {
	return must(f.t)(command.PutPolicy(toolPolicy(name, scope, reason), nil))
}

func (f *fixture) deletePolicy(name string) *command.Command {
	return must(f.t)(command.DeletePolicy(name, nil))
}

func (f *fixture) putEmployee(id, org, team, status string) *command.Command {
	return must(f.t)(command.PutEmployee(&policy.Employee{ID: id, Org: org, Team: team, Status: status}, nil))
}

func (f *fixture) deleteEmployee(id string) *command.Command {
	return must(f.t)(command.DeleteEmployee(id, nil))
}

func scopeOrg(o string) policy.Scope           { return policy.Scope{Org: o} }
func scopeTeam(o, tm string) policy.Scope      { return policy.Scope{Org: o, Team: tm} }
func scopeEmp(o, e string) policy.Scope        { return policy.Scope{Org: o, Employee: e} }
func identity(o, tm, e string) policy.Identity { return policy.Identity{Org: o, Team: tm, Employee: e} }

// claims are the claims of a test token; mutate them to break it.
type claims = jwt.MapClaims

// token signs a valid token for employee sub of org and team.
func (f *fixture) token(sub, o, tm string, mutate ...func(claims)) string {
	f.t.Helper()
	return signToken(f.t, f.secret, sub, o, tm, mutate...)
}

func signToken(t testing.TB, secret []byte, sub, o, tm string, mutate ...func(claims)) string {
	t.Helper()
	now := time.Now()
	c := claims{
		"sub": sub, "org": o, "iss": testIssuer, "aud": testAudience,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
	if tm != "" {
		c["team"] = tm
	}
	for _, m := range mutate {
		m(c)
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dialOpts says how a test client connects.
type dialOpts struct {
	token        string   // sent as Authorization: Bearer
	subprotocols []string // offered
	query        string   // without "?"
	noRead       bool     // do not read until startReading
	noPong       bool     // do not answer pings
}

// wsURL is the feed's URL with query q.
func (f *fixture) wsURL(q string) string {
	u := "ws" + strings.TrimPrefix(f.srv.URL, "http") + feedv1.Path
	if q != "" {
		u += "?" + q
	}
	return u
}

// dial connects, failing the test if the handshake is refused.
func (f *fixture) dial(t *testing.T, o dialOpts) *client {
	t.Helper()
	c, resp, err := f.tryDial(t, o) //nolint:bodyclose // websocket.Dial owns the response body
	if err != nil {
		status := 0
		var body []byte
		if resp != nil {
			status = resp.StatusCode
			body, _ = io.ReadAll(resp.Body)
		}
		t.Fatalf("dial: %v (status %d, body %s)", err, status, body)
	}
	return c
}

// tryDial connects and returns the handshake response.
func (f *fixture) tryDial(t *testing.T, o dialOpts) (*client, *http.Response, error) {
	t.Helper()
	return dialFeed(t, f.hc, f.wsURL(o.query), o)
}

func dialFeed(t *testing.T, hc *http.Client, url string, o dialOpts) (*client, *http.Response, error) {
	t.Helper()
	hdr := http.Header{}
	if o.token != "" {
		hdr.Set("Authorization", "Bearer "+o.token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), msgTimeout)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: hdr, Subprotocols: o.subprotocols})
	if err != nil {
		return nil, resp, err
	}
	ws.SetReadLimit(64 << 20)
	c := &client{t: t, ws: ws, msgs: make(chan feedv1.Message, 100000), done: make(chan struct{}), pong: !o.noPong}
	if !o.noRead {
		c.startReading()
	}
	t.Cleanup(func() {
		_ = ws.CloseNow()
		c.startOnce.Do(func() { close(c.done) }) // never started reading
		<-c.done
	})
	return c, resp, nil
}

// client is a test feed client. A goroutine reads every message into msgs
// and answers pings.
type client struct {
	t         *testing.T
	ws        *websocket.Conn
	msgs      chan feedv1.Message
	pong      bool
	startOnce sync.Once
	done      chan struct{} // closed when the reader ends; err is set then
	err       error
}

func (c *client) startReading() {
	c.startOnce.Do(func() { go c.read() })
}

func (c *client) read() {
	defer close(c.done)
	for {
		typ, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.err = err
			return
		}
		var m feedv1.Message
		if typ != websocket.MessageText || json.Unmarshal(data, &m) != nil {
			c.err = fmt.Errorf("undecodable %v message %q", typ, data)
			_ = c.ws.CloseNow()
			return
		}
		if m.Type == feedv1.TypePing && c.pong {
			ctx, cancel := context.WithTimeout(context.Background(), msgTimeout)
			_ = c.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"pong"}`))
			cancel()
		}
		c.msgs <- m
	}
}

// next returns the next message that is not a ping, failing the test if
// none comes within msgTimeout.
func (c *client) next() feedv1.Message {
	c.t.Helper()
	timer := time.NewTimer(msgTimeout)
	defer timer.Stop()
	for {
		select {
		case m := <-c.msgs:
			if m.Type == feedv1.TypePing {
				continue
			}
			return m
		case <-c.done:
			// Messages read before the end are still queued.
			select {
			case m := <-c.msgs:
				if m.Type == feedv1.TypePing {
					continue
				}
				return m
			default:
			}
			c.t.Fatalf("connection ended while waiting for a message: %v", c.err)
		case <-timer.C:
			c.t.Fatal("no message within", msgTimeout)
		}
	}
}

// nextOf returns the next message, failing the test unless it has type typ.
func (c *client) nextOf(typ string) feedv1.Message {
	c.t.Helper()
	m := c.next()
	if m.Type != typ {
		c.t.Fatalf("got %s message %+v, want %s", m.Type, m, typ)
	}
	return m
}

// closeCode waits for the connection to end and returns its close code
// (-1 if it ended without one). Messages still queued are discarded.
func (c *client) closeCode(within time.Duration) websocket.StatusCode {
	c.t.Helper()
	c.startReading()
	select {
	case <-c.done:
		return websocket.CloseStatus(c.err)
	case <-time.After(within):
		c.t.Fatalf("connection still open after %v", within)
		return 0
	}
}

// until collects the messages that are not pings up to and including the
// upsert of policy marker.
func (c *client) until(marker string) []feedv1.Message {
	c.t.Helper()
	var out []feedv1.Message
	for {
		m := c.next()
		if m.Type == feedv1.TypeUpsert && m.Policy != nil && m.Policy.Name == marker {
			return out
		}
		out = append(out, m)
	}
}

// summary renders messages as "upsert:name", "delete:name" for comparison.
func summary(msgs []feedv1.Message) []string {
	out := []string{}
	for _, m := range msgs {
		switch m.Type {
		case feedv1.TypeUpsert:
			out = append(out, "upsert:"+m.Policy.Name)
		case feedv1.TypeDelete:
			out = append(out, "delete:"+m.PolicyName)
		default:
			out = append(out, m.Type)
		}
	}
	return out
}

func policyNames(ps []feedv1.Policy) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// wantNames is the sorted names of the policies the store says apply to id.
func (f *fixture) wantNames(id policy.Identity) []string {
	f.t.Helper()
	set, err := f.st.PolicySet(id)
	if err != nil {
		f.t.Fatal(err)
	}
	out := []string{}
	for _, p := range set.Policies {
		out = append(out, p.Name)
	}
	return out
}

// wantDigest is the store's policy-set version for id.
func (f *fixture) wantDigest(id policy.Identity) string {
	f.t.Helper()
	set, err := f.st.PolicySet(id)
	if err != nil {
		f.t.Fatal(err)
	}
	return set.Version
}

// handshake sends a raw WebSocket handshake request (to check refusals
// without a WebSocket client in the way) and returns status, headers and
// body.
func (f *fixture) handshake(t *testing.T, method, query string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	u := f.srv.URL + feedv1.Path
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString(key))
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := f.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("%s %s was upgraded, want a refusal", method, u)
	}
	return resp.StatusCode, resp.Header, body
}

// envelopeCode returns the error envelope's code, failing the test if the
// body is not one.
func envelopeCode(t testing.TB, body []byte) string {
	t.Helper()
	code, _ := envelope(t, body)
	return code
}

// envelope is the code and the reason of the error envelope body.
func envelope(t testing.TB, body []byte) (code, reason string) {
	t.Helper()
	var env struct {
		Error struct{ Code, Message, Reason string } `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Error.Code == "" || env.Error.Message == "" {
		t.Fatalf("body %q is not an error envelope", body)
	}
	return env.Error.Code, env.Error.Reason
}
