package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/poll"
)

// fakeFeed is a minimal WebSocket feed: each accepted connection is handed
// to the test, which scripts what the server sends.
type fakeFeed struct {
	srv   *httptest.Server
	conns chan *feedConn

	mu       sync.Mutex
	requests []feedRequest
	// reject, when non-zero, answers the next rejectN handshakes (or all,
	// with rejectN 0) with this status and an error envelope.
	reject  int
	rejectN int
	// rejectReason, when set, is the rejections' envelope reason.
	rejectReason string
}

type feedRequest struct {
	query url.Values
	auth  string
}

type feedConn struct {
	c     *websocket.Conn
	query url.Values
}

func newFeed(t *testing.T) *fakeFeed {
	t.Helper()
	f := &fakeFeed{conns: make(chan *feedConn, 16)}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.srv.Close()
		for {
			select {
			case fc := <-f.conns:
				_ = fc.c.CloseNow()
			default:
				return
			}
		}
	})
	return f
}

func (f *fakeFeed) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeFeed) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != feedv1.Path {
		http.NotFound(w, r)
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, feedRequest{query: r.URL.Query(), auth: r.Header.Get("Authorization")})
	reject, reason := f.reject, f.rejectReason
	if reject != 0 && f.rejectN > 0 {
		f.rejectN--
		if f.rejectN == 0 {
			f.reject = 0
		}
	}
	f.mu.Unlock()
	if reject != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(reject)
		if reason != "" {
			fmt.Fprintf(w, `{"error":{"code":"unauthorized","message":"employee \"alice\": unknown employee","reason":%q}}`, reason)
			return
		}
		fmt.Fprintf(w, `{"error":{"code":"refused","message":"employee alice is inactive"}}`)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	f.conns <- &feedConn{c: c, query: r.URL.Query()}
}

func (f *fakeFeed) reqs() []feedRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]feedRequest(nil), f.requests...)
}

// next waits for the next accepted connection; it is closed when the test
// ends.
func (f *fakeFeed) next(t *testing.T) *feedConn {
	t.Helper()
	select {
	case fc := <-f.conns:
		t.Cleanup(func() { _ = fc.c.CloseNow() })
		return fc
	case <-time.After(10 * time.Second):
		t.Fatal("no feed connection")
		return nil
	}
}

func (fc *feedConn) send(t *testing.T, msg any) {
	t.Helper()
	b, err := json.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := fc.c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("feed write: %v", err)
	}
}

func (fc *feedConn) read(t *testing.T) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, b, err := fc.c.Read(ctx)
	if err != nil {
		t.Fatalf("feed read: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("feed read %q: %v", b, err)
	}
	return m
}

func feedPolicy(name, tool, action, reason string, patterns ...string) feedv1.Policy {
	p := tp(name, tool, action, reason, patterns...)
	return feedv1.Policy{Name: p.Name, Kind: p.Kind, Spec: p.Spec, Revision: 1, Scope: feedv1.Scope{Org: "acme"}}
}

