package client

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
)

// Run longer with:
//
//	go test ./client/ -run '^$' -fuzz '^FuzzDecodeResponse$' -fuzztime 60s

// encodeResponse is a node's encoding of a response (deterministic, as
// internal/server/discovery encodes snapshots).
func encodeResponse(t testing.TB, version string, set ...Policy) []byte {
	t.Helper()
	resp := &discoveryv1.PolicyDiscoveryResponse{VersionInfo: version, Nonce: "n-" + version}
	for _, p := range set {
		resp.Policies = append(resp.Policies, toProto(p))
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantMessage is proto.Unmarshal's reading of b, nil if it refuses b: the
// reference the split and reuse must agree with. Fields the schema does not
// know are discarded, as the SDK has nowhere to put them; a policy without
// a scope has the empty one, which is what the SDK's Policy holds for it.
func wantMessage(b []byte) *discoveryv1.PolicyDiscoveryResponse {
	var m discoveryv1.PolicyDiscoveryResponse
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &m); err != nil {
		return nil
	}
	for _, p := range m.GetPolicies() {
		if p.Scope == nil {
			p.Scope = &discoveryv1.Scope{}
		}
	}
	return &m
}

// asMessage is what the SDK decoded, written back as a message: a field the
// SDK drops is missing from it.
func asMessage(r *response) *discoveryv1.PolicyDiscoveryResponse {
	m := &discoveryv1.PolicyDiscoveryResponse{VersionInfo: r.version, Nonce: r.nonce, Unchanged: r.unchanged}
	for _, p := range r.policies {
		m.Policies = append(m.Policies, toProto(p.p))
	}
	return m
}

// sameDecode compares the SDK's decode with proto.Unmarshal's.
func sameDecode(got *response, want *discoveryv1.PolicyDiscoveryResponse) string {
	return cmp.Diff(want, asMessage(got), protocmp.Transform())
}

// labelled is n distinct ToolPolicies with several labels each (map order
// is what a non-deterministic encoding would change).
func labelled(n int, reasons map[int]string) []Policy {
	set := make([]Policy, n)
	for i := range set {
		reason := "r"
		if r, ok := reasons[i]; ok {
			reason = r
		}
		set[i] = tp("p"+strconv.Itoa(i), "Bash", "deny", reason)
		set[i].Scope = Scope{Org: "o"}
		set[i].Labels = map[string]string{"a": "1", "b": "2", "c": "3", "d": strconv.Itoa(i)}
		set[i].Revision = uint64(i + 1)
	}
	return set
}

func TestDecodeResponse(t *testing.T) {
	base := labelled(6, nil)
	changed := labelled(6, map[int]string{2: "changed"})
	tests := []struct {
		name string
		prev []Policy // the previous response's set; nil: none
		b    []byte
		// reused is how many of the response's policies are taken from
		// the previous response rather than decoded.
		reused int
	}{
		{name: "first response", b: encodeResponse(t, "v1", base...)},
		{name: "same set again", prev: base, b: encodeResponse(t, "v1", base...), reused: 6},
		{name: "one changed", prev: base, b: encodeResponse(t, "v2", changed...), reused: 5},
		{name: "one added first", prev: base[1:], b: encodeResponse(t, "v2", base...), reused: 5},
		{name: "one added in the middle", prev: append(base[:2:2], base[3:]...), b: encodeResponse(t, "v2", base...), reused: 5},
		{name: "one added last", prev: base[:5], b: encodeResponse(t, "v2", base...), reused: 5},
		{name: "one removed first", prev: base, b: encodeResponse(t, "v2", base[1:]...), reused: 5},
		{name: "one removed in the middle", prev: base, b: encodeResponse(t, "v2", append(base[:2:2], base[3:]...)...), reused: 5},
		{name: "one removed last", prev: base, b: encodeResponse(t, "v2", base[:5]...), reused: 5},
		{name: "empty set", prev: base, b: encodeResponse(t, "v2")},
		{name: "empty message", prev: base, b: nil},
		{name: "unchanged answer", prev: base, b: func() []byte {
			b, _ := proto.Marshal(&discoveryv1.PolicyDiscoveryResponse{VersionInfo: "v1", Nonce: "n", Unchanged: true})
			return b
		}()},
		{name: "unknown fields are skipped", prev: base, reused: 6, b: protowire.AppendBytes(protowire.AppendTag(
			protowire.AppendVarint(protowire.AppendTag(encodeResponse(t, "v1", base...), 9, protowire.VarintType), 7),
			10, protowire.BytesType), []byte("later"))},
		{name: "a repeated scalar: the last one counts", b: protowire.AppendString(protowire.AppendTag(
			encodeResponse(t, "v1", base[:1]...), 1, protowire.BytesType), "v9")},
		{name: "a known field with another wire type", b: protowire.AppendVarint(protowire.AppendTag(
			encodeResponse(t, "v1", base[:1]...), 1, protowire.VarintType), 5)},
		{name: "unchanged as a length-delimited field", b: protowire.AppendBytes(protowire.AppendTag(
			encodeResponse(t, "v1"), 4, protowire.BytesType), []byte{1})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var prev []rawPolicy
			if tt.prev != nil {
				r, err := decodeResponse(encodeResponse(t, "v0", tt.prev...), nil)
				if err != nil {
					t.Fatal(err)
				}
				prev = r.policies
			}
			want := wantMessage(tt.b)
			if want == nil {
				t.Fatalf("proto.Unmarshal refuses the test's input")
			}
			got, err := decodeResponse(tt.b, prev)
			if err != nil {
				t.Fatalf("decodeResponse: %v", err)
			}
			if diff := sameDecode(got, want); diff != "" {
				t.Fatalf("decodeResponse differs from proto.Unmarshal (-want +got):\n%s", diff)
			}
			// A reused policy is the previous one itself: it has the same
			// labels map, where a decoded one has a new map.
			reused := 0
			for _, p := range got.policies {
				for _, q := range prev {
					if sameMap(p.p.Labels, q.p.Labels) {
						reused++
					}
				}
			}
			if reused != tt.reused {
				t.Fatalf("%d policies reused, want %d", reused, tt.reused)
			}
		})
	}
}

