package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// bodySeeds are request bodies: the fast path must decode each exactly as
// DecodeStrict does, or give up.
var bodySeeds = []string{
	`{"name":"acme.deny-shell","kind":"ToolPolicy","scope":{"org":"acme"},"labels":{"tier":"prod"},"spec":{"tool_name":"Bash","action":"deny","reason":"x"}}`,
	` { "spec" : { "b" : [ 1 , 2 ] , "a" : null } , "kind" : "K" , "name" : "n" , "scope" : { "employee" : "e" , "team" : "t" , "org" : "o" } , "labels" : { } } `,
	`{"name":"x"}`,
	`{}`,
	`{"spec":null}`,
	// Near misses.
	`{"name":"x","name":"y"}`,
	`{"Name":"x"}`,
	`{"name":"x","revision":3}`,
	`{"name":"x","scope":{"org":"a","org":"b"}}`,
	`{"name":"x","scope":{"Org":"a"}}`,
	`{"name":"x","labels":{"a":"1","a":"2"}}`,
	`{"name":"x","labels":{"a":1}}`,
	`{"name":null}`,
	`{"name":"x\u0041"}`,
	`{"name":"x",}`,
	`{"name":"x"} {}`,
	`{"name":"x","spec":{"a":01}}`,
	`{"name":"x","spec":[1,]}`,
	`{"name":"x","scope":null}`,
	`{"name":"x","labels":null}`,
	`{"name":"é"}`,
	`[]`,
	``,
}

func TestDecodePolicyFastMatchesStrict(t *testing.T) {
	for i, s := range bodySeeds {
		t.Run(strings.TrimSpace(s[:min(len(s), 30)])+"#"+string(rune('a'+i%26)), func(t *testing.T) {
			checkBodyEquivalent(t, []byte(s))
		})
	}
}

// checkBodyEquivalent fails if the fast path decodes data differently from
// DecodeStrict, or decodes what DecodeStrict refuses.
func checkBodyEquivalent(t *testing.T, data []byte) {
	t.Helper()
	checkMatchesStrict(t, data, decodePolicyFast)
}

// checkMatchesStrict fails if fast decodes data (ok true) differently from
// DecodeStrict into a T, or decodes what DecodeStrict refuses.
func checkMatchesStrict[T any](t *testing.T, data []byte, fast func([]byte) (*T, bool)) {
	t.Helper()
	got, ok := fast(data)
	if !ok {
		return
	}
	var want T
	if err := DecodeStrict(data, &want); err != nil {
		t.Fatalf("fast path accepted %q, DecodeStrict refused it: %v", data, err)
	}
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Fatalf("fast path differs from DecodeStrict for %q (-want +got):\n%s", data, diff)
	}
}

func TestDecodePolicyFastPathTaken(t *testing.T) {
	for _, s := range bodySeeds[:5] {
		if _, ok := decodePolicyFast([]byte(s)); !ok {
			t.Errorf("fast path gave up on %q", s)
		}
	}
}

// specSeeds are specs: the fast canonical form must equal encoding/json's, or
// give up.
var specSeeds = []string{
	`{"tool_name":"Bash","action":"deny","reason":"x"}`,
	` { "b" : [ 1 , -0.50e+3 , true , false , null , { } , [ ] ] , "a" : { "d" : "x" , "c" : 1 } } `,
	`{"rps":123456789012345678901234567890}`,
	`[]`,
	`"s"`,
	`12`,
	// Near misses.
	`{"a":1,"a":2}`,
	`{"a":"<b>"}`,
	`{"<":1}`,
	`{"a":"\u0041"}`,
	`{"a":"é"}`,
	`{"a":01}`,
	`{"a":1,}`,
	`{"a":1} x`,
	`{"a":1}{}`,
	`{"a" 1}`,
	`[1 2]`,
	`nul`,
}

func TestCanonicalFastMatchesMarshal(t *testing.T) {
	for i, s := range specSeeds {
		t.Run(strings.TrimSpace(s[:min(len(s), 30)])+"#"+string(rune('a'+i%26)), func(t *testing.T) {
			checkCanonicalEquivalent(t, []byte(s))
		})
	}
	for _, s := range specSeeds[:6] {
		if _, ok := appendCanonicalFast(nil, []byte(s)); !ok {
			t.Errorf("fast path gave up on %q", s)
		}
	}
}

