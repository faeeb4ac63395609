package policy

import (
	"encoding/json"
	"testing"
)

func TestScopeAppliesTo(t *testing.T) {
	alice := Identity{Org: "acme", Team: "platform", Employee: "alice"}
	loner := Identity{Org: "acme", Employee: "bob"} // in no team
	tests := []struct {
		name  string
		scope Scope
		id    Identity
		want  bool
	}{
		{name: "global", scope: Scope{}, id: alice, want: true},
		{name: "global to empty identity", scope: Scope{}, id: Identity{}, want: true},
		{name: "org", scope: Scope{Org: "acme"}, id: alice, want: true},
		{name: "org to teamless", scope: Scope{Org: "acme"}, id: loner, want: true},
		{name: "other org", scope: Scope{Org: "globex"}, id: alice, want: false},
		{name: "team", scope: Scope{Org: "acme", Team: "platform"}, id: alice, want: true},
		{name: "other team", scope: Scope{Org: "acme", Team: "data"}, id: alice, want: false},
		{name: "team to teamless", scope: Scope{Org: "acme", Team: "platform"}, id: loner, want: false},
		{name: "same team name in other org", scope: Scope{Org: "globex", Team: "platform"}, id: alice, want: false},
		{name: "employee", scope: Scope{Org: "acme", Employee: "alice"}, id: alice, want: true},
		{name: "other employee", scope: Scope{Org: "acme", Employee: "bob"}, id: alice, want: false},
		{name: "same employee id in other org", scope: Scope{Org: "globex", Employee: "alice"}, id: alice, want: false},
		{name: "employee and team", scope: Scope{Org: "acme", Team: "platform", Employee: "alice"}, id: alice, want: true},
		{name: "employee in other team", scope: Scope{Org: "acme", Team: "data", Employee: "alice"}, id: alice, want: false},
		{name: "org to empty identity", scope: Scope{Org: "acme"}, id: Identity{}, want: false},
		{name: "case matters", scope: Scope{Org: "ACME"}, id: alice, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.scope.AppliesTo(tc.id); got != tc.want {
				t.Fatalf("%v.AppliesTo(%v) = %v, want %v", tc.scope, tc.id, got, tc.want)
			}
		})
	}
}

func TestScopeIsGlobal(t *testing.T) {
	if !(Scope{}).IsGlobal() {
		t.Fatal("empty scope is not global")
	}
	if (Scope{Org: "acme"}).IsGlobal() {
		t.Fatal("org scope is global")
	}
}

func TestCanonical(t *testing.T) {
	tests := []struct {
		name string
		spec string
		want string // the canonical spec
	}{
		{name: "sorts keys", spec: `{"z":1,"a":{"y":true,"b":null},"m":[{"d":1,"c":2}]}`,
			want: `{"a":{"b":null,"y":true},"m":[{"c":2,"d":1}],"z":1}`},
		{name: "keeps big integers exact", spec: `{"big":123456789012345678901234567890,"max":18446744073709551615,"neg":-9007199254740993}`,
			want: `{"big":123456789012345678901234567890,"max":18446744073709551615,"neg":-9007199254740993}`},
		{name: "keeps numbers as written", spec: `{"f":1.50,"e":1e3,"z":-0}`,
			want: `{"e":1e3,"f":1.50,"z":-0}`},
		{name: "drops insignificant space", spec: "{ \"b\" : [ 1 , 2 ] ,\n\t\"a\" : \"x y\" }",
			want: `{"a":"x y","b":[1,2]}`},
		{name: "empty spec", spec: ``, want: `{}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := basePolicy()
			p.Spec = json.RawMessage(tc.spec)
			b, err := p.Canonical()
			if err != nil {
				t.Fatalf("Canonical: %v", err)
			}
			var got struct{ Spec json.RawMessage }
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if string(got.Spec) != tc.want {
				t.Fatalf("canonical spec = %s, want %s", got.Spec, tc.want)
			}

			// The canonical form is a fixed point.
			again, err := DecodePolicy(b)
			if err != nil {
				t.Fatalf("DecodePolicy(canonical): %v", err)
			}
			b2, err := again.Canonical()
			if err != nil {
				t.Fatal(err)
			}
			if string(b2) != string(b) {
				t.Fatalf("canonical form not stable:\n%s\n%s", b, b2)
			}
		})
	}
}

func TestCanonicalSameForEquivalentInput(t *testing.T) {
	a, err := DecodePolicy([]byte(`{"name":"p","kind":"ToolPolicy","labels":{"b":"2","a":"1"},"spec":{"action":"deny","tool_name":"Bash"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodePolicy([]byte(`{"spec":{ "tool_name":"Bash", "action":"deny" },"labels":{"a":"1","b":"2"},"kind":"ToolPolicy","name":"p","revision":9}`))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := a.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if string(ca) != string(cb) {
		t.Fatalf("canonical forms differ:\n%s\n%s", ca, cb)
	}
}

func TestCanonicalRejectsBadSpec(t *testing.T) {
	p := basePolicy()
	p.Spec = json.RawMessage(`{"a":`)
	if _, err := p.Canonical(); err == nil {
		t.Fatal("Canonical accepted a malformed spec")
	}
}
