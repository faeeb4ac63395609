package adminapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/adminclient"
	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/server/proxystatus"
)

// fleet is five sidecars on two nodes, out of order. Two last answered a
// health check an hour ago, stale under the default stale_after; the rest
// just now. carol and erin share a node and an address, so only their
// connection times order them.
func fleet(now time.Time) []*clusterv1.ClientInfo {
	fresh, old := now.UnixNano(), now.Add(-time.Hour).UnixNano()
	at := func(m int) int64 { return now.Add(time.Duration(m-120) * time.Minute).UnixNano() }
	return []*clusterv1.ClientInfo{
		{NodeId: "n2", ClientAddress: "c3", Org: "acme", Team: "platform", Employee: "alice", State: proxystatus.Acked, ConnectedAtUnixNano: at(0), LastActiveUnixNano: fresh},
		{NodeId: "n1", ClientAddress: "c2", Org: "acme", Team: "platform", Employee: "bob", State: proxystatus.Pending, ConnectedAtUnixNano: at(1), LastActiveUnixNano: old},
		{NodeId: "n1", ClientAddress: "c1", Org: "acme", Team: "data", Employee: "erin", State: proxystatus.Acked, ConnectedAtUnixNano: at(5), LastActiveUnixNano: fresh},
		{NodeId: "n2", ClientAddress: "c1", Org: "globex", Team: "ops", Employee: "dave", State: proxystatus.Acked, ConnectedAtUnixNano: at(2), LastActiveUnixNano: old},
		{NodeId: "n1", ClientAddress: "c1", Org: "acme", Team: "data", Employee: "carol", State: proxystatus.Nacked, ConnectedAtUnixNano: at(3), LastActiveUnixNano: fresh},
	}
}

func intp(n int) *int { return &n }

// getClients serves target over f and decodes the answer, failing the test
// on anything but a 200.
func getClients(t *testing.T, f *fakeBackend, target string) ClientsView {
	t.Helper()
	w := serve(New(Config{}, discard(), f), newRequest(http.MethodGet, target, "", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", target, w.Code, w.Body)
	}
	if !strings.Contains(w.Body.String(), `"clients":[`) {
		t.Errorf("clients is not a list: %s", w.Body)
	}
	var v ClientsView
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %s: %v", w.Body, err)
	}
	return v
}

// employees names a page's sidecars by their employee, which the fleet
// keeps unique.
func employees(cs []ClientView) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.Employee)
	}
	return out
}