// toolSpecSeeds are ToolPolicy specs: the fast decoder must match
// DecodeStrict or give up.
var toolSpecSeeds = []string{
	`{"tool_name":"Bash","action":"deny","reason":"Shell commands blocked","conditions":{"patterns":["rm -rf","^git (status|log)$","\\bls\\b"]}}`,
	` { "reason" : "r\u00e9 \"q\"" , "action" : "audit" , "tool_name" : "Write" , "conditions" : { "patterns" : [ ] } } `,
	`{"tool_name":"x","conditions":{}}`,
	`{"tool_name":"` + "\xff" + `"}`,
	`{}`,
	// Near misses.
	`{"tool_name":"a","tool_name":"b"}`,
	`{"tool_name":null}`,
	`{"tool_name":1}`,
	`{"Tool_name":"a"}`,
	`{"extra":"a"}`,
	`{"conditions":null}`,
	`{"conditions":{"patterns":null}}`,
	`{"conditions":{"patterns":[],"patterns":[]}}`,
	`{"conditions":{"patterns":[1]}}`,
	`{"conditions":{"patterns":["a",]}}`,
	`{"reason":"\x"}`,
	`{"reason":"a"} x`,
}

func TestToolSpecFastMatchesStrict(t *testing.T) {
	for i, s := range toolSpecSeeds {
		t.Run(strings.TrimSpace(s[:min(len(s), 30)])+"#"+string(rune('a'+i%26)), func(t *testing.T) {
			checkToolSpecEquivalent(t, []byte(s))
		})
	}
	for _, s := range toolSpecSeeds[:5] {
		if _, ok := decodeToolSpecFast([]byte(s)); !ok {
			t.Errorf("fast path gave up on %q", s)
		}
	}
}

func checkToolSpecEquivalent(t *testing.T, spec []byte) {
	t.Helper()
	checkMatchesStrict(t, spec, decodeToolSpecFast)
}

func checkCanonicalEquivalent(t *testing.T, raw []byte) {
	t.Helper()
	got, ok := appendCanonicalFast(nil, raw)
	if !ok {
		return
	}
	want, err := canonicalMarshal(raw)
	if err != nil {
		t.Fatalf("fast path accepted %q, encoding/json refused it: %v", raw, err)
	}
	if string(got) != string(want) {
		t.Fatalf("canonical form of %q: fast %s, encoding/json %s", raw, got, want)
	}
}

// FuzzPolicyFastPaths checks the request-side fast paths against
// encoding/json: the body and ToolPolicy spec decoders against DecodeStrict,
// and the canonical spec against json.Marshal. The spec input is also placed in a body so that
// the fuzzer reaches the body decoder's spec handling.
//
//	go test ./policy/ -run '^$' -fuzz '^FuzzPolicyFastPaths$' -fuzztime 60s
func FuzzPolicyFastPaths(f *testing.F) {
	specs := append(append([]string(nil), specSeeds...), toolSpecSeeds...)
	for i := range max(len(bodySeeds), len(specs)) {
		f.Add([]byte(bodySeeds[i%len(bodySeeds)]), []byte(specs[i%len(specs)]))
	}
	f.Fuzz(func(t *testing.T, body, spec []byte) {
		checkBodyEquivalent(t, body)
		checkCanonicalEquivalent(t, spec)
		checkToolSpecEquivalent(t, spec)
		if got, want := validJSON(spec), json.Valid(spec); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid %v", spec, got, want)
		}
		wrapped, err := json.Marshal(string(spec))
		if err != nil {
			t.Fatal(err)
		}
		checkBodyEquivalent(t, []byte(`{"name":"x","spec":`+string(spec)+`,"labels":{"k":`+string(wrapped)+`}}`))
	})
}

func BenchmarkWritePath4K(b *testing.B) {
	body := []byte(`{"name":"bench-w1-1","kind":"ToolPolicy","scope":{"org":"bench"},"labels":{"bench":"writes"},"spec":{"tool_name":"Bash","action":"deny","reason":"` +
		strings.Repeat("x", 3900) + `"}}`)
	v, err := NewValidator(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		p, err := DecodePolicy(body)
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Policy(p); err != nil {
			b.Fatal(err)
		}
		if _, err := p.Canonical(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPlainRun checks the word-at-a-time test against the plain one for
// every byte value at every position of the word and of the tail.
func TestPlainRun(t *testing.T) {
	plain := func(c byte, html bool) bool {
		return c >= 0x20 && c < 0x7f && c != '\\' && (!html || (c != '<' && c != '>' && c != '&'))
	}
	for _, html := range []bool{false, true} {
		for _, n := range []int{1, 8, 9, 17} {
			t.Run(fmt.Sprintf("html=%v/len=%d", html, n), func(t *testing.T) {
				for pos := range n {
					for c := range 256 {
						s := []byte(strings.Repeat("a", n))
						s[pos] = byte(c)
						if got, want := plainRun(s, html), plain(byte(c), html); got != want {
							t.Fatalf("plainRun(%q, %v) = %v, want %v", s, html, got, want)
						}
					}
				}
			})
		}
	}
}

func TestValidJSON(t *testing.T) {
	for _, s := range append(append(append([]string{}, specSeeds...), toolSpecSeeds...), storedSeeds...) {
		if got, want := validJSON([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("validJSON(%q) = %v, json.Valid %v", s, got, want)
		}
	}
}
