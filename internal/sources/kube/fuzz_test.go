package kube

import (
	"encoding/json"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
)

// Longer runs: go test ./internal/sources/kube -run '^$' -fuzz FuzzAdmission -fuzztime 5m

// FuzzAdmission feeds arbitrary bodies to the webhook (seeds here and in
// testdata/fuzz/FuzzAdmission): the answer is an HTTP 4xx or a review for
// the same uid, a denial with a code and message, never a panic.
func FuzzAdmission(f *testing.F) {
	f.Add(reviewBody(f, reviewOf(f, admissionv1.Create, "ToolPolicy", tool(v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny",
		Conditions: &v1alpha1.ToolConditions{Patterns: []string{"(x"}}}))))
	f.Add(reviewBody(f, reviewOf(f, admissionv1.Update, "ValidatingPolicy", validating(v1alpha1.ValidatingPolicySpec{
		MatchConditions: []v1alpha1.MatchCondition{{Name: "m", Expression: "true"}},
		Validations:     []v1alpha1.Validation{{Expression: "tool.name ==", Message: "m"}}}))))
	f.Add([]byte(`{}`))
	h := NewAdmission(nil, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := post(t, h, body)
		switch rec.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("HTTP %d: %s", rec.Code, rec.Body)
		}
		var in, out admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("accepted a body that does not decode: %v", err)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("answer is not a review: %v: %s", err, rec.Body)
		}
		if out.Response.UID != in.Request.UID {
			t.Fatalf("answer uid %q, want %q", out.Response.UID, in.Request.UID)
		}
		if !out.Response.Allowed && (out.Response.Result == nil || out.Response.Result.Code == 0 || out.Response.Result.Message == "") {
			t.Fatalf("denial without a code and message: %s", rec.Body)
		}
	})
}