// TestListClientsFilters: each filter, paging and the counts. Counts
// ignore the state filter; total counts every filter but paging.
func TestListClientsFilters(t *testing.T) {
	all := ClientCounts{Pending: 1, Acked: 3, Nacked: 1, Stale: 2}
	sorted := []string{"carol", "erin", "bob", "dave", "alice"}
	tests := []struct {
		name, query   string
		want          []string
		total         int
		counts        ClientCounts
		offset, limit *int
	}{
		{name: "no parameter keeps the backend's order", want: []string{"alice", "bob", "erin", "dave", "carol"}, total: 5, counts: all},
		{name: "any parameter sorts", query: "limit=100", want: sorted, total: 5, counts: all, limit: intp(100)},
		{name: "node", query: "node=n1", want: []string{"carol", "erin", "bob"}, total: 3, counts: ClientCounts{Pending: 1, Acked: 1, Nacked: 1, Stale: 1}},
		{name: "unknown node", query: "node=n9", want: []string{}},
		{name: "org", query: "org=globex", want: []string{"dave"}, total: 1, counts: ClientCounts{Acked: 1, Stale: 1}},
		{name: "org and team", query: "org=acme&team=platform", want: []string{"bob", "alice"}, total: 2, counts: ClientCounts{Pending: 1, Acked: 1, Stale: 1}},
		{name: "team alone", query: "team=data", want: []string{"carol", "erin"}, total: 2, counts: ClientCounts{Acked: 1, Nacked: 1}},
		{name: "employee", query: "employee=alice", want: []string{"alice"}, total: 1, counts: ClientCounts{Acked: 1}},
		{name: "scope is exact", query: "org=acm", want: []string{}},
		{name: "pending", query: "state=pending", want: []string{"bob"}, total: 1, counts: all},
		{name: "acked", query: "state=acked", want: []string{"erin", "dave", "alice"}, total: 3, counts: all},
		{name: "nacked", query: "state=nacked", want: []string{"carol"}, total: 1, counts: all},
		{name: "stale is any state", query: "state=stale", want: []string{"bob", "dave"}, total: 2, counts: all},
		{name: "longer stale_after", query: "state=stale&stale_after=2h", want: []string{}, counts: ClientCounts{Pending: 1, Acked: 3, Nacked: 1}},
		{name: "shorter stale_after", query: "state=stale&stale_after=1ns", want: sorted, total: 5, counts: ClientCounts{Pending: 1, Acked: 3, Nacked: 1, Stale: 5}},
		{name: "node and state", query: "node=n1&state=acked", want: []string{"erin"}, total: 1, counts: ClientCounts{Pending: 1, Acked: 1, Nacked: 1, Stale: 1}},
		{name: "first page", query: "limit=2", want: []string{"carol", "erin"}, total: 5, counts: all, limit: intp(2)},
		{name: "second page", query: "limit=2&offset=2", want: []string{"bob", "dave"}, total: 5, counts: all, offset: intp(2), limit: intp(2)},
		{name: "last short page", query: "limit=2&offset=4", want: []string{"alice"}, total: 5, counts: all, offset: intp(4), limit: intp(2)},
		{name: "offset at the end", query: "offset=5", want: []string{}, total: 5, counts: all, offset: intp(5)},
		{name: "offset past the end", query: "offset=100&limit=10", want: []string{}, total: 5, counts: all, offset: intp(100), limit: intp(10)},
		{name: "offset zero is echoed", query: "offset=0", want: sorted, total: 5, counts: all, offset: intp(0)},
		{name: "limit zero: counts only", query: "limit=0", want: []string{}, total: 5, counts: all, limit: intp(0)},
		{name: "paging a filter", query: "state=acked&offset=1&limit=1", want: []string{"dave"}, total: 3, counts: all, offset: intp(1), limit: intp(1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.clients, f.unreachable = fleet(time.Now()), []string{"n3"}
			target := "/v1/clients"
			if tc.query != "" {
				target += "?" + tc.query
			}
			got := getClients(t, f, target)
			if diff := cmp.Diff(tc.want, employees(got.Clients)); diff != "" {
				t.Errorf("clients (-want +got):\n%s", diff)
			}
			gotRest := struct {
				Total         int
				Counts        ClientCounts
				Offset, Limit *int
				Unreachable   []string
			}{got.Total, got.Counts, got.Offset, got.Limit, got.Unreachable}
			wantRest := gotRest
			wantRest.Total, wantRest.Counts, wantRest.Offset, wantRest.Limit, wantRest.Unreachable = tc.total, tc.counts, tc.offset, tc.limit, []string{"n3"}
			if diff := cmp.Diff(wantRest, gotRest); diff != "" {
				t.Errorf("total, counts, paging (-want +got):\n%s", diff)
			}
		})
	}
}

// TestListClientsPageFields: a page's sidecars carry every field, as the
// unfiltered list has them.
func TestListClientsPageFields(t *testing.T) {
	f := newFake(t)
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	f.clients = []*clusterv1.ClientInfo{{
		NodeId: "n1", ClientAddress: "c1", Transport: "ws", Org: "acme", Team: "t", Employee: "e",
		VersionSent: "v2", State: proxystatus.Nacked, VersionAcked: "v1", NackMessage: "bad", NackVersion: "v1",
		ConnectedAtUnixNano: now.UnixNano(), LastActiveUnixNano: now.Add(time.Second).UnixNano(), PeerAddr: "10.0.0.1:5",
	}}
	want := ClientView{
		Node: "n1", ClientAddress: "c1", Transport: "ws", Org: "acme", Team: "t", Employee: "e",
		Version: "v2", State: proxystatus.Nacked, AckedVersion: "v1", NackMessage: "bad", NackVersion: "v1",
		ConnectedAt: now, LastActive: now.Add(time.Second), PeerAddr: "10.0.0.1:5",
	}
	for _, target := range []string{"/v1/clients", "/v1/clients?state=nacked&limit=1"} {
		if diff := cmp.Diff([]ClientView{want}, getClients(t, f, target).Clients); diff != "" {
			t.Errorf("%s (-want +got):\n%s", target, diff)
		}
	}
}