func names(ps []Policy) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// TestWSMessages: init, upsert and delete change the set; ping is answered
// with pong at once; unknown message types and fields are ignored; the
// employee is named with ?employee= when there is no token.
func TestWSMessages(t *testing.T) {
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Employee: "alice"})
	fc := ff.next(t)
	if got := fc.query.Get("employee"); got != "alice" {
		t.Fatalf("employee = %q", got)
	}
	if fc.query.Has("since") {
		t.Fatal("first connection sent since")
	}
	fc.send(t, map[string]any{"type": "init", "version": 10, "digest": "d10", "future_field": true,
		"policies": []any{feedPolicy("b", "Bash", "deny", "b"), feedPolicy("a", "Write", "audit", "")}})
	r.waitState(t, StateReady)
	if diff := cmp.Diff([]string{"a", "b"}, names(r.Policies())); diff != "" {
		t.Fatalf("after init (-want +got):\n%s", diff)
	}
	fc.send(t, map[string]any{"type": "ping"})
	if m := fc.read(t); m["type"] != "pong" {
		t.Fatalf("answer to ping: %v", m)
	}
	fc.send(t, map[string]any{"type": "surprise", "version": 99, "policy_name": "b"})
	fc.send(t, map[string]any{"type": "upsert", "version": 11, "digest": "d11", "policy": feedPolicy("c", "Read", "deny", "c")})
	fc.send(t, map[string]any{"type": "delete", "version": 12, "digest": "d12", "policy_name": "b"})
	fc.send(t, map[string]any{"type": "upsert", "version": 12, "digest": "stale", "policy": feedPolicy("z", "Read", "deny", "z")})
	fc.send(t, map[string]any{"type": "ping"})
	if m := fc.read(t); m["type"] != "pong" {
		t.Fatalf("answer to ping: %v", m)
	}
	if diff := cmp.Diff([]string{"a", "c"}, names(r.Policies())); diff != "" {
		t.Fatalf("after upsert and delete (-want +got):\n%s", diff)
	}
	if got := r.Version(); got != "d12" {
		t.Fatalf("version %q, want d12", got)
	}
	type upd struct {
		Version string
		Index   uint64
		Full    bool
		Names   []string
	}
	var got []upd
	for _, u := range r.rec.allUpdates() {
		got = append(got, upd{u.Version, u.Index, u.Full, names(u.Policies)})
	}
	want := []upd{{"d10", 10, true, []string{"a", "b"}}, {"d11", 11, false, []string{"a", "b", "c"}}, {"d12", 12, false, []string{"a", "c"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("updates (-want +got):\n%s", diff)
	}
	if r.State() != StateReady {
		t.Fatalf("state %s after an unknown message", r.State())
	}
}

// TestWSReconnectWithSince: after the connection closes (1001, 4429, 4408),
// the client reconnects with since = the last index received, is ready at
// once with its cached set, and applies the replay.
func TestWSReconnectWithSince(t *testing.T) {
	for _, code := range []websocket.StatusCode{websocket.StatusGoingAway, feedv1.CloseSlowConsumer, feedv1.ClosePongTimeout} {
		t.Run(fmt.Sprint(int(code)), func(t *testing.T) {
			ff := newFeed(t)
			r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Token: "jwt-1"})
			fc := ff.next(t)
			fc.send(t, map[string]any{"type": "init", "version": 10, "digest": "d10", "policies": []any{feedPolicy("a", "Bash", "deny", "a")}})
			fc.send(t, map[string]any{"type": "upsert", "version": 14, "digest": "d14", "policy": feedPolicy("b", "Bash", "deny", "b")})
			poll.Eventually(t, "the upsert", func() error {
				if r.Version() != "d14" {
					return errors.New("not applied")
				}
				return nil
			})

			_ = fc.c.Close(code, "bye")
			fc2 := ff.next(t)
			if got := fc2.query.Get("since"); got != "14" {
				t.Fatalf("since = %q, want 14", got)
			}
			r.waitState(t, StateReady)
			fc2.send(t, map[string]any{"type": "delete", "version": 15, "digest": "d15", "policy_name": "a"})
			poll.Eventually(t, "the replayed delete", func() error {
				if got := names(r.Policies()); len(got) != 1 || got[0] != "b" {
					return fmt.Errorf("policies %v", got)
				}
				return nil
			})

			if diff := cmp.Diff([]string{"connecting->ready", "ready->disconnected", "disconnected->ready"}, r.rec.transitions()); diff != "" {
				t.Fatalf("transitions (-want +got):\n%s", diff)
			}
			if st := r.Stats(); st.FullSyncs != 1 || st.Deltas != 2 {
				t.Fatalf("stats %+v", st)
			}
			for _, req := range ff.reqs() {
				if req.auth != "Bearer jwt-1" || req.query.Has("employee") {
					t.Fatalf("request %+v: want the token, and no employee", req)
				}
			}
		})
	}
}

// TestWSFailover: when the first node goes away the client moves to the
// second, with since.
func TestWSFailover(t *testing.T) {
	fa, fb := newFeed(t), newFeed(t)
	r := runClient(t, Config{Servers: []string{fa.addr(), "http://" + fb.addr()}, Transport: TransportWS, Employee: "alice"})
	fc := fa.next(t)
	fc.send(t, map[string]any{"type": "init", "version": 7, "digest": "d7", "policies": []any{}})
	r.waitState(t, StateReady)
	_ = fc.c.Close(websocket.StatusGoingAway, "shutting down")
	fa.srv.Close()
	fc2 := fb.next(t)
	if got := fc2.query.Get("since"); got != "7" {
		t.Fatalf("since = %q on the second node", got)
	}
	r.waitState(t, StateReady)
}

