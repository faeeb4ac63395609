package policy

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// Run longer with:
//
//	go test ./policy/ -run '^$' -fuzz '^FuzzDecodePolicy$' -fuzztime 60s
//	go test ./policy/ -run '^$' -fuzz '^FuzzDecodeEmployee$' -fuzztime 60s

// FuzzDecodePolicy checks that decoding and validating never panic, and that
// a policy that passes both has a stable canonical form: decoding its
// canonical bytes gives a valid policy with the same canonical bytes. Every
// replica relies on that when it stores and hashes policies.
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
		`{"name":"x","unknown":1}`,
		`{"name":"x"} trailing`,
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
		if strictErr == nil {
			// DecodeStrict must be at least as strict as encoding/json, and
			// agree with it on what it accepts.
			var loose Policy
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&loose); err != nil {
				t.Fatalf("DecodeStrict accepted what encoding/json rejects (%v)", err)
			}
			if !reflect.DeepEqual(strict, loose) {
				t.Fatalf("DecodeStrict = %+v, encoding/json = %+v", strict, loose)
			}
		}

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
