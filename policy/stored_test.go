package policy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// storedSeeds are stored forms and near misses: each must decode exactly as
// json.Unmarshal decodes it, on the fast path or not.
var storedSeeds = []string{
	`{"name":"acme.deny-shell","kind":"ToolPolicy","scope":{"org":"acme","team":"","employee":""},"labels":{"tier":"prod"},"spec":{"action":"deny","conditions":{"patterns":["rm -rf"]},"reason":"Shell commands blocked","tool_name":"Bash"},"revision":42,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05.123456789+02:00"}`,
	`{"name":"g","kind":"ToolPolicy","scope":{"org":"","team":"","employee":""},"spec":{},"revision":0,"created_at":"0001-01-01T00:00:00Z","updated_at":"0001-01-01T00:00:00Z"}`,
	`{"name":"n","kind":"K","scope":{"org":"","team":"","employee":""},"labels":{},"spec":null,"revision":1,"created_at":"0001-01-01T00:00:00Z","updated_at":"0001-01-01T00:00:00Z"}`,
	`{"name":"s","kind":"K","scope":{"org":"a","team":"b","employee":"c"},"spec":{"a":[1,-0,2.5e+10,-3E-2,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9 \u003c"],"b":{"c":{"d":[[],{}]}},"é":"\u2028"},"revision":18446744073709551615,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"s","kind":"K","scope":{"org":"a","team":"b","employee":"c"},"spec":[ 1 , { "a" : 2 } ],"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	// Near misses: each must fall back, and json.Unmarshal decides.
	`{"name":"esc\u0041","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":18446744073709551616,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":01,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{"a":01},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{"a":1,},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{"a":"\x"},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{"a":tru},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":1,"created_at":"2025-13-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"} `,
	`{"kind":"K","name":"x","scope":{},"spec":{},"revision":1}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z","extra":1}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":"\u12"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":-,"revision":1}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":1.e5,"revision":1}`,
	`{"name":"\u00ff","kind":"K"}`,
	`{"name":"` + "\xff" + `","kind":"K","scope":{"org":"","team":"","employee":""},"spec":{},"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":"` + "\xff\x7f" + `","revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
	`null`,
	``,
}

func TestDecodeStoredMatchesUnmarshal(t *testing.T) {
	deep := `{"name":"x","kind":"K","scope":{"org":"","team":"","employee":""},"spec":` +
		strings.Repeat("[", maxFastDepth+1) + strings.Repeat("]", maxFastDepth+1) +
		`,"revision":1,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`
	for i, s := range append(storedSeeds, deep) {
		t.Run(strings.TrimSpace(s[:min(len(s), 40)])+"#"+string(rune('a'+i%26)), func(t *testing.T) {
			checkStoredEquivalent(t, []byte(s))
		})
	}
}

// TestDecodeStoredFastPath checks that what the cluster itself writes takes
// the fast path: otherwise the speed-up silently disappears.
func TestDecodeStoredFastPath(t *testing.T) {
	ts := time.Date(2025, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	tests := []struct {
		name string
		p    Policy
	}{
		{"full", Policy{Name: "acme.deny", Kind: KindToolPolicy, Scope: Scope{Org: "acme", Team: "t", Employee: "e@acme.com"},
			Labels: map[string]string{"tier": "prod", "a": ""}, Spec: json.RawMessage(`{"a":[1,2,{"b":"c\n"}]}`),
			Revision: 7, CreatedAt: ts, UpdatedAt: ts.Add(time.Hour)}},
		{"command", Policy{Name: "g", Kind: "RateLimit", Spec: json.RawMessage(`{}`)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := tc.p.AppendJSON(nil)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := decodeStoredFast(raw)
			if !ok {
				t.Fatalf("fast path refused AppendJSON's output %s", raw)
			}
			if diff := cmp.Diff(&tc.p, got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
				t.Errorf("decoded policy differs (-want +got):\n%s", diff)
			}
			canon, err := tc.p.Canonical()
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := decodeStoredFast(canon); !ok {
				t.Errorf("fast path refused Canonical's output %s", canon)
			}
		})
	}
}

// checkStoredEquivalent fails unless DecodeStored and json.Unmarshal agree
// on data: both fail, or both give the same policy.
func checkStoredEquivalent(t *testing.T, data []byte) {
	t.Helper()
	var want Policy
	wantErr := json.Unmarshal(data, &want)
	got, err := DecodeStored(append([]byte(nil), data...))
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("DecodeStored error %v, json.Unmarshal error %v, for %q", err, wantErr, data)
	}
	if err != nil {
		return
	}
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Fatalf("DecodeStored differs from json.Unmarshal for %q (-want +got):\n%s", data, diff)
	}
}