// TestListClientsBadParameters: every malformed parameter is a 400 naming
// it, before the backend is asked.
func TestListClientsBadParameters(t *testing.T) {
	tests := []struct{ query, mention string }{
		{"node=", "node"},
		{"org=", "org"},
		{"team=", "team"},
		{"employee=", "employee"},
		{"node=n1&node=n2", "node"},
		{"state=", "state"},
		{"state=bogus", "bogus"},
		{"state=Acked", "Acked"},
		{"state=acked&state=nacked", "state"},
		{"stale_after=", "stale_after"},
		{"stale_after=30", "stale_after"},
		{"stale_after=0s", "stale_after"},
		{"stale_after=-1s", "stale_after"},
		{"stale_after=24h0m1s", "stale_after"},
		{"limit=", "limit"},
		{"limit=-1", "limit"},
		{"limit=x", "limit"},
		{"limit=1.5", "limit"},
		{"limit=10001", "limit"},
		{"limit=99999999999999999999", "limit"},
		{"offset=-1", "offset"},
		{"offset=x", "offset"},
		{"offset=1&offset=2", "offset"},
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			f := newFake(t)
			f.clients = fleet(time.Now())
			f.panicIn("Clients")
			w := serve(New(Config{}, discard(), f), newRequest(http.MethodGet, "/v1/clients?"+tc.query, "", nil))
			if w.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", w.Code, w.Body)
			}
			checkEnvelope(t, w, "invalid", tc.mention)
		})
	}
	t.Run("bounds are accepted", func(t *testing.T) {
		f := newFake(t)
		f.clients = fleet(time.Now())
		got := getClients(t, f, "/v1/clients?limit=10000&stale_after=24h")
		if got.Total != 5 || len(got.Clients) != 5 {
			t.Errorf("total %d, %d clients; want 5 and 5", got.Total, len(got.Clients))
		}
	})
}

// manyClients is a fleet of n sidecars over four nodes, a quarter stale.
func manyClients(n int, now time.Time) []*clusterv1.ClientInfo {
	states := []string{proxystatus.Pending, proxystatus.Acked, proxystatus.Acked, proxystatus.Nacked}
	out := make([]*clusterv1.ClientInfo, n)
	for i := range out {
		last := now
		if i%4 == 0 {
			last = now.Add(-time.Hour)
		}
		// Descending addresses, so the sort has work to do.
		out[i] = &clusterv1.ClientInfo{
			NodeId: fmt.Sprintf("n%d", i%4), ClientAddress: fmt.Sprintf("10.%d.%d.%d:7000", (n-i)>>16&255, (n-i)>>8&255, (n-i)&255),
			Transport: "grpc", Org: "acme", Team: fmt.Sprintf("t%d", i%20), Employee: fmt.Sprintf("e%d", i),
			VersionSent: "v7", State: states[i%len(states)], VersionAcked: "v7",
			ConnectedAtUnixNano: now.Add(-time.Duration(i) * time.Second).UnixNano(), LastActiveUnixNano: last.UnixNano(),
		}
	}
	return out
}

// TestListClientsLargeFleet: a page of a large fleet holds the page only,
// while total and counts cover the fleet.
func TestListClientsLargeFleet(t *testing.T) {
	f := newFake(t)
	f.clients = manyClients(20000, time.Now())
	got := getClients(t, f, "/v1/clients?state=acked&offset=100&limit=50")
	if len(got.Clients) != 50 || got.Total != 10000 {
		t.Fatalf("%d clients of %d, want 50 of 10000", len(got.Clients), got.Total)
	}
	if diff := cmp.Diff(ClientCounts{Pending: 5000, Acked: 10000, Nacked: 5000, Stale: 5000}, got.Counts); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	for i := 1; i < len(got.Clients); i++ {
		p, c := got.Clients[i-1], got.Clients[i]
		if p.Node > c.Node || (p.Node == c.Node && p.ClientAddress >= c.ClientAddress) {
			t.Fatalf("page not sorted at %d: %s/%s before %s/%s", i, p.Node, p.ClientAddress, c.Node, c.ClientAddress)
		}
	}
}

