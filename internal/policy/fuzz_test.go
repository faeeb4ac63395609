package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// Run longer with:
//
//	go test ./internal/policy/ -run '^$' -fuzz '^FuzzDecodePolicy$' -fuzztime 60s
//	go test ./internal/policy/ -run '^$' -fuzz '^FuzzDecodeStrict$' -fuzztime 60s
//	go test ./internal/policy/ -run '^$' -fuzz '^FuzzDecodeEmployee$' -fuzztime 60s
//	go test ./internal/policy/ -run '^$' -fuzz '^FuzzCanonical$' -fuzztime 60s

// FuzzDecodePolicy checks that decoding and validating never panic, that
// DecodeStrict accepts exactly what a reference accepts (see
// checkAgainstReference), and that a policy that passes both has a stable
// canonical form: decoding its canonical bytes gives a valid policy with the
// same canonical bytes. Every replica relies on that when it stores and
// hashes policies.
func FuzzDecodePolicy(f *testing.F) {
	for _, s := range []string{
		`{"name":"acme.deny-shell","kind":"ToolPolicy","scope":{"org":"acme","team":"","employee":""},"labels":{"tier":"prod"},"spec":{"tool_name":"Bash","action":"deny","reason":"Shell commands blocked","conditions":{"patterns":["rm -rf"]}},"revision":42,"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`,
		`{"name":"global-audit","kind":"ToolPolicy","scope":{},"spec":{"tool_name":"Write","action":"audit"}}`,
		`{"name":"team.allow","kind":"ToolPolicy","scope":{"org":"acme","team":"platform"},"spec":{"tool_name":"Bash","action":"allow","conditions":{"patterns":["^git (status|log)$","\\bls\\b"]}}}`,
		`{"name":"vp","kind":"ValidatingPolicy","scope":{"org":"acme","employee":"alice@acme.com"},"spec":{"validations":[{"expression":"object.spec.replicas <= 5","message":"too many","reason":"Invalid"}]}}`,
		`{"name":"rl","kind":"RateLimit","spec":{"rps":123456789012345678901234567890,"z":{"b":1,"a":[1.50,"<&>"]}}}`,
		`{"name":"bad","kind":"ToolPolicy","spec":{"tool_name":"Bash","action":"deny","conditions":{"patterns":["("]}}}`,
		`{"name":"Bad Name","kind":"Nope","scope":{"team":"x"},"spec":[]}`,
		`{"name":"x","kind":"ValidatingPolicy","spec":{"validations":[{"expression":"1 +","message":""}]}}`,
		`{"name":"vp-http","kind":"ValidatingPolicy","scope":{"org":"acme"},"spec":{"matchConditions":[{"name":"http-only","expression":"has(request.method)"},{"name":"not.health","expression":"request.path != '/healthz'"}],"validations":[{"expression":"request.method == 'GET'","message":"only GET"}]}}`,
		`{"name":"x","kind":"ValidatingPolicy","spec":{"matchConditions":[{"name":"a","expression":"1"},{"name":"a","expression":""},{"name":"-","expression":"true","extra":1}],"validations":[{"expression":"true","message":"m"}]}}`,
		`{"name":"x","unknown":1}`,
		`{"name":"x"} trailing`,
		`{"name":"x","name":"y"}`,
		`{"Name":"x","Scope":{"ORG":"a"}}`,
		`{"name":"x","spec":{"a":1,"a":2}}`,
		`{"name":"x","spec":null,"labels":null}`,
		`{"name":"\ud800","labels":{"k":"` + "\xff" + `"}}`,
		`{"foo":1,"scope":{"org":1,"x":[1,{"y":2}]},"labels":{"a":true,"a":1},"revision":-1,"created_at":"x"}`,
		`{"name":`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	v, err := NewValidator([]string{"RateLimit"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var strict Policy
		strictErr := DecodeStrict(data, &strict)
		checkAgainstReference(t, data, &strict, strictErr)

		p, err := DecodePolicy(data)
		if (err == nil) != (strictErr == nil) {
			t.Fatalf("DecodePolicy error = %v, DecodeStrict error = %v", err, strictErr)
		}
		if err != nil {
			return
		}
		if err := v.Policy(p); err != nil {
			return
		}
		c1, err := p.Canonical()
		if err != nil {
			t.Fatalf("Canonical of a valid policy: %v", err)
		}
		p2, err := DecodePolicy(c1)
		if err != nil {
			t.Fatalf("DecodePolicy(canonical %s): %v", c1, err)
		}
		if err := v.Policy(p2); err != nil {
			t.Fatalf("canonical policy %s is invalid: %v", c1, err)
		}
		c2, err := p2.Canonical()
		if err != nil {
			t.Fatalf("Canonical of the re-decoded policy: %v", err)
		}
		if !bytes.Equal(c1, c2) {
			t.Fatalf("canonical form not stable:\n%s\n%s", c1, c2)
		}
		// The FSM stores canonical policies with AppendJSON.
		if a, err := p2.AppendJSON(nil); err != nil || !bytes.Equal(a, c2) {
			t.Fatalf("AppendJSON = %s (%v), json.Marshal = %s", a, err, c2)
		}
	})
}

// FuzzDecodeEmployee checks that decoding and validating an employee never
// panic, and that a valid employee survives a JSON round trip.
func FuzzDecodeEmployee(f *testing.F) {
	for _, s := range []string{
		`{"id":"alice@acme.com","org":"acme","team":"platform","status":"active"}`,
		`{"id":"bob","org":"acme"}`,
		`{"id":"carol","org":"acme","status":"inactive","revision":3,"created_at":"2025-01-02T03:04:05Z"}`,
		`{"id":"","org":"ACME","status":"gone"}`,
		`{"id":"x","org":"acme","extra":true}`,
		`{"id":1}`,
		`{"id":"x"`,
		`null`,
		``,
	} {
		f.Add([]byte(s))
	}
	v, err := NewValidator(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := DecodeEmployee(data)
		if err != nil {
			return
		}
		if err := v.Employee(e); err != nil {
			return
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatalf("marshal valid employee: %v", err)
		}
		e2, err := DecodeEmployee(b)
		if err != nil {
			t.Fatalf("DecodeEmployee(%s): %v", b, err)
		}
		if err := v.Employee(e2); err != nil {
			t.Fatalf("round-tripped employee %s is invalid: %v", b, err)
		}
		if *e != *e2 {
			t.Fatalf("round trip changed the employee: %+v -> %+v", *e, *e2)
		}
	})
}

