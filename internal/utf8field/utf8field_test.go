package utf8field

import (
	"encoding/json"
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
)

// Run longer with:
//
//	go test ./internal/utf8field/ -run '^$' -fuzz '^FuzzJSON$' -fuzztime 60s
//	go test ./internal/utf8field/ -run '^$' -fuzz '^FuzzProto$' -fuzztime 60s

func field(err error) string {
	if e := (*Error)(nil); errors.As(err, &e) {
		return e.Field
	}
	if err != nil {
		return "unexpected error " + err.Error()
	}
	return ""
}

func TestJSON(t *testing.T) {
	tests := []struct {
		name, data, want string
	}{
		{"valid", `{"name":"é","spec":{"x":["a","\ud83d\ude00"]}}`, ""},
		{"value", "{\"name\":\"ok\",\"reason\":\"a\xffb\"}", "reason"},
		{"nested value", "{\"spec\":{\"conditions\":{\"patterns\":[\"a\",\"\xc3\"]}}}", "spec.conditions.patterns[1]"},
		{"member name", "{\"labels\":{\"ok\":\"1\",\"\xff\":\"2\"}}", "a member name in labels"},
		{"top-level member name", "{\"\xfe\":1}", "a member name of the top-level object"},
		{"value under a quoted key", "{\"labels\":{\"app/name\":\"\xff\"}}", `labels["app/name"]`},
		{"array of objects", "[{\"a\":1},{\"b\":\"\xff\"}]", "[1].b"},
		{"top-level string", "\"\xff\"", "the JSON value"},
		{"lone high surrogate", `{"reason":"\ud800"}`, "reason"},
		{"lone high surrogate, then text", `{"reason":"\ud800x"}`, "reason"},
		{"high surrogate, then another high", `{"reason":"\ud800\ud800"}`, "reason"},
		{"lone low surrogate", `{"reason":"\uDC00"}`, "reason"},
		{"surrogate pair", `{"reason":"\uD83D\uDE00"}`, ""},
		{"escaped backslash before u", `{"reason":"\\ud800"}`, ""},
		{"after numbers and literals", "{\"n\":1e999,\"b\":true,\"z\":null,\"s\":\"\xff\"}", "s"},
		{"not JSON: the decoder's business", "{\"a\":\"\xff\"", "a"},
		{"not JSON at all", "\xff\xff", ""},
		{"empty", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := field(JSON([]byte(tc.data))); got != tc.want {
				t.Fatalf("JSON(%q) names %q, want %q", tc.data, got, tc.want)
			}
		})
	}
}

func TestQuery(t *testing.T) {
	tests := []struct {
		name string
		q    url.Values
		want string
	}{
		{"valid", url.Values{"org": {"acme"}, "team": {"é"}}, ""},
		{"value", url.Values{"org": {"acme"}, "team": {"\xff"}}, "query parameter team"},
		{"second value", url.Values{"org": {"acme", "\xff"}}, "query parameter org"},
		{"name", url.Values{"\xff": {"x"}}, "a query parameter name"},
		{"first by name", url.Values{"b": {"\xff"}, "a": {"\xff"}}, "query parameter a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := field(Query(tc.q)); got != tc.want {
				t.Fatalf("Query(%v) names %q, want %q", tc.q, got, tc.want)
			}
		})
	}
}

// appendString appends string field num with raw bytes, valid or not.
func appendString(b []byte, num protowire.Number, v string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, v)
}

func TestProto(t *testing.T) {
	scope := func(team string) []byte {
		return appendString(appendString(nil, 1, "acme"), 2, team)
	}
	md := (&discoveryv1.PolicyDiscoveryRequest{}).ProtoReflect().Descriptor()
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{"valid", appendString(appendString(nil, 1, "c1"), 2, "v1"), ""},
		{"top-level field", appendString(appendString(nil, 1, "c1"), 3, "\xff"), "response_nonce"},
		{"nested field", protowire.AppendBytes(protowire.AppendTag(appendString(nil, 1, "c1"), 5, protowire.BytesType), scope("\xff")), "scope.team"},
		{"nested valid", protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), scope("red")), ""},
		{"unknown field", appendString(nil, 99, "\xff"), ""},
		{"truncated", []byte{0x0a, 0x05, 'a'}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := field(Proto(md, tc.b))
			if got != tc.want {
				t.Fatalf("Proto names %q, want %q", got, tc.want)
			}
			// It names a field exactly when protobuf-go refuses the
			// message for its UTF-8.
			if err := proto.Unmarshal(tc.b, &discoveryv1.PolicyDiscoveryRequest{}); (err != nil) != (tc.want != "" || tc.name == "truncated") {
				t.Fatalf("proto.Unmarshal = %v, Proto named %q", err, got)
			}
		})
	}
}

