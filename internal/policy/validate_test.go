package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// newTestValidator returns a Validator that also accepts the extra kind
// "RateLimit".
func newTestValidator(t testing.TB) *Validator {
	t.Helper()
	v, err := NewValidator([]string{"RateLimit"})
	if err != nil {
		t.Fatalf("NewValidator: %v", err)
	}
	return v
}

// checkFieldErrors compares err with want: the same fields in the same
// order, and each reason starting with the wanted one (compiler messages
// come from libraries and may change wording at the end).
func checkFieldErrors(t *testing.T, err error, want []FieldError) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("got error %v, want none", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("got no error, want %v", ValidationError(want))
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
	}
	var got ValidationError
	if !errors.As(err, &got) {
		t.Fatalf("error %v (%T) is not a ValidationError", err, err)
	}
	gotFields := make([]string, len(got))
	for i, fe := range got {
		gotFields[i] = fe.Field
	}
	wantFields := make([]string, len(want))
	for i, fe := range want {
		wantFields[i] = fe.Field
	}
	if diff := cmp.Diff(wantFields, gotFields); diff != "" {
		t.Fatalf("fields mismatch (-want +got):\n%s\nfull error: %v", diff, err)
	}
	for i := range want {
		if !strings.HasPrefix(got[i].Reason, want[i].Reason) {
			t.Errorf("%s: reason = %q, want prefix %q", got[i].Field, got[i].Reason, want[i].Reason)
		}
	}
}

func fe(field, reason string) FieldError { return FieldError{Field: field, Reason: reason} }

func TestValidationError(t *testing.T) {
	err := error(ValidationError{fe("scope.org", "required"), fe("", "bad body"), fe(`labels["a"]`, "too long")})
	if got, want := err.Error(), `scope.org: required; bad body; labels["a"]: too long`; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatal("errors.Is(err, ErrInvalid) = false")
	}
	wrapped := fmt.Errorf("put policy: %w", err)
	var ve ValidationError
	if !errors.As(wrapped, &ve) || len(ve) != 3 {
		t.Fatalf("errors.As through a wrap = %v, %v", ve, wrapped)
	}
	if !errors.Is(wrapped, ErrInvalid) {
		t.Fatal("errors.Is(wrapped, ErrInvalid) = false")
	}
	if got, want := (ValidationError{}).Error(), "invalid"; got != want {
		t.Fatalf("empty Error() = %q, want %q", got, want)
	}
}

func TestValidPolicyName(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	tests := []struct {
		name string
		in   string
		want string // reason prefix, "" for valid
	}{
		{name: "simple", in: "deny-shell"},
		{name: "dotted", in: "acme.deny-shell"},
		{name: "digits", in: "0.1-2"},
		{name: "single char", in: "a"},
		{name: "63-char label", in: label63 + ".b"},
		{name: "253 chars", in: strings.Join([]string{label63, label63, label63, strings.Repeat("c", 61)}, ".")},
		{name: "empty", in: "", want: "required"},
		{name: "upper case", in: "Deny", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "underscore", in: "deny_shell", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "leading dash", in: "-deny", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "trailing dash", in: "deny-", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "label ends with dash", in: "acme-.deny", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "leading dot", in: ".deny", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "double dot", in: "acme..deny", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "trailing dot", in: "acme.", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "slash", in: "acme/deny", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "space", in: "acme deny", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "unicode", in: "ünicode", want: "must be a lowercase DNS-1123 subdomain"},
		{name: "64-char label", in: strings.Repeat("a", 64), want: "each dot-separated label must be at most 63 characters"},
		{name: "254 chars", in: strings.Join([]string{label63, label63, label63, strings.Repeat("c", 62)}, "."), want: "must be at most 253 characters, got 254"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var want []FieldError
			if tc.want != "" {
				want = []FieldError{fe("name", tc.want)}
			}
			checkFieldErrors(t, ValidPolicyName(tc.in), want)
		})
	}
}