// checkAgainstReference fails if DecodeStrict's result for data (got and
// err, decoded into a T) disagrees with encoding/json's with unknown fields
// refused. DecodeStrict must reject all that encoding/json rejects, and
// decode the same value from the rest; it must accept the rest unless data
// has what only it refuses: duplicate names, invalid UTF-8, a name that
// matches a field only case-insensitively, or a Go array that is too short.
// Its errors are ValidationErrors.
func checkAgainstReference[T any](t *testing.T, data []byte, got *T, err error) {
	t.Helper()
	if err != nil {
		var ve ValidationError
		if !errors.As(err, &ve) || len(ve) == 0 || len(ve) > maxFieldErrors {
			t.Fatalf("DecodeStrict error %#v: want a ValidationError of 1 to %d field errors", err, maxFieldErrors)
		}
	}
	var want T
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	refErr := dec.Decode(&want)
	if refErr == nil {
		if _, tokErr := dec.Token(); tokErr != io.EOF {
			refErr = errors.New("data after the value")
		}
	}
	switch {
	case err == nil && refErr != nil:
		t.Fatalf("DecodeStrict accepted %q, which encoding/json rejects (%v)", data, refErr)
	case err == nil && !reflect.DeepEqual(*got, want):
		t.Fatalf("DecodeStrict = %+v, encoding/json = %+v", *got, want)
	case err != nil && refErr == nil && jsontext.Value(data).IsValid() && !foldedName(data, reflect.TypeFor[T]()) && !shortArray(err):
		t.Fatalf("DecodeStrict rejected %q, which encoding/json accepts: %v", data, err)
	}
}

