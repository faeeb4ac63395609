package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/policy"
)

func TestPolicyBody(t *testing.T) {
	v, err := policy.NewValidator(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		seq  uint64
		size int
	}{
		{"bench-w0-0", 0, minBodySize("bench-w0-0")},
		{"bench-w0-0", 7, 4096},
		{"bench-w99-9", 123456789012, 4096},
		{"bench-w12345-999", 42, 65536},
	} {
		body := policyBody(nil, tc.name, tc.seq, tc.size)
		if len(body) != tc.size {
			t.Errorf("%s/%d: len = %d, want %d", tc.name, tc.size, len(body), tc.size)
		}
		if !json.Valid(body) {
			t.Fatalf("%s/%d: invalid JSON: %s", tc.name, tc.size, body)
		}
		p, err := policy.DecodePolicy(body)
		if err != nil {
			t.Fatalf("%s/%d: DecodePolicy: %v", tc.name, tc.size, err)
		}
		if err := v.Policy(p); err != nil {
			t.Errorf("%s/%d: Validator.Policy: %v", tc.name, tc.size, err)
		}
		if p.Name != tc.name {
			t.Errorf("name = %q, want %q", p.Name, tc.name)
		}
		if !strings.Contains(string(p.Spec), "bench write ") {
			t.Errorf("spec %s lacks the sequence number", p.Spec)
		}
	}
}

func TestWritesConfigValidate(t *testing.T) {
	good := writesConfig{writers: 100, duration: 1, keys: 10, valueSize: 4096, timeout: 1}
	if err := good.validate(); err != nil {
		t.Errorf("validate(%+v) = %v", good, err)
	}
	for name, mutate := range map[string]func(*writesConfig){
		"no writers":      func(c *writesConfig) { c.writers = 0 },
		"no duration":     func(c *writesConfig) { c.duration = 0 },
		"negative warmup": func(c *writesConfig) { c.warmup = -1 },
		"no keys":         func(c *writesConfig) { c.keys = 0 },
		"tiny body":       func(c *writesConfig) { c.valueSize = 100 },
		"huge body":       func(c *writesConfig) { c.valueSize = 2 << 20 },
		"no timeout":      func(c *writesConfig) { c.timeout = 0 },
	} {
		c := good
		mutate(&c)
		if err := c.validate(); err == nil {
			t.Errorf("%s: validate(%+v) = nil, want an error", name, c)
		}
	}
}
