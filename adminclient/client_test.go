package adminclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeNode answers every request with status and body, and counts them.
type fakeNode struct {
	url  string
	hits atomic.Int32
}

func startNode(t *testing.T, status int, body string) *fakeNode {
	t.Helper()
	n := &fakeNode{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.hits.Add(1)
		if got := r.Header.Get("Authorization"); got != "Bearer tok" {
			http.Error(w, `{"error":{"code":"unauthorized","message":"no token"}}`, http.StatusUnauthorized)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	n.url = srv.URL
	return n
}

// downNode is a URL nothing listens on.
func downNode(t *testing.T) *fakeNode {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	return &fakeNode{url: srv.URL}
}

const (
	okBody      = `{"node_id":"n2"}`
	unavailable = `{"error":{"code":"unavailable","message":"no leader"}}`
	notFound    = `{"error":{"code":"not_found","message":"policy \"x\" not found"}}`
	conflict    = `{"error":{"code":"conflict","message":"revision 3, not 2"}}`
	internal    = `{"error":{"code":"internal","message":"boom"}}`
)

// TestFailover: connection errors and 503 move on to the next server;
// other answers are final, and a write is replayed only when it surely
// never reached a server.
func TestFailover(t *testing.T) {
	tests := []struct {
		name    string
		nodes   func(t *testing.T) []*fakeNode
		method  string
		wantErr error // nil: success
		hits    []int32
		code    string
	}{
		{"first down, read", func(t *testing.T) []*fakeNode { return []*fakeNode{downNode(t), startNode(t, 200, okBody)} }, http.MethodGet, nil, []int32{0, 1}, ""},
		{"first down, write", func(t *testing.T) []*fakeNode { return []*fakeNode{downNode(t), startNode(t, 200, okBody)} }, http.MethodPut, nil, []int32{0, 1}, ""},
		{"first 503", func(t *testing.T) []*fakeNode {
			return []*fakeNode{startNode(t, 503, unavailable), startNode(t, 200, okBody)}
		}, http.MethodPut, nil, []int32{1, 1}, ""},
		{"404 is final", func(t *testing.T) []*fakeNode {
			return []*fakeNode{startNode(t, 404, notFound), startNode(t, 200, okBody)}
		}, http.MethodGet, ErrNotFound, []int32{1, 0}, "not_found"},
		{"409 is final", func(t *testing.T) []*fakeNode {
			return []*fakeNode{startNode(t, 409, conflict), startNode(t, 200, okBody)}
		}, http.MethodPut, ErrConflict, []int32{1, 0}, "conflict"},
		{"500 is final", func(t *testing.T) []*fakeNode {
			return []*fakeNode{startNode(t, 500, internal), startNode(t, 200, okBody)}
		}, http.MethodGet, nil, []int32{1, 0}, "internal"},
		{"all down", func(t *testing.T) []*fakeNode { return []*fakeNode{downNode(t), downNode(t)} }, http.MethodGet, ErrUnavailable, []int32{0, 0}, ""},
		{"only 503", func(t *testing.T) []*fakeNode { return []*fakeNode{startNode(t, 503, unavailable)} }, http.MethodGet, ErrUnavailable, []int32{1}, "unavailable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := tc.nodes(t)
			var urls []string
			for _, n := range nodes {
				urls = append(urls, n.url)
			}
			c, err := New(Config{Servers: urls, Token: "tok"})
			if err != nil {
				t.Fatal(err)
			}
			var body []byte
			if tc.method != http.MethodGet {
				body = []byte(`{}`)
			}
			var out map[string]any
			err = c.Do(context.Background(), tc.method, "/v1/x", nil, body, &out)
			var hits []int32
			for _, n := range nodes {
				hits = append(hits, n.hits.Load())
			}
			if diff := cmp.Diff(tc.hits, hits); diff != "" {
				t.Errorf("requests per server (-want +got):\n%s", diff)
			}
			switch {
			case tc.code == "" && tc.wantErr == nil:
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				if out["node_id"] != "n2" {
					t.Fatalf("answer %v", out)
				}
				return
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("error %v is not %v", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q spans lines", err)
			}
			var ae *Error
			if tc.code != "" && (!errors.As(err, &ae) || ae.Code != tc.code) {
				t.Errorf("error %#v, want code %q", err, tc.code)
			}
		})
	}
}

// TestStickyServer: after a failover the client starts at the server that
// answered, so a dead first server costs one refused dial, not one per call.
func TestStickyServer(t *testing.T) {
	up := startNode(t, 200, okBody)
	c, err := New(Config{Servers: []string{downNode(t).url, up.url}, Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.Cluster(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := up.hits.Load(); got != 3 {
		t.Fatalf("live server got %d requests, want 3", got)
	}
}

// TestErrorEnvelope: the status, code and message of the envelope, and a
// body that is not one (a proxy's page) as the message.
func TestErrorEnvelope(t *testing.T) {
	tests := []struct {
		name, body string
		status     int
		want       Error
		is         error
	}{
		{"envelope", notFound, 404, Error{Status: 404, Code: "not_found", Message: `policy "x" not found`}, ErrNotFound},
		{"forbidden", `{"error":{"code":"forbidden","message":"read token"}}`, 403, Error{Status: 403, Code: "forbidden", Message: "read token"}, ErrForbidden},
		{"bad request", `{"error":{"code":"invalid","message":"spec.action"}}`, 400, Error{Status: 400, Code: "invalid", Message: "spec.action"}, ErrInvalid},
		{"not an envelope", "<html>bad gateway</html>", 502, Error{Status: 502, Code: "unknown", Message: "<html>bad gateway</html>"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, tc.status, tc.body)
			c, err := New(Config{Servers: []string{n.url}, Token: "tok"})
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Policy(context.Background(), "x")
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an *Error", err)
			}
			tc.want.Server = n.url
			if diff := cmp.Diff(tc.want, *ae); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) is false", err, tc.is)
			}
		})
	}
	n := startNode(t, 200, okBody)
	c, err := New(Config{Servers: []string{n.url}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cluster(context.Background()); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("no token: %v, want ErrUnauthorized", err)
	}
}

// TestNewChecksServers: a server that is not an http(s) URL is refused at
// New, before any request.
func TestNewChecksServers(t *testing.T) {
	for _, servers := range [][]string{nil, {""}, {"127.0.0.1:8080"}, {"ftp://x"}, {"http://a", "http//b"}} {
		if _, err := New(Config{Servers: servers}); err == nil {
			t.Errorf("New(%q) accepted", servers)
		}
	}
	c, err := New(Config{Servers: []string{" http://a/ ", "https://b:8443"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://a", "https://b:8443"}, c.Servers()); diff != "" {
		t.Errorf("servers (-want +got):\n%s", diff)
	}
}

// TestClientsPageQuery: ClientsPage sends the fields set, and only those,
// and decodes the page's totals.
func TestClientsPageQuery(t *testing.T) {
	const page = `{"clients":[],"total":7,"counts":{"pending":1,"acked":5,"nacked":1,"stale":2},"offset":40,"limit":20}`
	tests := []struct {
		name string
		f    ClientFilter
		want string
	}{
		{"zero filter", ClientFilter{}, ""},
		{"every field", ClientFilter{Node: "n1", Org: "acme", Team: "a b", Employee: "e", State: "stale", StaleAfter: 90 * time.Second, Limit: 20, Offset: 40},
			"employee=e&limit=20&node=n1&offset=40&org=acme&stale_after=1m30s&state=stale&team=a+b"},
		{"paging only", ClientFilter{Limit: 50}, "limit=50"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got atomic.Value
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got.Store(r.URL.Path + "?" + r.URL.RawQuery)
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, page)
			}))
			t.Cleanup(srv.Close)
			c, err := New(Config{Servers: []string{srv.URL}, Token: "tok"})
			if err != nil {
				t.Fatal(err)
			}
			list, err := c.ClientsPage(context.Background(), tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff("/v1/clients?"+tc.want, got.Load()); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			off, lim := 40, 20
			want := &ClientList{Clients: []ClientInfo{}, Total: 7, Counts: ClientCounts{Pending: 1, Acked: 5, Nacked: 1, Stale: 2}, Offset: &off, Limit: &lim}
			if diff := cmp.Diff(want, list); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}