// TestWSRevocation: a revoke message, close code 4403, and 401/403 at the
// handshake all revoke: block all, Run returns ErrRevoked, no reconnect.
func TestWSRevocation(t *testing.T) {
	tests := []struct {
		name    string
		reject  int
		script  func(t *testing.T, fc *feedConn)
		mention string
	}{
		{"revoke message", 0, func(t *testing.T, fc *feedConn) {
			fc.send(t, map[string]any{"type": "revoke", "reason": "employee deactivated"})
		}, "employee deactivated"},
		{"close 4403", 0, func(_ *testing.T, fc *feedConn) {
			_ = fc.c.Close(feedv1.CloseRevoked, "employee deleted")
		}, "employee deleted"},
		{"401 at handshake", http.StatusUnauthorized, nil, "employee alice is inactive"},
		{"403 at handshake", http.StatusForbidden, nil, "HTTP 403"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ff := newFeed(t)
			ff.reject = tc.reject
			r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Token: "t"})
			if tc.script != nil {
				fc := ff.next(t)
				fc.send(t, map[string]any{"type": "init", "version": 1, "digest": "d1", "policies": []any{}})
				r.waitState(t, StateReady)
				tc.script(t, fc)
			}
			mustRevoked(t, r.wait(t), tc.mention)
			if !r.ShouldBlockAll() || r.State() != StateRevoked {
				t.Fatalf("state %s, block all %v", r.State(), r.ShouldBlockAll())
			}
			if got := len(ff.reqs()); got != 1 {
				t.Fatalf("%d handshakes: reconnected after revocation", got)
			}
		})
	}
}

// TestWSOtherHandshakeFailuresRetry: a 503 at the handshake is retried, and
// with RetryUnauthorized so is a 401.
func TestWSOtherHandshakeFailuresRetry(t *testing.T) {
	for _, tc := range []struct {
		status int
		retry  bool
	}{{http.StatusServiceUnavailable, false}, {http.StatusUnauthorized, true}} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			ff := newFeed(t)
			ff.reject, ff.rejectN = tc.status, 2
			r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Employee: "alice", RetryUnauthorized: tc.retry})
			fc := ff.next(t)
			fc.send(t, map[string]any{"type": "init", "version": 1, "digest": "d1", "policies": []any{}})
			r.waitState(t, StateReady)
			if got := len(ff.reqs()); got != 3 {
				t.Fatalf("%d handshakes, want 2 refused and 1 accepted", got)
			}
		})
	}
}

// TestWSRejectedMessageKeepsSet: a message whose result the SDK refuses (a
// bad pattern) is skipped: the previous set stays, the resume index moves
// past it.
func TestWSRejectedMessageKeepsSet(t *testing.T) {
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Employee: "alice"})
	fc := ff.next(t)
	fc.send(t, map[string]any{"type": "init", "version": 5, "digest": "d5", "policies": []any{feedPolicy("a", "Bash", "deny", "a")}})
	fc.send(t, map[string]any{"type": "upsert", "version": 6, "digest": "d6", "policy": feedPolicy("b", "Bash", "deny", "", "(")})
	poll.Eventually(t, "the rejection", func() error {
		if r.Stats().Rejected != 1 {
			return errors.New("not rejected yet")
		}
		return nil
	})

	if r.Version() != "d5" || len(r.Policies()) != 1 {
		t.Fatalf("version %s, policies %v: the previous set is not in force", r.Version(), names(r.Policies()))
	}
	_ = fc.c.Close(websocket.StatusGoingAway, "bye")
	if got := ff.next(t).query.Get("since"); got != "6" {
		t.Fatalf("since = %q, want 6", got)
	}
}

// TestWSPongTimeout: a server that stops answering WebSocket pings is given
// up and the client reconnects.
func TestWSPongTimeout(t *testing.T) {
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Employee: "alice", HealthInterval: 200 * time.Millisecond})
	fc := ff.next(t) // never read: pings are not answered
	fc.send(t, map[string]any{"type": "init", "version": 5, "digest": "d5", "policies": []any{}})
	if got := ff.next(t).query.Get("since"); got != "5" {
		t.Fatalf("since = %q", got)
	}
	if got := r.rec.transitions(); len(got) < 2 || got[1] != "ready->disconnected" {
		t.Fatalf("transitions %v", got)
	}
}