// BenchmarkListClients20k: one filtered page of 50 from 20,000 sidecars,
// as a console asks for it.
func BenchmarkListClients20k(b *testing.B) {
	f := newFake(b)
	f.clients = manyClients(20000, time.Now())
	a := New(Config{}, discard(), f)
	b.ReportAllocs()
	for b.Loop() {
		w := serve(a, newRequest(http.MethodGet, "/v1/clients?node=n1&state=acked&offset=1000&limit=50", "", nil))
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// TestClientsAdminClient: adminclient's ClientList holds every field of
// the real answers, with and without paging (it decodes strictly and
// encodes back the same JSON), and ClientsPage asks what it is given.
func TestClientsAdminClient(t *testing.T) {
	f := newFake(t)
	f.clients, f.unreachable = fleet(time.Now()), []string{"n3"}
	srv := httptest.NewServer(New(Config{}, discard(), f))
	t.Cleanup(srv.Close)
	for _, target := range []string{"/v1/clients", "/v1/clients?offset=0&limit=2&state=acked&stale_after=1m", "/v1/clients?node=n9"} {
		t.Run(target, func(t *testing.T) {
			w := serve(New(Config{}, discard(), f), newRequest(http.MethodGet, target, "", nil))
			dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
			dec.DisallowUnknownFields()
			var list adminclient.ClientList
			if err := dec.Decode(&list); err != nil {
				t.Fatalf("decode %s: %v", w.Body, err)
			}
			back, err := json.Marshal(&list)
			if err != nil {
				t.Fatal(err)
			}
			var want, got any
			_ = json.Unmarshal(w.Body.Bytes(), &want)
			_ = json.Unmarshal(back, &got)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("does not round-trip (-server +client):\n%s", diff)
			}
		})
	}
	c, err := adminclient.New(adminclient.Config{Servers: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	page, err := c.ClientsPage(t.Context(), adminclient.ClientFilter{Org: "acme", State: "acked", Limit: 1, Offset: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Clients) != 1 || page.Clients[0].Employee != "alice" || page.Total != 2 || *page.Limit != 1 || *page.Offset != 1 {
		t.Errorf("page %+v, want alice, the second of 2", page)
	}
	if page.Counts != (adminclient.ClientCounts{Pending: 1, Acked: 2, Nacked: 1, Stale: 1}) {
		t.Errorf("counts %+v", page.Counts)
	}
}

// TestOrderedIsTheSortedPrefix: the partial selection gives what a full
// stable sort's first rows are, ties included.
func TestOrderedIsTheSortedPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 100, 2000} {
		for _, end := range []int{0, 1, 3, 50, 250, 2000, -1} {
			t.Run(fmt.Sprintf("%d of %d", end, n), func(t *testing.T) {
				cs := make([]*clusterv1.ClientInfo, n)
				for i := range cs {
					// Few distinct keys: many ties, told apart by PeerAddr.
					cs[i] = &clusterv1.ClientInfo{NodeId: fmt.Sprint(rng.IntN(3)), ClientAddress: fmt.Sprint(rng.IntN(20)), PeerAddr: fmt.Sprint(i)}
				}
				want := slices.Clone(cs)
				slices.SortStableFunc(want, clientOrder)
				if end >= 0 {
					want = want[:min(end, n)]
				}
				got := ordered(slices.Clone(cs), end)
				if end >= 0 && len(got) > end {
					got = got[:end]
				}
				if diff := cmp.Diff(peers(want), peers(got)); diff != "" {
					t.Errorf("(-sorted +ordered):\n%s", diff)
				}
			})
		}
	}
}

func peers(cs []*clusterv1.ClientInfo) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.GetPeerAddr())
	}
	return out
}
