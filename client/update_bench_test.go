package client

import (
	"encoding/json"
	"strconv"
	"testing"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// benchSet is n ToolPolicies of the size bench's propagation scenario
// writes (about 150 bytes each), the one at changed with reason r.
func benchSet(n, changed, r int) []Policy {
	set := make([]Policy, n)
	for i := range set {
		reason := "bench propagation write 0"
		if i == changed {
			reason = "bench propagation write " + strconv.Itoa(r)
		}
		set[i] = tp("bench-p0-"+strconv.Itoa(i), "Bash", "deny", reason)
		set[i].Scope = Scope{Org: "bench-o0"}
		set[i].Labels = map[string]string{"bench": "propagation"}
	}
	return set
}

// BenchmarkGRPCUpdate is what a sidecar does with one discovery response
// carrying a set of 10 policies, one of them changed: decode it (reusing the
// 9 the previous response carried, as the session does) and put it in force
// (the ACK's send is not included).
func BenchmarkGRPCUpdate(b *testing.B) {
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	g := &grpcTransport{c: c}
	var wire [2][]byte
	for k := range wire {
		wire[k] = encodeResponse(b, "v"+strconv.Itoa(k), benchSet(10, 3, k)...)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		resp, err := g.decode(wire[i%2])
		if err != nil {
			b.Fatal(err)
		}
		if req := g.answer(resp, "n1"); req.GetErrorDetail() != nil {
			b.Fatal(req.GetErrorDetail().GetMessage())
		}
		i++
	}
}

// BenchmarkFeedUpsert is what a sidecar does with one feed upsert of a
// policy in a set of 10: decode it and put it in force.
func BenchmarkFeedUpsert(b *testing.B) {
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}, Transport: TransportWS, Employee: "e"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.install(benchSet(10, 3, 0), "v0", 1, true, "n1"); err != nil {
		b.Fatal(err)
	}
	var wire [2][]byte
	for k := range wire {
		p := benchSet(10, 3, k+1)[3]
		m := feedv1.Message{Type: feedv1.TypeUpsert, Version: uint64(k + 2), Digest: "d" + strconv.Itoa(k),
			Policy: &feedv1.Policy{Name: p.Name, Kind: p.Kind, Scope: feedv1.Scope{Org: p.Scope.Org}, Labels: p.Labels, Spec: p.Spec, Revision: p.Revision}}
		if wire[k], err = json.Marshal(m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		m, err := decodeFeedMessage(wire[i%2])
		if err != nil {
			b.Fatal(err)
		}
		// Each message's version is above the last: reset the resume
		// index so that the next one is applied, not skipped.
		c.mu.Lock()
		c.index = 0
		c.mu.Unlock()
		if _, err := c.applyFeed(&m, "n1"); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