// TestWSMessageLimitAndReadBuffer: a message over MaxMessageBytes ends the
// connection (the client reconnects with since and keeps its set), and the
// set in force owns its bytes: the session's read buffer, reused for every
// message, is overwritten by later ones without changing a held spec.
func TestWSMessageLimitAndReadBuffer(t *testing.T) {
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Employee: "alice", MaxMessageBytes: 4096})
	fc := ff.next(t)
	a := feedPolicy("a", "Bash", "deny", strings.Repeat("a", 300))
	fc.send(t, map[string]any{"type": "init", "version": 10, "digest": "d10", "policies": []any{a}})
	fc.send(t, map[string]any{"type": "upsert", "version": 11, "digest": "d11", "policy": feedPolicy("b", "Read", "deny", strings.Repeat("z", 200))})
	fc.send(t, map[string]any{"type": "upsert", "version": 12, "digest": "d12", "policy": feedPolicy("c", "Read", "deny", strings.Repeat("y", 5000))})
	fc2 := ff.next(t)
	if got := fc2.query.Get("since"); got != "11" {
		t.Fatalf("since = %q after the oversize message, want 11", got)
	}
	r.waitState(t, StateReady)
	if diff := cmp.Diff([]string{"a", "b"}, names(r.Policies())); diff != "" {
		t.Fatalf("set after the oversize message (-want +got):\n%s", diff)
	}
	if got := r.Policies()[0].Spec; string(got) != string(a.Spec) {
		t.Fatalf("held spec of a changed by later reads:\n got %s\nwant %s", got, a.Spec)
	}
	if reason, blocked := r.IsBlocked("Bash", nil); !blocked || reason != strings.Repeat("a", 300) {
		t.Fatalf("IsBlocked(Bash) = (%.20q, %v), want a's reason", reason, blocked)
	}
}

// TestReadMessageBuffer: a session reads every message into one buffer,
// and lets go of one a message larger than maxKeptReadBuffer grew, while
// what it returned for that message stays whole.
func TestReadMessageBuffer(t *testing.T) {
	ff := newFeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+ff.addr()+feedv1.Path, nil) //nolint:bodyclose // Dial owns the body
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.CloseNow() })
	conn.SetReadLimit(1 << 20)
	fc := ff.next(t)
	var buf bytes.Buffer
	var kept *byte // the array of the buffer kept between messages
	tests := []struct {
		name    string
		size    int
		reuse   bool // read into the array kept from the message before
		keepBuf bool // the buffer is kept for the next message
	}{
		{name: "first small", size: 300, keepBuf: true},
		{name: "second small reuses it", size: 200, reuse: true, keepBuf: true},
		{name: "large is let go", size: maxKeptReadBuffer + 1, keepBuf: false},
		{name: "small after large", size: 100, keepBuf: true},
		{name: "and is reused again", size: 100, reuse: true, keepBuf: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg := bytes.Repeat([]byte{'a' + byte(i)}, tc.size)
			if err := fc.c.Write(ctx, websocket.MessageText, msg); err != nil {
				t.Fatal(err)
			}
			typ, data, err := readMessage(conn, &buf)
			if err != nil || typ != websocket.MessageText {
				t.Fatalf("readMessage: type %v, err %v", typ, err)
			}
			if !bytes.Equal(data, msg) {
				t.Fatalf("read %d bytes %.10q…, want %d of %q", len(data), data, len(msg), msg[0])
			}
			if got := kept != nil && &data[0] == kept; got != tc.reuse {
				t.Errorf("read into the kept array: %v, want %v", got, tc.reuse)
			}
			if got := buf.Cap() > 0; got != tc.keepBuf {
				t.Errorf("buffer kept (cap %d): %v, want %v", buf.Cap(), got, tc.keepBuf)
			}
			kept = nil
			if buf.Cap() > 0 {
				kept = &buf.Bytes()[:1][0]
			}
		})
	}
}

// TestWSDeclaresCapabilities: the handshake declares "rollouts,shadow" with
// ?capabilities=, on the first connect and on a resume.
func TestWSDeclaresCapabilities(t *testing.T) {
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Token: "jwt-1"})
	fc := ff.next(t)
	fc.send(t, map[string]any{"type": "init", "version": 10, "digest": "d10", "policies": []any{feedPolicy("a", "Bash", "deny", "a")}})
	r.waitState(t, StateReady)
	_ = fc.c.Close(websocket.StatusGoingAway, "bye")
	fc2 := ff.next(t)
	if got := fc2.query.Get("since"); got != "10" {
		t.Fatalf("since = %q, want 10", got)
	}
	for i, req := range ff.reqs() {
		if got := req.query[feedv1.QueryCapabilities]; !slices.Equal(got, []string{"rollouts,shadow"}) {
			t.Errorf("handshake %d: capabilities %q, want [rollouts,shadow]", i, got)
		}
	}
}
