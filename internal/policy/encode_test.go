package policy

import (
	"encoding/json"
	"testing"
	"time"
)

func TestAppendJSONMatchesMarshal(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 600, time.UTC)
	tests := []struct {
		name string
		p    Policy
	}{
		{"zero", Policy{}},
		{"full", Policy{Name: "acme.deny-shell", Kind: KindToolPolicy, Scope: Scope{Org: "acme", Team: "t", Employee: "e"},
			Labels: map[string]string{"b": "2", "a": "1"}, Spec: json.RawMessage(`{"action":"deny","tool_name":"Bash"}`),
			Revision: 42, CreatedAt: at, UpdatedAt: at.Add(time.Hour)}},
		{"escaping in fields", Policy{Name: `a"b<c>&\u2028`, Kind: "K\n", Scope: Scope{Org: "<org>"},
			Labels: map[string]string{"<": "&"}, Spec: json.RawMessage(`{"r":"\u003cx\u003e"}`)}},
		{"empty labels are omitted", Policy{Name: "x", Labels: map[string]string{}, Spec: json.RawMessage(`[]`)}},
		{"nil spec", Policy{Name: "x", Revision: 1}},
		{"shadow", Policy{Name: "x", Enforcement: EnforcementShadow, Labels: map[string]string{"a": "1"}, Spec: json.RawMessage(`{}`)}},
		{"time zone", Policy{Name: "x", Spec: json.RawMessage(`1`), CreatedAt: at.In(time.FixedZone("x", 3600))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(&tc.p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tc.p.AppendJSON([]byte("prefix"))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "prefix"+string(want) {
				t.Errorf("AppendJSON =\n%s\nwant\n%s", got[len("prefix"):], want)
			}
		})
	}
	t.Run("time out of range", func(t *testing.T) {
		p := Policy{Name: "x", CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
		if _, err := p.AppendJSON(nil); err == nil {
			t.Error("AppendJSON of a year-10000 time succeeded; json.Marshal refuses it")
		}
	})
}
