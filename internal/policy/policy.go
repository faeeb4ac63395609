// Package policy holds policyd's domain types (Policy, Scope, Employee), the
// rule that decides which policies apply to an identity, their canonical
// encoding, and their validation.
//
// Validation happens once, on the node that receives a write, before the
// write is proposed to Raft. Apply never re-validates: a CEL or regexp
// library upgrade that changes what compiles must not make replicas disagree
// about entries that are already committed.
package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// Built-in policy kinds.
const (
	KindToolPolicy       = "ToolPolicy"
	KindValidatingPolicy = "ValidatingPolicy"
)

// Employee statuses.
const (
	StatusActive   = "active"
	StatusInactive = "inactive"
)

// Policy enforcement modes. A shadow policy is delivered to the sidecars
// that can evaluate it apart and never blocks; they count where it would
// have decided otherwise (docs/rollouts.md). The stored form of enforce is
// the empty string, so enforced policies keep the bytes (and set versions)
// they had before the field existed.
const (
	EnforcementEnforce = "enforce"
	EnforcementShadow  = "shadow"
)

// Scope says who a policy is for. All fields empty means global. A non-empty
// field must match the identity for the policy to apply.
type Scope struct {
	Org      string `json:"org"`
	Team     string `json:"team"`
	Employee string `json:"employee"`
}

// Identity is who a sidecar or feed connection acts for.
type Identity = Scope

// IsGlobal reports whether s applies to everyone.
func (s Scope) IsGlobal() bool { return s == Scope{} }

// String renders s as org/team/employee, for logs and metric labels.
func (s Scope) String() string { return s.Org + "/" + s.Team + "/" + s.Employee }

// AppliesTo reports whether a policy with scope s applies to identity id: every
// global policy, plus those of id's org, team and id itself. Each non-empty
// field of s must equal the identity's.
func (s Scope) AppliesTo(id Identity) bool {
	if s.Org != "" && s.Org != id.Org {
		return false
	}
	if s.Team != "" && s.Team != id.Team {
		return false
	}
	if s.Employee != "" && s.Employee != id.Employee {
		return false
	}
	return true
}

// Policy is one named authorization policy.
//
// Revision, CreatedAt and UpdatedAt are managed by the cluster: Revision is the
// Raft index of the last change. Values a client sends in these fields are
// ignored; compare-and-set goes through If-Match.
type Policy struct {
	Name   string            `json:"name"`
	Kind   string            `json:"kind"`
	Scope  Scope             `json:"scope"`
	Labels map[string]string `json:"labels,omitempty"`
	// Enforcement is "" or "enforce" (the default), or "shadow".
	Enforcement string `json:"enforcement,omitempty"`
	// Source is who owns the policy: "" for the API, else the source
	// ("kubernetes", "git:NAME") that declares it; only a source's sync
	// sets it, and a write through the API ignores it. Stored only when
	// set, so the bytes (and set versions) of API policies are unchanged.
	Source    string          `json:"source,omitempty"`
	Spec      json.RawMessage `json:"spec"`
	Revision  uint64          `json:"revision"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// CanonicalEnforcement is p's enforcement as stored: "" for enforce.
func CanonicalEnforcement(e string) string {
	if e == EnforcementEnforce {
		return ""
	}
	return e
}

// Employee is an identity policies apply to. Its status is authoritative for
// access: deactivating or deleting it revokes access.
type Employee struct {
	ID        string    `json:"id"`
	Org       string    `json:"org"`
	Team      string    `json:"team"`
	Status    string    `json:"status"`
	Revision  uint64    `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Identity returns the identity the employee acts as.
func (e *Employee) Identity() Identity {
	return Identity{Org: e.Org, Team: e.Team, Employee: e.ID}
}

// Active reports whether the employee may connect.
func (e *Employee) Active() bool { return e.Status == StatusActive }

// Canonical returns p's stored form: JSON with a canonical spec (keys sorted,
// numbers kept exactly as written, no insignificant space). Every replica
// stores these same bytes, so policy-set versions computed from them agree.
func (p *Policy) Canonical() ([]byte, error) {
	cp := *p
	cp.Enforcement = CanonicalEnforcement(p.Enforcement)
	spec, err := canonicalJSON(p.Spec)
	if err != nil {
		return nil, fmt.Errorf("canonical spec: %w", err)
	}
	cp.Spec = spec
	// The spec is canonical now, which is AppendJSON's precondition: the
	// same bytes as json.Marshal without its compacting pass over the spec.
	return cp.AppendJSON(nil)
}

// canonicalJSON re-encodes raw as canonicalMarshal does, with sorted object
// keys and numbers exactly as written. jsontext formats it in one pass;
// what jsontext refuses (duplicate names, invalid UTF-8) or would sort
// differently goes to canonicalMarshal, which defines the result.
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("{}"), nil
	}
	b, err := jsontext.AppendFormat(nil, raw,
		jsontext.ReorderRawObjects(true), jsontext.EscapeForHTML(true), jsontext.EscapeForJS(true))
	if err == nil && sameOrder(b) {
		return b, nil
	}
	return canonicalMarshal(raw)
}

// sameOrder reports whether sorting the object keys in b by UTF-16 code
// units (jsontext, after RFC 8785) gives the order that sorting them by
// bytes (encoding/json) gives. They differ only when b has both a rune in
// U+E000 to U+FFFF (lead byte 0xEE or 0xEF) and one above U+FFFF.
func sameOrder(b []byte) bool {
	if bytes.IndexByte(b, 0xEE) < 0 && bytes.IndexByte(b, 0xEF) < 0 {
		return true
	}
	for _, c := range b {
		if c >= 0xF0 {
			return false
		}
	}
	return true
}

// canonicalMarshal is the canonical form by definition: raw decoded with
// UseNumber, then json.Marshal.
func canonicalMarshal(raw json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return b, nil
}