func TestValidEmployeeID(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "simple", in: "alice"},
		{name: "email", in: "Alice.Smith+ops@example.com"},
		{name: "uuid", in: "2f1c6b1e-8a39-4c1e-9a8e-0c8d0f3b7d11"},
		{name: "digit first", in: "0abc"},
		{name: "underscore", in: "a_b"},
		{name: "253 chars", in: strings.Repeat("a", 253)},
		{name: "empty", in: "", want: "required"},
		{name: "254 chars", in: strings.Repeat("a", 254), want: "must be 1 to 253"},
		{name: "leading dot", in: ".alice", want: "must be 1 to 253"},
		{name: "leading at", in: "@alice", want: "must be 1 to 253"},
		{name: "slash", in: "a/b", want: "must be 1 to 253"},
		{name: "space", in: "a b", want: "must be 1 to 253"},
		{name: "colon", in: "a:b", want: "must be 1 to 253"},
		{name: "unicode", in: "élodie", want: "must be 1 to 253"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var want []FieldError
			if tc.want != "" {
				want = []FieldError{fe("id", tc.want)}
			}
			checkFieldErrors(t, ValidEmployeeID(tc.in), want)
		})
	}
}

func TestValidOrgAndTeam(t *testing.T) {
	tests := []struct {
		in    string
		valid bool
	}{
		{in: "acme", valid: true},
		{in: "a", valid: true},
		{in: "acme-corp.eu_west", valid: true},
		{in: "0", valid: true},
		{in: strings.Repeat("a", 63), valid: true},
		{in: strings.Repeat("a", 64)},
		{in: ""},
		{in: "Acme"},
		{in: "-acme"},
		{in: "acme_"},
		{in: "ac me"},
		{in: "acme/x"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var wantOrg, wantTeam []FieldError
			if !tc.valid {
				wantOrg = []FieldError{fe("org", "must be 1 to 63 lowercase letters")}
				wantTeam = []FieldError{fe("team", "must be 1 to 63 lowercase letters")}
			}
			checkFieldErrors(t, ValidOrg(tc.in), wantOrg)
			checkFieldErrors(t, ValidTeam(tc.in), wantTeam)
		})
	}
}

