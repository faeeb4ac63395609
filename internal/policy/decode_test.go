package policy

import (
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDecodeStrictErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []FieldError // exact
	}{
		{name: "unknown field", in: `{"name":"a","foo":1}`,
			want: []FieldError{fe("foo", "unknown field")}},
		{name: "unknown fields", in: `{"foo":1,"name":"a","bar":{"x":[1]}}`,
			want: []FieldError{fe("foo", "unknown field"), fe("bar", "unknown field")}},
		{name: "nested unknown field", in: `{"name":"a","scope":{"org":"acme","tenant":"x"}}`,
			want: []FieldError{fe("scope.tenant", "unknown field")}},
		{name: "field name case must match", in: `{"Name":"a"}`,
			want: []FieldError{fe("Name", "unknown field")}},
		{name: "duplicate field", in: `{"name":"a","kind":"ToolPolicy","name":"b"}`,
			want: []FieldError{fe("name", "duplicate field")}},
		{name: "wrong type", in: `{"name":["a"]}`,
			want: []FieldError{fe("name", "expected string, got array")}},
		{name: "wrong type nested", in: `{"scope":{"org":1}}`,
			want: []FieldError{fe("scope.org", "expected string, got number")}},
		{name: "wrong type object", in: `{"scope":"acme"}`,
			want: []FieldError{fe("scope", "expected object, got string")}},
		{name: "wrong type map value", in: `{"labels":{"tier":true}}`,
			want: []FieldError{fe(`labels["tier"]`, "expected string, got boolean")}},
		{name: "negative revision", in: `{"revision":-1}`,
			want: []FieldError{fe("revision", "expected non-negative integer, got number -1")}},
		{name: "fractional revision", in: `{"revision":1.5}`,
			want: []FieldError{fe("revision", "expected non-negative integer, got number 1.5")}},
		{name: "huge revision", in: `{"revision":18446744073709551616}`,
			want: []FieldError{fe("revision", "number 18446744073709551616 out of range for non-negative integer")}},
		{name: "bad time", in: `{"created_at":"yesterday"}`,
			want: []FieldError{fe("created_at", `expected RFC 3339 time, got "yesterday"`)}},
		{name: "time wrong type", in: `{"updated_at":0}`,
			want: []FieldError{fe("updated_at", "expected RFC 3339 time string, got number")}},
		{name: "all problems", in: `{"nme":"a","scope":{"org":1,"x":2},"labels":[]}`,
			want: []FieldError{fe("nme", "unknown field"), fe("scope.org", "expected string, got number"), fe("scope.x", "unknown field"), fe("labels", "expected object, got array")}},
		{name: "not an object", in: `[1]`,
			want: []FieldError{fe("", "expected object, got array")}},
		{name: "trailing data", in: `{"name":"a"} x`,
			want: []FieldError{fe("", "unexpected data after the JSON value at offset 13")}},
		{name: "second value", in: "{\"name\":\"a\"}\n{}",
			want: []FieldError{fe("", "unexpected data after the JSON value at offset 13")}},
		{name: "syntax error", in: `{"name":"a",}`,
			want: []FieldError{fe("", "invalid JSON at offset 12: invalid character '}' looking for beginning of object key string")}},
		{name: "syntax error in spec", in: `{"spec":{"a":[1,]}}`,
			want: []FieldError{fe("", "invalid JSON at offset 16: invalid character ']' looking for beginning of value")}},
		{name: "syntax error after field errors", in: `{"foo":1,"name":x}`,
			want: []FieldError{fe("", "invalid JSON at offset 16: invalid character 'x' looking for beginning of value")}},
		{name: "truncated", in: `{"name":"a"`,
			want: []FieldError{fe("", "invalid JSON at offset 11: unexpected end of input")}},
		{name: "truncated string", in: `{"name":"a`,
			want: []FieldError{fe("", "invalid JSON at offset 10: unexpected end of input")}},
		{name: "bare word", in: `policy`,
			want: []FieldError{fe("", "invalid JSON at offset 0: invalid character 'p' looking for beginning of value")}},
		{name: "empty body", in: ``,
			want: []FieldError{fe("", "empty body: expected a JSON value")}},
		{name: "blank body", in: " \n\t ",
			want: []FieldError{fe("", "empty body: expected a JSON value")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p Policy
			err := DecodeStrict([]byte(tc.in), &p)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeStrict error = %v, want one wrapping ErrInvalid", err)
			}
			var got ValidationError
			if !errors.As(err, &got) {
				t.Fatalf("error %T is not a ValidationError", err)
			}
			if diff := cmp.Diff(ValidationError(tc.want), got); diff != "" {
				t.Fatalf("errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeStrictErrorString(t *testing.T) {
	var p Policy
	err := DecodeStrict([]byte(`{"foo":1,"scope":{"org":1}}`), &p)
	if got, want := err.Error(), "foo: unknown field; scope.org: expected string, got number"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

func TestDecodeStrictNotAPointer(t *testing.T) {
	var p Policy
	for _, v := range []any{p, (*Policy)(nil), nil} {
		err := DecodeStrict([]byte(`{}`), v)
		if err == nil || errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeStrict(%T) error = %v, want a programming error", v, err)
		}
	}
}

func TestDecodeStrictNull(t *testing.T) {
	p := Policy{Name: "kept"}
	if err := DecodeStrict([]byte(`{"scope":null,"labels":null,"kind":null}`), &p); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Policy{Name: "kept"}, p); diff != "" {
		t.Fatalf("null changed the policy (-want +got):\n%s", diff)
	}
}

// strictTarget exercises the Go types DecodeStrict supports beyond Policy.
type strictTarget struct {
	Embedded
	*EmbeddedPtr
	Plain    string            `json:"plain"`
	Untagged int               // no tag: the Go name is the JSON name
	Skipped  string            `json:"-"`
	Quoted   int64             `json:"quoted,string"`
	Small    int8              `json:"small"`
	Ratio    float32           `json:"ratio"`
	Flag     bool              `json:"flag"`
	Ptr      *string           `json:"ptr"`
	Any      any               `json:"any"`
	Raw      json.RawMessage   `json:"raw"`
	Bytes    []byte            `json:"bytes"`
	Pair     [2]int            `json:"pair"`
	ByID     map[int]string    `json:"by_id"`
	Addr     netip.Addr        `json:"addr"`
	When     time.Time         `json:"when"`
	Nested   []map[string]bool `json:"nested"`
	private  string
}

// Embedded fields are promoted, as encoding/json does.
type Embedded struct {
	Inner string `json:"inner"`
}

// EmbeddedPtr is promoted through a pointer.
type EmbeddedPtr struct {
	Deep string `json:"deep"`
}

func TestDecodeStrictTypes(t *testing.T) {
	good := `{"inner":"i","deep":"d","plain":"p","Untagged":3,"quoted":"42","small":-128,"ratio":1.5,"flag":true,
		"ptr":"s","any":{"x":[1,2]},"raw":[true],"bytes":"aGk=","pair":[1,2],"by_id":{"7":"seven"},
		"addr":"10.0.0.1","when":"2025-01-02T03:04:05Z","nested":[{"a":true}]}`
	var got strictTarget
	if err := DecodeStrict([]byte(good), &got); err != nil {
		t.Fatalf("DecodeStrict: %v", err)
	}
	s := "s"
	want := strictTarget{
		Embedded: Embedded{Inner: "i"}, EmbeddedPtr: &EmbeddedPtr{Deep: "d"},
		Plain: "p", Untagged: 3, Quoted: 42, Small: -128, Ratio: 1.5, Flag: true, Ptr: &s,
		Any: map[string]any{"x": []any{1.0, 2.0}}, Raw: json.RawMessage(`[true]`), Bytes: []byte("hi"),
		Pair: [2]int{1, 2}, ByID: map[int]string{7: "seven"}, Addr: netip.MustParseAddr("10.0.0.1"),
		When: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Nested: []map[string]bool{{"a": true}},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(strictTarget{}), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("decoded mismatch (-want +got):\n%s", diff)
	}

	tests := []struct {
		name string
		in   string
		want []FieldError
	}{
		{name: "skipped field is unknown", in: `{"Skipped":"x"}`, want: []FieldError{fe("Skipped", "unknown field")}},
		{name: "unexported field is unknown", in: `{"private":"x"}`, want: []FieldError{fe("private", "unknown field")}},
		{name: "quoted needs string", in: `{"quoted":42}`, want: []FieldError{fe("quoted", "expected string containing a integer, got number")}},
		{name: "quoted bad number", in: `{"quoted":"4x"}`, want: []FieldError{fe("quoted", "expected integer, got number 4x")}},
		{name: "int8 overflow", in: `{"small":128}`, want: []FieldError{fe("small", "number 128 out of range for integer")}},
		{name: "int with exponent", in: `{"Untagged":1e3}`, want: []FieldError{fe("Untagged", "expected integer, got number 1e3")}},
		{name: "float32 overflow", in: `{"ratio":1e39}`, want: []FieldError{fe("ratio", "number 1e39 out of range for number")}},
		{name: "bool wrong type", in: `{"flag":"true"}`, want: []FieldError{fe("flag", "expected boolean, got string")}},
		{name: "bad base64", in: `{"bytes":"!!"}`, want: []FieldError{fe("bytes", "expected base64 string: illegal base64 data at input byte 0")}},
		{name: "array too long", in: `{"pair":[1,2,3]}`, want: []FieldError{fe("pair", "at most 2 elements, got 3")}},
		{name: "array element", in: `{"pair":[1,"2"]}`, want: []FieldError{fe("pair[1]", "expected integer, got string")}},
		{name: "map int key", in: `{"by_id":{"x":"y"}}`, want: []FieldError{fe(`by_id["x"]`, "expected integer, got number x")}},
		{name: "text unmarshaler", in: `{"addr":"not-an-ip"}`, want: []FieldError{fe("addr", `ParseAddr("not-an-ip"): unable to parse IP`)}},
		{name: "nested map in slice", in: `{"nested":[{"a":true},{"b":1}]}`, want: []FieldError{fe(`nested[1]["b"]`, "expected boolean, got number")}},
		{name: "embedded field type", in: `{"inner":1,"deep":2}`, want: []FieldError{fe("inner", "expected string, got number"), fe("deep", "expected string, got number")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v strictTarget
			err := DecodeStrict([]byte(tc.in), &v)
			if v.private != "" {
				t.Fatal("decoded into an unexported field")
			}
			var got ValidationError
			if !errors.As(err, &got) {
				t.Fatalf("error = %v, want a ValidationError", err)
			}
			if diff := cmp.Diff(ValidationError(tc.want), got); diff != "" {
				t.Fatalf("errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodePolicy(t *testing.T) {
	in := `{"name":"acme.deny-shell","kind":"ToolPolicy","scope":{"org":"acme","team":"","employee":""},
		"labels":{"tier":"prod"},
		"spec":{"tool_name":"Bash","action":"deny","reason":"Shell commands blocked","conditions":{"patterns":["rm -rf"]}},
		"revision":42,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-03T03:04:05Z"}`
	got, err := DecodePolicy([]byte(in))
	if err != nil {
		t.Fatalf("DecodePolicy: %v", err)
	}
	want := &Policy{
		Name:   "acme.deny-shell",
		Kind:   KindToolPolicy,
		Scope:  Scope{Org: "acme"},
		Labels: map[string]string{"tier": "prod"},
		Spec:   json.RawMessage(`{"tool_name":"Bash","action":"deny","reason":"Shell commands blocked","conditions":{"patterns":["rm -rf"]}}`),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("policy mismatch (-want +got):\n%s", diff)
	}
	if err := newTestValidator(t).Policy(got); err != nil {
		t.Fatalf("Validate: %v", err)
	}

	if _, err := DecodePolicy([]byte(`{"name":"a","extra":1}`)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("DecodePolicy with unknown field error = %v, want ErrInvalid", err)
	}
}

func TestDecodeEmployee(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want *Employee
	}{
		{name: "defaults to active", in: `{"id":"alice","org":"acme"}`,
			want: &Employee{ID: "alice", Org: "acme", Status: StatusActive}},
		{name: "keeps inactive", in: `{"id":"alice","org":"acme","team":"platform","status":"inactive"}`,
			want: &Employee{ID: "alice", Org: "acme", Team: "platform", Status: StatusInactive}},
		{name: "zeroes managed fields", in: `{"id":"alice","org":"acme","status":"active","revision":7,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
			want: &Employee{ID: "alice", Org: "acme", Status: StatusActive}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeEmployee([]byte(tc.in))
			if err != nil {
				t.Fatalf("DecodeEmployee: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("employee mismatch (-want +got):\n%s", diff)
			}
		})
	}

	_, err := DecodeEmployee([]byte(`{"id":"alice","org":"acme","active":true}`))
	checkFieldErrors(t, err, []FieldError{fe("active", "unknown field")})
}

func TestDecodeStrictDepthLimit(t *testing.T) {
	// encoding/json refuses nesting deeper than 10000; DecodeStrict reports
	// it as a syntax error rather than recursing.
	in := `{"spec":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`
	var p Policy
	err := DecodeStrict([]byte(in), &p)
	var got ValidationError
	if !errors.As(err, &got) || len(got) != 1 || got[0].Field != "" ||
		!strings.HasPrefix(got[0].Reason, "invalid JSON at offset ") || !strings.Contains(got[0].Reason, "exceeded max depth") {
		t.Fatalf("error = %v, want a depth error", err)
	}
}

func TestDecodeStrictPastErrors(t *testing.T) {
	deep := strings.Repeat("[", 3000) + `{"a":1,"a":2}` + strings.Repeat("]", 3000)
	tests := []struct {
		name string
		in   string
		want []FieldError
	}{
		{name: "duplicate then unknown", in: `{"name":"a","name":"b","foo":1,"name":"c"}`,
			want: []FieldError{fe("name", "duplicate field"), fe("foo", "unknown field"), fe("name", "duplicate field")}},
		{name: "duplicate in spec", in: `{"spec":{"a":[{"b":1,"b":2}],"a":3}}`,
			want: []FieldError{fe("spec.a[0].b", "duplicate field"), fe("spec.a", "duplicate field")}},
		{name: "duplicate label", in: `{"labels":{"a":"1","a":"2"}}`,
			want: []FieldError{fe(`labels["a"]`, "duplicate field")}},
		{name: "duplicate deep in spec", in: `{"spec":` + deep + `}`,
			want: []FieldError{fe("spec"+strings.Repeat("[0]", 3000)+".a", "duplicate field")}},
		{name: "invalid UTF-8", in: "{\"kind\":1,\"name\":\"\xff\"}",
			want: []FieldError{fe("kind", "expected string, got number"), fe("name", "invalid UTF-8")}},
		{name: "too many errors", in: `{"x0":0` + strings.Repeat(`,"x":0`, 30) + `}`,
			want: append([]FieldError{fe("x0", "unknown field")}, slices.Repeat([]FieldError{fe("x", "unknown field")}, maxFieldErrors-1)...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p Policy
			err := DecodeStrict([]byte(tc.in), &p)
			var got ValidationError
			if !errors.As(err, &got) {
				t.Fatalf("error = %v, want a ValidationError", err)
			}
			if diff := cmp.Diff(ValidationError(tc.want), got); diff != "" {
				t.Fatalf("errors mismatch (-want +got):\n%s", diff)
			}
		})
	}

	// Array elements in error are decoded past without moving the later ones.
	var s ToolPolicySpec
	err := DecodeStrict([]byte(`{"conditions":{"patterns":[1,"ok",true]},"action":{}}`), &s)
	checkFieldErrors(t, err, []FieldError{
		fe("conditions.patterns[0]", "expected string, got number"),
		fe("conditions.patterns[2]", "expected string, got boolean"),
		fe("action", "expected string, got object"),
	})
}
