package apierror

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestWrite pins the envelope's bytes and headers, a contract of every HTTP
// listener (docs/api.md).
func TestWrite(t *testing.T) {
	base := http.Header{
		"Content-Type":           {"application/json"},
		"X-Content-Type-Options": {"nosniff"},
		"Cache-Control":          {"no-store"},
	}
	with := func(k, v string) http.Header {
		h := base.Clone()
		h.Set(k, v)
		return h
	}
	tests := []struct {
		name       string
		status     int
		code, msg  string
		reason     string
		wantHeader http.Header
		wantBody   string
	}{
		{"invalid", http.StatusBadRequest, CodeInvalid, "bad <input>", "",
			base, `{"error":{"code":"invalid","message":"bad \u003cinput\u003e"}}` + "\n"},
		{"unavailable asks to retry", http.StatusServiceUnavailable, CodeUnavailable, "no leader", "",
			with("Retry-After", "1"), `{"error":{"code":"unavailable","message":"no leader"}}` + "\n"},
		{"unauthorized names the scheme", http.StatusUnauthorized, CodeUnauthorized, "no token", "",
			with("WWW-Authenticate", `Bearer realm="policyd"`), `{"error":{"code":"unauthorized","message":"no token"}}` + "\n"},
		{"reason", http.StatusUnauthorized, CodeUnauthorized, "employee \"x\": unknown employee", "UNKNOWN_EMPLOYEE",
			with("WWW-Authenticate", `Bearer realm="policyd"`),
			`{"error":{"code":"unauthorized","message":"employee \"x\": unknown employee","reason":"UNKNOWN_EMPLOYEE"}}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			WriteReason(w, tc.status, tc.code, tc.reason, tc.msg)
			if got, want := w.Code, tc.status; got != want {
				t.Errorf("status = %d, want %d", got, want)
			}
			if diff := cmp.Diff(tc.wantHeader, w.Header()); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantBody, w.Body.String()); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}