// FuzzDecodeStored checks that DecodeStored always agrees with
// json.Unmarshal, which is what lets every replica use it on the apply path.
// The second input is placed as the spec of a policy in the stored layout,
// so that the fuzzer explores the fast path's JSON validation too.
//
//	go test ./policy/ -run '^$' -fuzz '^FuzzDecodeStored$' -fuzztime 60s
func FuzzDecodeStored(f *testing.F) {
	for _, s := range storedSeeds {
		f.Add([]byte(s), []byte(`{"a":[1,"b",{"c":null}]}`))
	}
	for _, spec := range []string{`{}`, `[]`, `"\u00e9\n"`, `-0.5e-3`, `true`, `{"a":01}`, `[1,]`, `{"a" : [ ]}`, "\"\xff\"", `nul`} {
		f.Add([]byte(nil), []byte(spec))
	}
	f.Fuzz(func(t *testing.T, data, spec []byte) {
		checkStoredEquivalent(t, data)
		wrapped := `{"name":"x","kind":"K","scope":{"org":"o","team":"","employee":""},"labels":{"k":"v"},"spec":` +
			string(spec) + `,"revision":3,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`
		checkStoredEquivalent(t, []byte(wrapped))
	})
}

func BenchmarkDecodeStored4K(b *testing.B) {
	raw := storedPolicy4K(b)
	b.Run("DecodeStored", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if _, err := DecodeStored(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			var p Policy
			if err := json.Unmarshal(raw, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// storedPolicy4K is a ToolPolicy of about 4 KB in stored form, like the
// benchmark harness writes.
func storedPolicy4K(tb testing.TB) []byte {
	tb.Helper()
	var patterns []string
	for i := 0; len(strings.Join(patterns, `","`)) < 3900; i++ {
		patterns = append(patterns, "^cmd-"+strings.Repeat("x", 20)+"-"+string(rune('a'+i%26))+"$")
	}
	spec, err := json.Marshal(map[string]any{"tool_name": "Bash", "action": "deny", "reason": "bench", "conditions": map[string]any{"patterns": patterns}})
	if err != nil {
		tb.Fatal(err)
	}
	ts := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	p := Policy{Name: "acme.bench-1", Kind: KindToolPolicy, Scope: Scope{Org: "acme"}, Labels: map[string]string{"w": "1"},
		Spec: spec, Revision: 123456, CreatedAt: ts, UpdatedAt: ts}
	raw, err := p.AppendJSON(nil)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// TestHasControl checks the word-at-a-time test against the plain one for
// every byte value at every position of the word and of the tail.
func TestHasControl(t *testing.T) {
	for _, n := range []int{1, 7, 8, 9, 17} {
		t.Run(strings.Repeat("x", n), func(t *testing.T) {
			for pos := range n {
				for c := range 256 {
					s := []byte(strings.Repeat("a", n))
					s[pos] = byte(c)
					if got, want := hasControl(s), c < 0x20; got != want {
						t.Fatalf("hasControl(%q) = %v, want %v", s, got, want)
					}
				}
			}
		})
	}
}
