package adminapi

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestListPoliciesSummary(t *testing.T) {
	f := newFake(t)
	a := New(Config{}, discard(), f)
	if w := serve(a, newRequest(http.MethodPut, "/v1/policies/p4", policyBody, nil)); w.Code != http.StatusOK {
		t.Fatalf("PUT: %d %s", w.Code, w.Body)
	}
	for _, tc := range []struct {
		query    string
		status   int
		wantSpec bool
	}{
		{"", http.StatusOK, true},
		{"?summary=false", http.StatusOK, true},
		{"?summary=true", http.StatusOK, false},
		{"?summary=true&org=acme", http.StatusOK, false},
		{"?summary=yes-please", http.StatusBadRequest, false},
	} {
		t.Run(tc.query, func(t *testing.T) {
			w := serve(a, newRequest(http.MethodGet, "/v1/policies"+tc.query, "", nil))
			if w.Code != tc.status {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			if tc.status != http.StatusOK {
				return
			}
			var l struct {
				Policies []struct {
					Name string          `json:"name"`
					Spec json.RawMessage `json:"spec"`
				} `json:"policies"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil || len(l.Policies) != 1 {
				t.Fatalf("%v: %s", err, w.Body)
			}
			if got := string(l.Policies[0].Spec) != "null"; got != tc.wantSpec {
				t.Errorf("spec %s, want a spec: %v", l.Policies[0].Spec, tc.wantSpec)
			}
		})
	}
}
