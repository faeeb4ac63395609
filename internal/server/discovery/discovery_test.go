package discovery

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/store"
)

// The protocol itself is tested end to end, over real gRPC against real
// nodes, in internal/server/discovery_test.go. These are the pure parts.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTruncate(t *testing.T) {
	tests := []struct {
		name, in string
		n        int
		want     string
	}{
		{"short", "abc", 10, "abc"},
		{"cut", "abcdef", 3, "abc…"},
		{"no split rune", "ééé", 3, "é…"},
		{"invalid utf-8", "a\xffb", 10, "a\uFFFDb"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.in, tc.n)
			if got != tc.want || !utf8.ValidString(got) {
				t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
		})
	}
}

// TestCodecSendsEncodedAsIs: a pre-encoded snapshot goes out byte for byte,
// and anything else is ordinary proto.
func TestCodecSendsEncodedAsIs(t *testing.T) {
	resp := &discoveryv1.PolicyDiscoveryResponse{VersionInfo: "v", Nonce: "n", Policies: []*discoveryv1.Policy{{Name: "p", Spec: []byte(`{}`)}}}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	cd := newCodec()
	out, err := cd.Marshal(encoded(b))
	if err != nil || string(out.Materialize()) != string(b) {
		t.Fatalf("encoded: %q, %v", out.Materialize(), err)
	}
	out2, err := cd.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var back discoveryv1.PolicyDiscoveryResponse
	if err := cd.Unmarshal(out2, &back); err != nil || !proto.Equal(&back, resp) {
		t.Fatalf("round trip = %v, %v", &back, err)
	}
	if cd.Name() != "proto" {
		t.Fatalf("codec name %q: clients must not need a custom codec", cd.Name())
	}
}

// FuzzRequestChecks: whatever a client sends decodes (or not) and is
// checked without panicking.
func FuzzRequestChecks(f *testing.F) {
	seed := func(r *discoveryv1.PolicyDiscoveryRequest) {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	seed(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "c", VersionInfo: "v", ResponseNonce: "n"})
	seed(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "c", ErrorDetail: &discoveryv1.ErrorDetail{Message: "bad"}, Scope: &discoveryv1.Scope{Org: "o", Team: "t"}})
	seed(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: strings.Repeat("c", 300)})
	f.Add([]byte{0x0a, 0xff, 0xff})
	s := &Service{}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req discoveryv1.PolicyDiscoveryRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		if checkRequest(&req) != nil {
			return
		}
		if _, err := s.requestScope(&stream{}, &req); err == nil && req.GetScope().GetOrg() == "" && req.GetScope().GetTeam() != "" {
			t.Fatalf("team scope without org accepted: %v", &req)
		}
		_ = truncate(req.GetErrorDetail().GetMessage(), maxNackMessage)
	})
}

// TestSnapshotEncodingIsStable: a policy that did not change has the same
// bytes in every snapshot, labels included (Go randomises map order, so a
// plain proto.Marshal would not give that). The SDK decodes only the
// policies whose bytes it has not seen before.
func TestSnapshotEncodingIsStable(t *testing.T) {
	labels := map[string]string{}
	for i := range 16 {
		labels["label-"+strconv.Itoa(i)] = strconv.Itoa(i)
	}
	p := func(name, reason string) store.RawPolicy {
		return store.RawPolicy{Policy: &policy.Policy{Name: name, Kind: "ToolPolicy", Scope: policy.Scope{Org: "o"},
			Labels: labels, Spec: []byte(`{"tool_name":"Bash","action":"deny","reason":"` + reason + `"}`), Revision: 7}}
	}
	s := &Service{}
	policiesOf := func(version string, set ...store.RawPolicy) [][]byte {
		t.Helper()
		snap, err := s.newSnapshot(&policyset.Set{Version: version, Policies: set})
		if err != nil {
			t.Fatal(err)
		}
		var raws [][]byte
		for b := []byte(snap.full); len(b) > 0; {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				t.Fatalf("snapshot %s: bad tag", version)
			}
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				t.Fatalf("snapshot %s: bad field %d", version, num)
			}
			if num == 2 {
				v, _ := protowire.ConsumeBytes(b[n:])
				raws = append(raws, v)
			}
			b = b[n+m:]
		}
		return raws
	}
	first := policiesOf("v1", p("a", "x"), p("b", "x"))
	for i := range 20 {
		v := "v" + strconv.Itoa(i+2)
		got := policiesOf(v, p("a", "x"), p("b", "changed "+v))
		if len(got) != 2 {
			t.Fatalf("snapshot %s has %d policies, want 2", v, len(got))
		}
		if !bytes.Equal(got[0], first[0]) {
			t.Fatalf("snapshot %s: unchanged policy a encoded differently", v)
		}
		if bytes.Equal(got[1], first[1]) {
			t.Fatalf("snapshot %s: changed policy b encoded as before", v)
		}
	}
}