func TestNewValidator(t *testing.T) {
	tests := []struct {
		name    string
		extra   []string
		wantErr string
	}{
		{name: "none", extra: nil},
		{name: "some", extra: []string{"RateLimit", "Quota2"}},
		{name: "listed twice", extra: []string{"RateLimit", "RateLimit"}},
		{name: "built-in ToolPolicy", extra: []string{"ToolPolicy"}, wantErr: `extra kind "ToolPolicy": is a built-in kind`},
		{name: "built-in ValidatingPolicy", extra: []string{"ValidatingPolicy"}, wantErr: `extra kind "ValidatingPolicy": is a built-in kind`},
		{name: "empty", extra: []string{""}, wantErr: `extra kind "": must be`},
		{name: "lower case", extra: []string{"rateLimit"}, wantErr: `extra kind "rateLimit": must be`},
		{name: "punctuation", extra: []string{"Rate-Limit"}, wantErr: `extra kind "Rate-Limit": must be`},
		{name: "too long", extra: []string{"K" + strings.Repeat("x", 63)}, wantErr: "must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewValidator(tc.extra)
			if tc.wantErr == "" {
				if err != nil || v == nil {
					t.Fatalf("NewValidator(%q) = %v, %v", tc.extra, v, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("NewValidator(%q) error = %v, want %q", tc.extra, err, tc.wantErr)
			}
		})
	}
}

// basePolicy returns a valid ToolPolicy for tests to break one field at a time.
func basePolicy() *Policy {
	return &Policy{
		Name:   "acme.deny-shell",
		Kind:   KindToolPolicy,
		Scope:  Scope{Org: "acme"},
		Labels: map[string]string{"tier": "prod"},
		Spec:   json.RawMessage(`{"tool_name":"Bash","action":"deny","reason":"Shell commands blocked","conditions":{"patterns":["rm -rf"]}}`),
	}
}

func TestValidatorPolicy(t *testing.T) {
	spec := func(s string) func(p *Policy) { return func(p *Policy) { p.Spec = json.RawMessage(s) } }
	vp := func(s string) func(p *Policy) {
		return func(p *Policy) { p.Kind = KindValidatingPolicy; p.Spec = json.RawMessage(s) }
	}
	patterns := func(n int) string {
		ps := make([]string, n)
		for i := range ps {
			ps[i] = fmt.Sprintf("%q", fmt.Sprintf("p%d", i))
		}
		return `{"tool_name":"Bash","action":"deny","conditions":{"patterns":[` + strings.Join(ps, ",") + `]}}`
	}
	validations := func(n int) string {
		vs := make([]string, n)
		for i := range vs {
			vs[i] = `{"expression":"true","message":"m"}`
		}
		return `{"validations":[` + strings.Join(vs, ",") + `]}`
	}
	// mc is a ValidatingPolicy with the given match conditions (a JSON
	// array) and one validation.
	mc := func(conds string) func(p *Policy) {
		return vp(`{"matchConditions":` + conds + `,"validations":[{"expression":"true","message":"m"}]}`)
	}
	conds := func(n int) string {
		cs := make([]string, n)
		for i := range cs {
			cs[i] = fmt.Sprintf(`{"name":"c%d","expression":"true"}`, i)
		}
		return "[" + strings.Join(cs, ",") + "]"
	}
	labels := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}

	tests := []struct {
		name   string
		mutate func(p *Policy)
		want   []FieldError
	}{
		{name: "valid", mutate: func(*Policy) {}},

		// name
		{name: "name missing", mutate: func(p *Policy) { p.Name = "" }, want: []FieldError{fe("name", "required")}},
		{name: "name invalid", mutate: func(p *Policy) { p.Name = "Acme" }, want: []FieldError{fe("name", "must be a lowercase DNS-1123 subdomain")}},

		// kind
		{name: "kind missing", mutate: func(p *Policy) { p.Kind = "" }, want: []FieldError{fe("kind", "required")}},
		{name: "kind unknown", mutate: func(p *Policy) { p.Kind = "Nope" },
			want: []FieldError{fe("kind", `unknown kind "Nope" (accepted: ToolPolicy, ValidatingPolicy, RateLimit)`)}},
		{name: "kind wrong case", mutate: func(p *Policy) { p.Kind = "toolpolicy" },
			want: []FieldError{fe("kind", `unknown kind "toolpolicy"`)}},
		{name: "extra kind with any object spec", mutate: func(p *Policy) {
			p.Kind = "RateLimit"
			p.Spec = json.RawMessage(`{"rps": 10, "anything": [1, {"x": null}]}`)
		}},
		{name: "extra kind with empty object", mutate: func(p *Policy) { p.Kind = "RateLimit"; p.Spec = json.RawMessage(`{}`) }},
		{name: "extra kind with array spec", mutate: func(p *Policy) { p.Kind = "RateLimit"; p.Spec = json.RawMessage(`[]`) },
			want: []FieldError{fe("spec", "must be a JSON object")}},

		// enforcement
		{name: "enforcement enforce", mutate: func(p *Policy) { p.Enforcement = "enforce" }},
		{name: "enforcement shadow", mutate: func(p *Policy) { p.Enforcement = "shadow" }},
		{name: "enforcement unknown", mutate: func(p *Policy) { p.Enforcement = "dry-run" },
			want: []FieldError{fe("enforcement", `must be enforce or shadow, got "dry-run"`)}},
		{name: "enforcement wrong case", mutate: func(p *Policy) { p.Enforcement = "Shadow" },
			want: []FieldError{fe("enforcement", `must be enforce or shadow, got "Shadow"`)}},

		// scope
		{name: "global scope", mutate: func(p *Policy) { p.Scope = Scope{} }},
		{name: "team scope", mutate: func(p *Policy) { p.Scope = Scope{Org: "acme", Team: "platform"} }},
		{name: "employee scope", mutate: func(p *Policy) { p.Scope = Scope{Org: "acme", Employee: "alice@acme.com"} }},
		{name: "team and employee scope", mutate: func(p *Policy) { p.Scope = Scope{Org: "acme", Team: "platform", Employee: "alice"} }},
		{name: "team without org", mutate: func(p *Policy) { p.Scope = Scope{Team: "platform"} },
			want: []FieldError{fe("scope.org", "required when scope.team or scope.employee is set")}},
		{name: "employee without org", mutate: func(p *Policy) { p.Scope = Scope{Employee: "alice"} },
			want: []FieldError{fe("scope.org", "required when scope.team or scope.employee is set")}},
		{name: "org invalid", mutate: func(p *Policy) { p.Scope = Scope{Org: "Acme"} },
			want: []FieldError{fe("scope.org", "must be 1 to 63 lowercase letters")}},
		{name: "team invalid", mutate: func(p *Policy) { p.Scope = Scope{Org: "acme", Team: "plat form"} },
			want: []FieldError{fe("scope.team", "must be 1 to 63 lowercase letters")}},
		{name: "employee invalid", mutate: func(p *Policy) { p.Scope = Scope{Org: "acme", Employee: "a/b"} },
			want: []FieldError{fe("scope.employee", "must be 1 to 253 letters")}},

		// labels
		{name: "no labels", mutate: func(p *Policy) { p.Labels = nil }},
		{name: "prefixed label key", mutate: func(p *Policy) { p.Labels = map[string]string{"app.kubernetes.io/name": "x", "A_b-1": ""} }},
		{name: "label key empty", mutate: func(p *Policy) { p.Labels = map[string]string{"": "x"} },
			want: []FieldError{fe(`labels[""]`, "key must be letters")}},
		{name: "label key bad chars", mutate: func(p *Policy) { p.Labels = map[string]string{"-tier": "x", "ti er": "y"} },
			want: []FieldError{fe(`labels["-tier"]`, "key must be letters"), fe(`labels["ti er"]`, "key must be letters")}},
		{name: "label key 63", mutate: func(p *Policy) { p.Labels = map[string]string{strings.Repeat("k", 63): "x"} }},
		{name: "label key 64", mutate: func(p *Policy) { p.Labels = map[string]string{strings.Repeat("k", 64): "x"} },
			want: []FieldError{fe(`labels["`+strings.Repeat("k", 64)+`"]`, "key must be at most 63 characters")}},
		{name: "label value 256", mutate: func(p *Policy) { p.Labels = map[string]string{"tier": strings.Repeat("é", 256)} }},
		{name: "label value 257", mutate: func(p *Policy) { p.Labels = map[string]string{"tier": strings.Repeat("v", 257)} },
			want: []FieldError{fe(`labels["tier"]`, "value must be at most 256 characters, got 257")}},
		{name: "64 labels", mutate: func(p *Policy) { p.Labels = labels(64) }},
		{name: "65 labels", mutate: func(p *Policy) { p.Labels = labels(65) },
			want: []FieldError{fe("labels", "at most 64 labels, got 65")}},

		// spec, any kind
		{name: "spec missing", mutate: func(p *Policy) { p.Spec = nil }, want: []FieldError{fe("spec", "required")}},
		{name: "spec null", mutate: spec(` null `), want: []FieldError{fe("spec", "required")}},
		{name: "spec string", mutate: spec(`"x"`), want: []FieldError{fe("spec", "must be a JSON object")}},
		{name: "spec malformed", mutate: spec(`{"tool_name":`), want: []FieldError{fe("spec", "must be a JSON object")}},
		{name: "spec trailing data", mutate: spec(`{} {}`), want: []FieldError{fe("spec", "must be a JSON object")}},

		// ToolPolicy
		{name: "tool minimal", mutate: spec(`{"tool_name":"Write","action":"audit"}`)},
		{name: "tool allow", mutate: spec(`{"tool_name":"Write","action":"allow","conditions":{}}`)},
		{name: "tool null conditions", mutate: spec(`{"tool_name":"Write","action":"allow","conditions":null}`)},
		{name: "tool empty spec", mutate: spec(`{}`),
			want: []FieldError{fe("spec.tool_name", "required"), fe("spec.action", "required")}},
		{name: "tool bad action", mutate: spec(`{"tool_name":"Bash","action":"block"}`),
			want: []FieldError{fe("spec.action", `must be one of deny, audit, allow, got "block"`)}},
		{name: "tool action wrong case", mutate: spec(`{"tool_name":"Bash","action":"Deny"}`),
			want: []FieldError{fe("spec.action", `must be one of deny, audit, allow, got "Deny"`)}},
		{name: "tool unknown field", mutate: spec(`{"tool_name":"Bash","action":"deny","toolName":"x"}`),
			want: []FieldError{fe("spec.toolName", "unknown field")}},
		{name: "tool unknown field and missing action", mutate: spec(`{"tool_name":"Bash","Action":"deny"}`),
			want: []FieldError{fe("spec.Action", "unknown field")}},
		{name: "tool unknown nested field", mutate: spec(`{"tool_name":"Bash","action":"deny","conditions":{"pattern":["x"]}}`),
			want: []FieldError{fe("spec.conditions.pattern", "unknown field")}},
		{name: "tool wrong type", mutate: spec(`{"tool_name":7,"action":"deny"}`),
			want: []FieldError{fe("spec.tool_name", "expected string, got number")}},
		{name: "tool pattern wrong type", mutate: spec(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["ok",["x"]]}}`),
			want: []FieldError{fe("spec.conditions.patterns[1]", "expected string, got array")}},
		{name: "tool patterns not an array", mutate: spec(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":"rm"}}`),
			want: []FieldError{fe("spec.conditions.patterns", "expected array, got string")}},
		{name: "tool bad regexp", mutate: spec(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["ok","(unclosed","a{2,1}"]}}`),
			want: []FieldError{
				fe("spec.conditions.patterns[1]", "invalid regexp: missing closing ): `(unclosed`"),
				fe("spec.conditions.patterns[2]", "invalid regexp: invalid repeat count"),
			}},
		{name: "tool PCRE-only regexp", mutate: spec(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["(?=x)"]}}`),
			want: []FieldError{fe("spec.conditions.patterns[0]", "invalid regexp: invalid or unsupported Perl syntax")}},
		{name: "tool 64 patterns", mutate: spec(patterns(64))},
		{name: "tool 65 patterns", mutate: spec(patterns(65)),
			want: []FieldError{fe("spec.conditions.patterns", "at most 64 patterns, got 65")}},
		{name: "tool pattern 1024", mutate: spec(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["` + strings.Repeat("a", 1024) + `"]}}`)},
		{name: "tool pattern 1025", mutate: spec(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["x","` + strings.Repeat("a", 1025) + `"]}}`),
			want: []FieldError{fe("spec.conditions.patterns[1]", "must be at most 1024 characters, got 1025")}},
		{name: "tool duplicate field", mutate: spec(`{"tool_name":"Bash","action":"deny","action":"allow"}`),
			want: []FieldError{fe("spec.action", "duplicate field")}},

		// ValidatingPolicy
		{name: "vp valid", mutate: vp(`{"validations":[{"expression":"object.spec.replicas <= 5","message":"too many replicas","reason":"Invalid"}]}`)},
		{name: "vp all variables", mutate: vp(`{"validations":[{"expression":"object == oldObject && request.user != '' && params.x && tool == 'Bash' && input.command.startsWith('rm')","message":"m"}]}`)},
		{name: "vp dyn output", mutate: vp(`{"validations":[{"expression":"object.allowed","message":"m"}]}`)},
		{name: "vp macros", mutate: vp(`{"validations":[{"expression":"object.items.all(i, i.size() < 3) && has(object.x)","message":"m"}]}`)},
		{name: "vp 64 validations", mutate: vp(validations(64))},
		{name: "vp missing validations", mutate: vp(`{}`),
			want: []FieldError{fe("spec.validations", "required: 1 to 64 validations")}},
		{name: "vp empty validations", mutate: vp(`{"validations":[]}`),
			want: []FieldError{fe("spec.validations", "required: 1 to 64 validations")}},
		{name: "vp 65 validations", mutate: vp(validations(65)),
			want: []FieldError{fe("spec.validations", "at most 64 validations, got 65")}},
		{name: "vp validations not an array", mutate: vp(`{"validations":{"expression":"true"}}`),
			want: []FieldError{fe("spec.validations", "expected array, got object")}},
		{name: "vp missing expression and message", mutate: vp(`{"validations":[{"expression":"true","message":"m"},{}]}`),
			want: []FieldError{fe("spec.validations[1].expression", "required"), fe("spec.validations[1].message", "required")}},
		{name: "vp syntax error", mutate: vp(`{"validations":[{"expression":"object.x ==","message":"m"}]}`),
			want: []FieldError{fe("spec.validations[0].expression", "compile error: 1:12: Syntax error")}},
		{name: "vp undeclared variable", mutate: vp(`{"validations":[{"expression":"true","message":"m"},{"expression":"spec.x == 1","message":"m"}]}`),
			want: []FieldError{fe("spec.validations[1].expression", "compile error: 1:1: undeclared reference to 'spec'")}},
		{name: "vp type error", mutate: vp(`{"validations":[{"expression":"1 + 'a' == 2","message":"m"}]}`),
			want: []FieldError{fe("spec.validations[0].expression", "compile error: 1:3: found no matching overload for '_+_'")}},
		{name: "vp non-bool output", mutate: vp(`{"validations":[{"expression":"'a' + 'b'","message":"m"}]}`),
			want: []FieldError{fe("spec.validations[0].expression", "must evaluate to bool, got string")}},
		{name: "vp int output", mutate: vp(`{"validations":[{"expression":"size(object.items)","message":"m"}]}`),
			want: []FieldError{fe("spec.validations[0].expression", "must evaluate to bool, got int")}},
		{name: "vp expression 4096", mutate: vp(`{"validations":[{"expression":"true` + strings.Repeat(" ", 4092) + `","message":"m"}]}`)},
		{name: "vp expression 4097", mutate: vp(`{"validations":[{"expression":"true` + strings.Repeat(" ", 4093) + `","message":"m"}]}`),
			want: []FieldError{fe("spec.validations[0].expression", "must be at most 4096 characters, got 4097")}},
		{name: "vp unknown field still compiles the rest", mutate: vp(`{"validations":[{"expression":"nope","message":"m","messageExpression":"x"}],"failurePolicy":"Fail"}`),
			want: []FieldError{
				fe("spec.validations[0].messageExpression", "unknown field"),
				fe("spec.failurePolicy", "unknown field"),
				fe("spec.validations[0].expression", "compile error: 1:1: undeclared reference to 'nope'"),
			}},
		{name: "vp message wrong type", mutate: vp(`{"validations":[{"expression":"true","message":false}]}`),
			want: []FieldError{fe("spec.validations[0].message", "expected string, got boolean")}},
		// ValidatingPolicy match conditions
		{name: "mc valid", mutate: mc(`[{"name":"http-only","expression":"has(request.method)"},{"name":"Get_1.x","expression":"request.method == 'GET'"}]`)},
		{name: "mc dyn output", mutate: mc(`[{"name":"a","expression":"request.isHTTP"}]`)},
		{name: "mc empty list", mutate: mc(`[]`)},
		{name: "mc null", mutate: mc(`null`)},
		{name: "mc 16", mutate: mc(conds(16))},
		{name: "mc 63-character name", mutate: mc(`[{"name":"` + strings.Repeat("a", 63) + `","expression":"true"}]`)},
		{name: "mc 17", mutate: mc(conds(17)),
			want: []FieldError{fe("spec.matchConditions", "at most 16 match conditions, got 17")}},
		{name: "mc not an array", mutate: mc(`{"name":"a","expression":"true"}`),
			want: []FieldError{fe("spec.matchConditions", "expected array, got object")}},
		{name: "mc missing name and expression", mutate: mc(`[{"name":"a","expression":"true"},{}]`),
			want: []FieldError{fe("spec.matchConditions[1].name", "required"), fe("spec.matchConditions[1].expression", "required")}},
		{name: "mc bad names", mutate: mc(`[{"name":"-a","expression":"true"},{"name":"a b","expression":"true"},{"name":"a/b","expression":"true"},{"name":"` + strings.Repeat("a", 64) + `","expression":"true"}]`),
			want: []FieldError{
				fe("spec.matchConditions[0].name", "must be 1 to 63 letters"),
				fe("spec.matchConditions[1].name", "must be 1 to 63 letters"),
				fe("spec.matchConditions[2].name", "must be 1 to 63 letters"),
				fe("spec.matchConditions[3].name", "must be 1 to 63 letters"),
			}},
		{name: "mc duplicate name", mutate: mc(`[{"name":"a","expression":"true"},{"name":"b","expression":"true"},{"name":"a","expression":"false"}]`),
			want: []FieldError{fe("spec.matchConditions[2].name", `duplicate name "a" (also spec.matchConditions[0])`)}},
		{name: "mc syntax error", mutate: mc(`[{"name":"a","expression":"true"},{"name":"b","expression":"request.x =="}]`),
			want: []FieldError{fe("spec.matchConditions[1].expression", "compile error: 1:13: Syntax error")}},
		{name: "mc undeclared variable", mutate: mc(`[{"name":"a","expression":"spec.x == 1"}]`),
			want: []FieldError{fe("spec.matchConditions[0].expression", "compile error: 1:1: undeclared reference to 'spec'")}},
		{name: "mc non-bool output", mutate: mc(`[{"name":"a","expression":"'a' + 'b'"}]`),
			want: []FieldError{fe("spec.matchConditions[0].expression", "must evaluate to bool, got string")}},
		{name: "mc expression 4097", mutate: mc(`[{"name":"a","expression":"true` + strings.Repeat(" ", 4093) + `"}]`),
			want: []FieldError{fe("spec.matchConditions[0].expression", "must be at most 4096 characters, got 4097")}},
		{name: "mc unknown field still checks the rest", mutate: mc(`[{"name":"a","expression":"nope","message":"m"}]`),
			want: []FieldError{
				fe("spec.matchConditions[0].message", "unknown field"),
				fe("spec.matchConditions[0].expression", "compile error: 1:1: undeclared reference to 'nope'"),
			}},
		{name: "mc name wrong type", mutate: mc(`[{"name":1,"expression":"true"}]`),
			want: []FieldError{fe("spec.matchConditions[0].name", "expected string, got number")}},
		{name: "mc misspelt", mutate: vp(`{"matchCondition":[{"name":"a","expression":"true"}],"validations":[{"expression":"true","message":"m"}]}`),
			want: []FieldError{fe("spec.matchCondition", "unknown field")}},
		{name: "mc and validations both wrong, in field order", mutate: vp(`{"matchConditions":[{"name":"","expression":"1"}]}`),
			want: []FieldError{
				fe("spec.matchConditions[0].name", "required"),
				fe("spec.matchConditions[0].expression", "must evaluate to bool, got int"),
				fe("spec.validations", "required: 1 to 64 validations"),
			}},
		{name: "vp tool spec", mutate: vp(`{"tool_name":"Bash","action":"deny"}`),
			want: []FieldError{fe("spec.tool_name", "unknown field"), fe("spec.action", "unknown field"), fe("spec.validations", "required")}},

		// several problems at once, in field order
		{name: "all at once", mutate: func(p *Policy) {
			p.Name = ""
			p.Kind = "Nope"
			p.Scope = Scope{Team: "Platform"}
			p.Labels = map[string]string{"-": "x"}
			p.Spec = json.RawMessage(`[]`)
		}, want: []FieldError{
			fe("name", "required"),
			fe("kind", "unknown kind"),
			fe("scope.org", "required when"),
			fe("scope.team", "must be"),
			fe(`labels["-"]`, "key must be"),
			fe("spec", "must be a JSON object"),
		}},
	}
	v := newTestValidator(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := basePolicy()
			tc.mutate(p)
			checkFieldErrors(t, v.Policy(p), tc.want)
		})
	}
}

