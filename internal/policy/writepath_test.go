package policy

import (
	"fmt"
	"strings"
	"testing"
)

// writeBodies are 4 KB request bodies in the shapes the REST PUT takes.
func writeBodies() map[string][]byte {
	var vals []string
	for i := range 4 {
		vals = append(vals, fmt.Sprintf(`{"expression":"object.spec.replicas <= %d && request.user != 'bot'","message":"%s","reason":"Invalid"}`,
			i+1, strings.Repeat("m", 900)))
	}
	return map[string][]byte{
		"ToolPolicy": []byte(`{"name":"bench-w1-1","kind":"ToolPolicy","scope":{"org":"bench"},"labels":{"bench":"writes"},"spec":{"tool_name":"Bash","action":"deny","reason":"` +
			strings.Repeat("x", 3900) + `"}}`),
		"ValidatingPolicy": []byte(`{"name":"bench-v1-1","kind":"ValidatingPolicy","scope":{"org":"bench"},"labels":{"bench":"writes"},"spec":{"validations":[` +
			strings.Join(vals, ",") + `]}}`),
	}
}

// BenchmarkWritePath4K times the REST PUT's decode, validation and
// canonicalisation of a 4 KB ToolPolicy, the body the bench harness sends.
func BenchmarkWritePath4K(b *testing.B) {
	body := writeBodies()["ToolPolicy"]
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

// BenchmarkWriteSteps times each step of the REST PUT's decode, validate and
// canonicalise, for a ToolPolicy and a ValidatingPolicy.
func BenchmarkWriteSteps(b *testing.B) {
	v, err := NewValidator(nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, kind := range []string{"ToolPolicy", "ValidatingPolicy"} {
		body := writeBodies()[kind]
		p, err := DecodePolicy(body)
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Policy(p); err != nil {
			b.Fatal(err)
		}
		b.Run(kind+"/decode", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := DecodePolicy(body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(kind+"/validate", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := v.Policy(p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(kind+"/canonical", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := p.Canonical(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(kind+"/all", func(b *testing.B) {
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
		})
	}
}
