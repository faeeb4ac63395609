package client

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
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

// bigSet is n ToolPolicies with a spec of about 4 KB each (the writes
// scenario's size) and two labels, the one at changed with reason r.
func bigSet(n, changed, r int) []Policy {
	pad := strings.Repeat("x", 4000)
	set := make([]Policy, n)
	for i := range set {
		reason := pad + " 0"
		if i == changed {
			reason = pad + " " + strconv.Itoa(r)
		}
		set[i] = tp("bench-p"+strconv.Itoa(i), "Bash", "deny", reason, "rm -rf", "^sudo ")
		set[i].Scope = Scope{Org: "bench-o0"}
		set[i].Labels = map[string]string{"bench": "propagation", "tier": "prod"}
	}
	return set
}

// received is b as gRPC hands it to a codec: in 16 KiB pieces, HTTP/2's
// default frame size.
func received(b []byte) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), 16<<10)
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return s
}

// BenchmarkDiscoveryResponse is a sidecar's work for one discovery response,
// one policy of which changed since the previous response: the codec, the
// decode and putting the set in force (compileRules reuses the unchanged
// rules either way). hand is the split that reuses the previous response's
// decoded policies; generated is grpc-go's proto codec into
// discoveryv1.PolicyDiscoveryResponse. The sets are the propagation
// scenario's (10 compact policies) and 1, 100 and 1000 policies of 4 KB.
func BenchmarkDiscoveryResponse(b *testing.B) {
	sets := []struct {
		name string
		set  func(k int) []Policy
	}{
		{"compact-10", func(k int) []Policy { return benchSet(10, 3, k) }},
		{"4k-1", func(k int) []Policy { return bigSet(1, 0, k) }},
		{"4k-100", func(k int) []Policy { return bigSet(100, 50, k) }},
		{"4k-1000", func(k int) []Policy { return bigSet(1000, 500, k) }},
	}
	for _, s := range sets {
		var wire [2][]byte
		for k := range wire {
			wire[k] = encodeResponse(b, "v"+strconv.Itoa(k), s.set(k)...)
		}
		b.Run(s.name+"/hand", func(b *testing.B) {
			g := benchTransport(b)
			codec := newRawCodec()
			b.ReportAllocs()
			cpu0, _ := processCPU()
			defer reportCPU(b, cpu0)
			i := 0
			for b.Loop() {
				var raw rawResponse
				if err := codec.Unmarshal(received(wire[i%2]), &raw); err != nil {
					b.Fatal(err)
				}
				resp, err := g.decode(raw)
				if err != nil {
					b.Fatal(err)
				}
				if req := g.answer(resp, "n1"); req.GetErrorDetail() != nil {
					b.Fatal(req.GetErrorDetail().GetMessage())
				}
				i++
			}
		})
		b.Run(s.name+"/generated", func(b *testing.B) {
			g := benchTransport(b)
			codec := encoding.GetCodecV2(protoenc.Name)
			b.ReportAllocs()
			cpu0, _ := processCPU()
			defer reportCPU(b, cpu0)
			i := 0
			for b.Loop() {
				var m discoveryv1.PolicyDiscoveryResponse
				if err := codec.Unmarshal(received(wire[i%2]), &m); err != nil {
					b.Fatal(err)
				}
				resp := &response{version: m.GetVersionInfo(), nonce: m.GetNonce(), unchanged: m.GetUnchanged(),
					policies: make([]rawPolicy, len(m.GetPolicies()))}
				for j, p := range m.GetPolicies() {
					resp.policies[j] = rawPolicy{p: fromDiscovery(p)}
				}
				if req := g.answer(resp, "n1"); req.GetErrorDetail() != nil {
					b.Fatal(req.GetErrorDetail().GetMessage())
				}
				i++
			}
		})
	}
}

// reportCPU adds the process's CPU time per operation since start to b's
// results: on a shared machine wall time also counts the time spent waiting
// for a CPU, CPU time does not.
func reportCPU(b *testing.B, start time.Duration) {
	if now, ok := processCPU(); ok && b.N > 0 {
		b.ReportMetric(float64(now-start)/float64(b.N), "cpu-ns/op")
	}
}

func benchTransport(b *testing.B) *grpcTransport {
	b.Helper()
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return &grpcTransport{c: c}
}