func TestValidatorIgnoresManagedFields(t *testing.T) {
	p := basePolicy()
	p.Revision = 99
	checkFieldErrors(t, newTestValidator(t).Policy(p), nil)
}

func TestNilValidatorAcceptsBuiltInKindsOnly(t *testing.T) {
	var v *Validator
	checkFieldErrors(t, v.Policy(basePolicy()), nil)
	p := basePolicy()
	p.Kind = "RateLimit"
	checkFieldErrors(t, v.Policy(p), []FieldError{fe("kind", `unknown kind "RateLimit" (accepted: ToolPolicy, ValidatingPolicy)`)})
	checkFieldErrors(t, v.Employee(&Employee{ID: "alice", Org: "acme", Status: StatusActive}), nil)
}

func TestValidatorEmployee(t *testing.T) {
	base := func() *Employee {
		return &Employee{ID: "alice@acme.com", Org: "acme", Team: "platform", Status: StatusActive}
	}
	tests := []struct {
		name   string
		mutate func(e *Employee)
		want   []FieldError
	}{
		{name: "valid", mutate: func(*Employee) {}},
		{name: "no team", mutate: func(e *Employee) { e.Team = "" }},
		{name: "inactive", mutate: func(e *Employee) { e.Status = StatusInactive }},
		{name: "id missing", mutate: func(e *Employee) { e.ID = "" }, want: []FieldError{fe("id", "required")}},
		{name: "id invalid", mutate: func(e *Employee) { e.ID = "alice smith" }, want: []FieldError{fe("id", "must be 1 to 253 letters")}},
		{name: "org missing", mutate: func(e *Employee) { e.Org = "" }, want: []FieldError{fe("org", "required")}},
		{name: "org invalid", mutate: func(e *Employee) { e.Org = "ACME" }, want: []FieldError{fe("org", "must be 1 to 63 lowercase letters")}},
		{name: "team invalid", mutate: func(e *Employee) { e.Team = "_platform" }, want: []FieldError{fe("team", "must be 1 to 63 lowercase letters")}},
		{name: "status missing", mutate: func(e *Employee) { e.Status = "" }, want: []FieldError{fe("status", "required")}},
		{name: "status invalid", mutate: func(e *Employee) { e.Status = "Active" }, want: []FieldError{fe("status", `must be active or inactive, got "Active"`)}},
		{name: "everything wrong", mutate: func(e *Employee) { *e = Employee{Team: "T", Status: "gone"} },
			want: []FieldError{fe("id", "required"), fe("org", "required"), fe("team", "must be"), fe("status", "must be")}},
	}
	v := newTestValidator(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := base()
			tc.mutate(e)
			checkFieldErrors(t, v.Employee(e), tc.want)
		})
	}
}

func TestValidatorConcurrent(t *testing.T) {
	v := newTestValidator(t)
	p := basePolicy()
	p.Kind = KindValidatingPolicy
	p.Spec = json.RawMessage(`{"validations":[{"expression":"object.a == 1 || input.b.startsWith('x')","message":"m"}]}`)
	done := make(chan error)
	for range 8 {
		go func() {
			var err error
			for range 20 {
				if err = v.Policy(p); err != nil {
					break
				}
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