// shortArray reports whether err is only about Go arrays that are too
// short, which encoding/json fills up with zeros.
func shortArray(err error) bool {
	var ve ValidationError
	return errors.As(err, &ve) && !slices.ContainsFunc(ve, func(fe FieldError) bool {
		return !strings.HasPrefix(fe.Reason, "at least ")
	})
}

// foldedName reports whether an object member name in data differs from a
// JSON field name of t (or of a struct type in its fields) but matches it
// case-insensitively, as encoding/json allows.
func foldedName(data []byte, t reflect.Type) bool {
	var names []string
	var collect func(reflect.Type, map[reflect.Type]bool)
	collect = func(t reflect.Type, seen map[reflect.Type]bool) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			names = append(names, name)
			collect(f.Type, seen)
		}
	}
	collect(t, map[reflect.Type]bool{})
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	for {
		parent, n := dec.StackIndex(dec.StackDepth())
		tok, err := dec.ReadToken()
		if err != nil {
			return false
		}
		if parent != '{' || n%2 != 0 || tok.Kind() != '"' {
			continue
		}
		for _, name := range names {
			if s := tok.String(); s != name && strings.EqualFold(s, name) {
				return true
			}
		}
	}
}

// FuzzDecodeStrict runs DecodeStrict on a target of every Go type it
// supports, against the same reference as FuzzDecodePolicy.
func FuzzDecodeStrict(f *testing.F) {
	for _, s := range []string{
		`{"inner":"i","deep":"d","plain":"p","Untagged":3,"quoted":"42","small":-128,"ratio":1.5,"flag":true,"ptr":"s","any":{"x":[1,2]},"raw":[true],"bytes":"aGk=","pair":[1,2],"by_id":{"7":"seven"},"addr":"10.0.0.1","when":"2025-01-02T03:04:05Z","nested":[{"a":true}]}`,
		`{"Skipped":"x","private":"x","quoted":42,"small":128,"Untagged":1e3,"ratio":1e39,"flag":"true","bytes":"!!"}`,
		`{"pair":[1,"2",3],"by_id":{"x":"y"},"addr":"not-an-ip","nested":[{"a":true},{"b":1}],"inner":1,"deep":2}`,
		`{"raw":{"a":[1,{"b":1,"b":2}]},"any":[{"c":1,"c":1}]}`,
		`{"when":"2025-13-01T00:00:00Z","pair":[1]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v strictTarget
		checkAgainstReference(t, data, &v, DecodeStrict(data, &v))
	})
}

// FuzzCanonical checks canonicalJSON, which formats with jsontext, against
// canonicalMarshal, which defines the canonical form.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		`{"tool_name":"Bash","action":"deny","reason":"x"}`,
		` { "b" : [ 1 , -0.50e+3 , true , false , null , { } , [ ] ] , "a" : { "d" : "x" , "c" : 1 } } `,
		`{"rps":123456789012345678901234567890}`,
		`[]`, `"s"`, `12`, `-0`,
		`{"a":1,"a":2}`,
		`{"a":"<b>&amp;","<":1,"\u2028":"\u2029\u007f\u0000\u001f\b\f\n\r\t\"\\\/"}`,
		`{"a":"\u0041\u00e9","é":1,"e":2}`,
		`{"\ue000":1,"\ud83d\ude00":2}`,
		"{\"\xff\":1,\"a\":\"\xfe\"}",
		`{"a":"\ud800"}`,
		`{"a":01}`, `{"a":1,}`, `{"a":1} x`, `{"a":1}{}`, `[1 2]`, `nul`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(bytes.TrimSpace(raw)) == 0 {
			return // "{}" by definition
		}
		want, wantErr := canonicalMarshal(raw)
		got, err := canonicalJSON(raw)
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("canonicalJSON(%q) = %s, %v; canonicalMarshal = %s, %v", raw, got, err, want, wantErr)
		}
	})
}
