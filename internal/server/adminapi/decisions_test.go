package adminapi

import (
	"net/http"
	"testing"
)

// TestDecisionsMaskReadTokens: under decisions.mask_identities a read
// token's page is masked and an admin token's is not; without it neither is.
func TestDecisionsMaskReadTokens(t *testing.T) {
	tokens := testTokens(t)
	for _, tc := range []struct {
		name     string
		token    string
		masked   bool // decisions.mask_identities
		wantMask bool
	}{
		{"read token, masking on", "reader-token-0123456789", true, true},
		{"admin token, masking on", "admin-token-0123456789", true, false},
		{"read token, masking off", "reader-token-0123456789", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.masked = tc.masked
			a := New(Config{Tokens: tokens}, discard(), f)
			w := serve(a, newRequest("GET", "/v1/decisions", "", map[string]string{"Authorization": "Bearer " + tc.token}))
			if w.Code != http.StatusOK {
				t.Fatalf("GET /v1/decisions: %d %s", w.Code, w.Body)
			}
			if len(f.decisionReqs) != 1 || f.decisionReqs[0].mask != tc.wantMask {
				t.Fatalf("Decisions calls %+v, want one with mask %v", f.decisionReqs, tc.wantMask)
			}
		})
	}
}
