package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
)

const (
	feedE2ESecret = "feed-e2e-secret-that-is-longer-than-32-bytes"
	feedE2EIssuer = "policyd-feed-e2e"
)

// feedE2EJWT configures auth.mode jwt with an HS256 secret file, the way an
// operator does.
func feedE2EJWT(t *testing.T) func(*config.Config) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "feed-jwt.secret")
	if err := os.WriteFile(path, []byte(feedE2ESecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(cfg *config.Config) {
		cfg.Auth.Mode = "jwt"
		cfg.Auth.JWT.HMACSecretFile = path
		cfg.Auth.JWT.Issuer = feedE2EIssuer
	}
}

func feedE2EToken(t *testing.T, id policy.Identity) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": id.Employee, "org": id.Org, "team": id.Team, "iss": feedE2EIssuer,
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte(feedE2ESecret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// feedE2EClient is a feed connection to one node. A goroutine reads every
// message, with the time it arrived, and answers pings.
type feedE2EClient struct {
	t    *testing.T
	node string
	ws   *websocket.Conn
	msgs chan feedE2EMsg
	stop chan struct{} // closed by the test's cleanup: the reader stops waiting for room in msgs
	done chan struct{} // closed when the reader ends; err and endedAt set then
	err  error
	// endedAt is when the connection ended.
	endedAt time.Time
}

type feedE2EMsg struct {
	feedv1.Message
	at time.Time
}

// feedE2EDial connects to n's feed with token; a refused handshake returns
// its status instead.
func feedE2EDial(t *testing.T, n *Node, token string) (*feedE2EClient, int) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws://"+n.HTTPAddr()+feedv1.Path, &websocket.DialOptions{ //nolint:bodyclose // Dial owns the response body
		HTTPClient: hc,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
	})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", n.ID(), err)
		}
		return nil, resp.StatusCode
	}
	c := &feedE2EClient{t: t, node: n.ID(), ws: ws, msgs: make(chan feedE2EMsg, 1024), stop: make(chan struct{}), done: make(chan struct{})}
	go c.read()
	t.Cleanup(func() {
		close(c.stop)
		_ = ws.CloseNow()
		<-c.done
	})
	return c, http.StatusSwitchingProtocols
}