// sameMap reports whether a and b are the same map (not merely equal).
func sameMap(a, b map[string]string) bool {
	return a != nil && reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func TestDecodeResponseErrors(t *testing.T) {
	good := encodeResponse(t, "v1", labelled(2, nil)...)
	tests := []struct {
		name string
		b    []byte
	}{
		{name: "truncated", b: good[:len(good)-3]},
		{name: "a policy that is not a message", b: protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte{0xff})},
		{name: "version not UTF-8", b: protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xc3, 0x28})},
		{name: "field number 0", b: []byte{0x02, 0x00}},
		{name: "length past the end", b: []byte{0x0a, 0x7f, 'v'}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if wantMessage(tt.b) != nil {
				t.Fatalf("proto.Unmarshal accepts the test's input")
			}
			if r, err := decodeResponse(tt.b, nil); err == nil {
				t.Fatalf("decodeResponse accepted it: %+v", r)
			}
		})
	}
}

// TestDecoderHandlesEveryField walks the messages of a discovery response
// in the proto's descriptor: every field must be one the SDK handles
// (handledFields), or the SDK would drop it without a word.
func TestDecoderHandlesEveryField(t *testing.T) {
	got := map[string]map[protowire.Number]string{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if _, seen := got[string(md.FullName())]; seen {
			return
		}
		fields := map[protowire.Number]string{}
		got[string(md.FullName())] = fields
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			fields[f.Number()] = string(f.Name())
			if f.Message() != nil {
				walk(f.Message())
			}
		}
	}
	walk(discoveryv1.File_discovery_v1_discovery_proto.Messages().ByName("PolicyDiscoveryResponse"))
	if diff := cmp.Diff(handledFields, got); diff != "" {
		t.Fatalf("the proto's fields (+) are not the ones the SDK handles (-); teach splitResponse or fromDiscovery the new field, then handledFields:\n%s", diff)
	}
}

// TestRawCodec: the codec hands a *rawResponse the bytes as received (a
// copy, since gRPC recycles its buffers), and is the proto codec for
// everything else, under the proto codec's name.
func TestRawCodec(t *testing.T) {
	c := newRawCodec()
	if c.Name() != "proto" {
		t.Fatalf("codec name %q: the stream must keep the proto content type", c.Name())
	}
	want := encodeResponse(t, "v1", labelled(2, nil)...)
	buf := append([]byte(nil), want...)
	var raw rawResponse
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, &raw); err != nil {
		t.Fatal(err)
	}
	clear(buf)
	if string(raw) != string(want) {
		t.Fatalf("raw response does not hold the bytes received")
	}
	req := &discoveryv1.PolicyDiscoveryRequest{ClientAddress: "c", VersionInfo: "v1"}
	out, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back discoveryv1.PolicyDiscoveryRequest
	if err := c.Unmarshal(out, &back); err != nil || !proto.Equal(&back, req) {
		t.Fatalf("round trip = %v, %v", &back, err)
	}
}

// FuzzDecodeResponse: whatever a node sends, decodeResponse decodes it as
// proto.Unmarshal does, or refuses it when proto.Unmarshal does, whatever
// the previous response was.
func FuzzDecodeResponse(f *testing.F) {
	base := labelled(4, nil)
	f.Add(encodeResponse(f, "v0", base...), encodeResponse(f, "v1", labelled(4, map[int]string{1: "x"})...))
	f.Add(encodeResponse(f, "v0", base...), encodeResponse(f, "v1", base[1:]...))
	f.Add(encodeResponse(f, "v0", base[1:]...), encodeResponse(f, "v1", base...))
	f.Add([]byte(nil), encodeResponse(f, "v1", base...))
	f.Add(encodeResponse(f, "v0", base...), []byte{0x0a, 0x7f, 'v'})
	f.Add(encodeResponse(f, "v0", base...), protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1))
	f.Fuzz(func(t *testing.T, prevB, b []byte) {
		var prev []rawPolicy
		if r, err := decodeResponse(prevB, nil); err == nil {
			prev = r.policies
		}
		got, err := decodeResponse(b, prev)
		want := wantMessage(b)
		switch {
		case want == nil && err == nil:
			t.Fatalf("decodeResponse accepted what proto.Unmarshal refuses: %+v", got)
		case want != nil && err != nil:
			t.Fatalf("decodeResponse refused what proto.Unmarshal accepts: %v", err)
		case want != nil:
			if diff := sameDecode(got, want); diff != "" {
				t.Fatalf("decodeResponse differs from proto.Unmarshal (-want +got):\n%s", diff)
			}
		}
	})
}
