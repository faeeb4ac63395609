package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
)

// TestResponseHeadHandlesEveryField walks PolicyDiscoveryResponse in the
// proto's descriptor: every field must be one responseHead reads or skips
// on purpose (responseHeadFields). The policies' own fields are not walked:
// responseHead never looks inside a policy.
func TestResponseHeadHandlesEveryField(t *testing.T) {
	md := discoveryv1.File_discovery_v1_discovery_proto.Messages().ByName("PolicyDiscoveryResponse")
	got := map[protowire.Number]string{}
	for i := range md.Fields().Len() {
		f := md.Fields().Get(i)
		got[f.Number()] = string(f.Name())
	}
	if diff := cmp.Diff(responseHeadFields, got); diff != "" {
		t.Fatalf("PolicyDiscoveryResponse's fields (+) are not the ones responseHead knows (-); decide whether it reads the new one:\n%s", diff)
	}
}

// BenchmarkResponseHead is a -grpc-head sidecar's decode of one discovery
// response (headCodec) against the default one's (grpc-go's proto codec
// into a reused discoveryv1.PolicyDiscoveryResponse), for the propagation
// scenario's 10 compact policies and for 100 and 1000 policies of 4 KB.
func BenchmarkResponseHead(b *testing.B) {
	for _, s := range []struct {
		name     string
		n, bytes int
	}{{"compact-10", 10, 0}, {"4k-100", 100, 4096}, {"4k-1000", 1000, 4096}} {
		wire := benchResponse(b, s.n, s.bytes)
		b.Run(s.name+"/head", func(b *testing.B) {
			codec := headCodec{encoding.GetCodecV2(protoenc.Name)}
			var hd responseHead
			b.ReportAllocs()
			for b.Loop() {
				if err := codec.Unmarshal(frames(wire), &hd); err != nil || hd.version != "v1" {
					b.Fatalf("head %+v, err %v", hd, err)
				}
			}
		})
		b.Run(s.name+"/generated", func(b *testing.B) {
			codec := encoding.GetCodecV2(protoenc.Name)
			var full discoveryv1.PolicyDiscoveryResponse
			b.ReportAllocs()
			for b.Loop() {
				full.Reset()
				if err := codec.Unmarshal(frames(wire), &full); err != nil || full.GetVersionInfo() != "v1" {
					b.Fatalf("version %q, err %v", full.GetVersionInfo(), err)
				}
			}
		})
	}
}

// benchResponse is a node's encoding of a response of n policies of the
// propagation scenario, padded to size bytes of spec.
func benchResponse(b *testing.B, n, size int) []byte {
	b.Helper()
	resp := &discoveryv1.PolicyDiscoveryResponse{VersionInfo: "v1", Nonce: "n1"}
	for i := range n {
		spec := `{"tool_name":"Bash","action":"deny","reason":"bench propagation write 0` + strings.Repeat("x", max(0, size-80)) + `"}`
		resp.Policies = append(resp.Policies, &discoveryv1.Policy{Name: propPolicyName(0, i), Kind: "ToolPolicy",
			Scope: &discoveryv1.Scope{Org: orgName(0)}, Labels: map[string]string{"bench": "propagation"},
			Spec: []byte(spec), Revision: uint64(i + 1)})
	}
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	return wire
}

// frames is b as gRPC hands it to a codec: in 16 KiB pieces, HTTP/2's
// default frame size.
func frames(b []byte) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), 16<<10)
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return s
}