func (c *feedE2EClient) read() {
	defer close(c.done)
	for {
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.err, c.endedAt = err, time.Now()
			return
		}
		var m feedv1.Message
		if err := json.Unmarshal(data, &m); err != nil {
			c.err, c.endedAt = fmt.Errorf("undecodable message %q: %w", data, err), time.Now()
			return
		}
		if m.Type == feedv1.TypePing {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = c.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"pong"}`))
			cancel()
			continue
		}
		select {
		case c.msgs <- feedE2EMsg{Message: m, at: time.Now()}:
		case <-c.stop:
			// A test that failed before reading everything must not
			// hang in its cleanup.
			c.err, c.endedAt = errors.New("test ended"), time.Now()
			return
		}
	}
}

// next returns the next message, failing the test if none comes soon.
func (c *feedE2EClient) next() feedE2EMsg {
	c.t.Helper()
	select {
	case m := <-c.msgs:
		return m
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s: no message (connection ended: %v)", c.node, c.err)
		return feedE2EMsg{}
	}
}

// nextOf returns the next message, failing unless it has type typ.
func (c *feedE2EClient) nextOf(typ string) feedE2EMsg {
	c.t.Helper()
	m := c.next()
	if m.Type != typ {
		c.t.Fatalf("%s: got %s %+v, want %s", c.node, m.Type, m.Message, typ)
	}
	return m
}

// TestFeedE2EClusterDeliveryAndRevocation runs the feed on a real 3-node
// cluster in JWT mode: connections on the leader and on both followers
// receive a write made through any node, scoped to their identity, with
// the same version and digest everywhere; deactivating the employee
// revokes its connections on every node within a second of the write's
// response, and it cannot reconnect anywhere.
func TestFeedE2EClusterDeliveryAndRevocation(t *testing.T) {
	c := newCluster(t, 3, feedE2EJWT(t))
	leader := c.leader()
	var followers []*Node
	for _, n := range c.running() {
		if n != leader {
			followers = append(followers, n)
		}
	}
	alice := policy.Identity{Org: "acme", Team: "red", Employee: "alice"}
	carol := policy.Identity{Org: "other", Team: "red", Employee: "carol"}
	a := apiFor(t, followers[0])
	for _, e := range []policy.Identity{alice, carol} {
		body := fmt.Sprintf(`{"id":%q,"org":%q,"team":%q,"status":"active"}`, e.Employee, e.Org, e.Team)
		if r := a.do(http.MethodPut, "/v1/employees/"+e.Employee, []byte(body), nil); r.status != http.StatusOK {
			t.Fatalf("PUT employee %s: %d %s", e.Employee, r.status, r.body)
		}
	}
	c.waitConverged()

	// Refused before the upgrade, on any node.
	if _, status := feedE2EDial(t, followers[1], "not-a-token"); status != http.StatusUnauthorized {
		t.Fatalf("bad token: status %d, want 401", status)
	}

	// alice on every node, carol (another org) on a follower.
	var alices []*feedE2EClient
	for _, n := range c.running() {
		cl, status := feedE2EDial(t, n, feedE2EToken(t, alice))
		if cl == nil {
			t.Fatalf("%s refused alice: %d", n.ID(), status)
		}
		cl.nextOf(feedv1.TypeInit)
		alices = append(alices, cl)
	}
	carolConn, status := feedE2EDial(t, followers[1], feedE2EToken(t, carol))
	if carolConn == nil {
		t.Fatalf("carol refused: %d", status)
	}
	carolConn.nextOf(feedv1.TypeInit)

	// A write through a follower reaches every node's connections.
	apiFor(t, followers[1]).putPolicy("acme.deny-shell", "acme", "no shell")
	var first feedE2EMsg
	for i, cl := range alices {
		m := cl.nextOf(feedv1.TypeUpsert)
		if m.Policy.Name != "acme.deny-shell" {
			t.Fatalf("%s: upsert of %s", cl.node, m.Policy.Name)
		}
		if i == 0 {
			first = m
		} else if m.Version != first.Version || m.Digest != first.Digest {
			t.Errorf("%s: version %d digest %.8s, %s had %d %.8s", cl.node, m.Version, m.Digest, alices[0].node, first.Version, first.Digest)
		}
	}
	// carol hears nothing of acme's policy: her next message is the global one.
	apiFor(t, leader).do(http.MethodPut, "/v1/policies/all.audit-write", []byte(
		`{"kind":"ToolPolicy","spec":{"tool_name":"Write","action":"audit"}}`), nil)
	if m := carolConn.nextOf(feedv1.TypeUpsert); m.Policy.Name != "all.audit-write" {
		t.Fatalf("carol got %s before the global policy", m.Policy.Name)
	}
	for _, cl := range alices {
		cl.nextOf(feedv1.TypeUpsert)
	}

	// Deactivation, written through the other follower, revokes everywhere.
	r := apiFor(t, followers[1]).do(http.MethodPut, "/v1/employees/alice",
		[]byte(`{"id":"alice","org":"acme","team":"red","status":"inactive"}`), nil)
	acked := time.Now()
	if r.status != http.StatusOK {
		t.Fatalf("deactivate: %d %s", r.status, r.body)
	}
	for _, cl := range alices {
		m := cl.nextOf(feedv1.TypeRevoke)
		select {
		case <-cl.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still open after revoke", cl.node)
		}
		if code := websocket.CloseStatus(cl.err); code != feedv1.CloseRevoked {
			t.Errorf("%s: close %v, want %d", cl.node, cl.err, feedv1.CloseRevoked)
		}
		if d := cl.endedAt.Sub(acked); d > time.Second {
			t.Errorf("%s: revoked %v after the write was acknowledged, want under 1s", cl.node, d)
		}
		t.Logf("%s: revoke after %v, closed after %v", cl.node, m.at.Sub(acked).Round(time.Millisecond), cl.endedAt.Sub(acked).Round(time.Millisecond))
	}
	for _, n := range c.running() {
		if cl, status := feedE2EDial(t, n, feedE2EToken(t, alice)); cl != nil || status != http.StatusForbidden {
			t.Errorf("%s: revoked employee reconnect: status %d, want 403", n.ID(), status)
		}
	}
	// carol is unaffected.
	apiFor(t, leader).do(http.MethodPut, "/v1/policies/other.deny-curl", []byte(
		`{"kind":"ToolPolicy","scope":{"org":"other"},"spec":{"tool_name":"Bash","action":"deny","reason":"no curl"}}`), nil)
	if m := carolConn.nextOf(feedv1.TypeUpsert); m.Policy.Name != "other.deny-curl" {
		t.Fatalf("carol got %s", m.Policy.Name)
	}
}