// stringLiteral matches one JSON string literal; in valid JSON every '"'
// outside a string starts one, so the leftmost matches are the strings.
var (
	stringLiteral = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	escape        = regexp.MustCompile(`\\(?:u[0-9a-fA-F]{4}|.)`)
)

// badStrings is FuzzJSON's oracle, written apart from JSON: whether valid
// JSON text holds a string with invalid UTF-8 or an unpaired surrogate
// escape.
func badStrings(data []byte) bool {
	for _, lit := range stringLiteral.FindAll(data, -1) {
		if !utf8.Valid(lit) {
			return true
		}
		var pending rune // a high surrogate waiting for its low one
		last := -1       // where the previous escape ended
		for _, loc := range escape.FindAllIndex(lit, -1) {
			e := lit[loc[0]:loc[1]]
			var r rune = -1
			if len(e) == 6 {
				v, _ := strconv.ParseUint(string(e[2:]), 16, 32)
				r = rune(v)
			}
			if pending != 0 {
				if loc[0] != last || utf16.DecodeRune(pending, r) == utf8.RuneError {
					return true
				}
				pending, last = 0, loc[1]
				continue
			}
			switch {
			case r >= 0xd800 && r < 0xdc00:
				pending = r
			case r >= 0xdc00 && r < 0xe000:
				return true
			}
			last = loc[1]
		}
		if pending != 0 {
			return true
		}
	}
	return false
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{
		`{"name":"acme.deny","spec":{"tool_name":"Bash","conditions":{"patterns":["rm -rf"]}}}`,
		"{\"reason\":\"\xff\"}",
		"{\"labels\":{\"\xc3\":\"x\"}}",
		`{"a":"\ud800"}`,
		`{"a":"\ud83d\ude00"}`,
		`{"a":"\ude00\ud83d"}`,
		`{"a":"\\ud800"}`,
		`{"a":"\ud800\\u0041"}`,
		`["\udbff\udfff", "\ud800\u0041"]`,
		"\"\xed\xa0\x80\"", // a surrogate encoded as UTF-8 bytes
		`{"n":1e999,"s":"x"}`,
		"{\"a\":\"\xff\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := JSON(data)
		if err != nil && (field(err) == "" || !utf8.ValidString(err.Error())) {
			t.Fatalf("JSON(%q) = %v: no field, or a message that is not UTF-8", data, err)
		}
		if !json.Valid(data) {
			return // not JSON: anything but a panic
		}
		if got, want := err != nil, badStrings(data); got != want {
			t.Fatalf("JSON(%q) = %v, oracle says bad = %v", data, err, want)
		}
	})
}

func FuzzProto(f *testing.F) {
	f.Add(appendString(appendString(nil, 1, "c1"), 2, "v1"))
	f.Add(appendString(nil, 3, "\xff"))
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), appendString(nil, 2, "\xfe")))
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), appendString(nil, 1, "\xc3")))
	md := (&discoveryv1.PolicyDiscoveryRequest{}).ProtoReflect().Descriptor()
	f.Fuzz(func(t *testing.T, b []byte) {
		err := Proto(md, b)
		uerr := proto.Unmarshal(b, &discoveryv1.PolicyDiscoveryRequest{})
		switch {
		case err != nil && uerr == nil:
			t.Fatalf("Proto(%x) = %v, but protobuf-go accepts the message", b, err)
		case err == nil && uerr != nil && strings.Contains(uerr.Error(), "UTF-8"):
			t.Fatalf("Proto(%x) found nothing, but protobuf-go refuses: %v", b, uerr)
		}
	})
}
