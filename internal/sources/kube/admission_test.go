package kube

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/policy"
)

func reviewOf(t testing.TB, op admissionv1.Operation, kind string, obj any) *admissionv1.AdmissionRequest {
	t.Helper()
	req := &admissionv1.AdmissionRequest{
		UID:       types.UID("uid-1"),
		Kind:      metav1.GroupVersionKind{Group: v1alpha1.Group, Version: "v1alpha1", Kind: kind},
		Operation: op,
		Name:      "acme.p",
	}
	if obj != nil {
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		req.Object = runtime.RawExtension{Raw: b}
	}
	return req
}

func reviewBody(t testing.TB, req *admissionv1.AdmissionRequest) []byte {
	t.Helper()
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func post(t testing.TB, h http.Handler, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, AdmissionPath, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, r)
	return rec
}

func tool(spec v1alpha1.ToolPolicySpec) *v1alpha1.ToolPolicy {
	return &v1alpha1.ToolPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policyd.io/v1alpha1", Kind: "ToolPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "acme.p"}, Spec: spec,
	}
}

func validating(spec v1alpha1.ValidatingPolicySpec) *v1alpha1.ValidatingPolicy {
	return &v1alpha1.ValidatingPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policyd.io/v1alpha1", Kind: "ValidatingPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "acme.p"}, Spec: spec,
	}
}

// restMessage is what the REST API answers for p: the webhook must say
// the same.
func restMessage(t *testing.T, p *policy.Policy) string {
	t.Helper()
	err := validator(t).Policy(p)
	if err == nil {
		t.Fatal("the REST API accepts the policy")
	}
	return err.Error()
}

// TestAdmissionDecides runs reviews of valid and invalid objects through the
// handler.
func TestAdmissionDecides(t *testing.T) {
	h := NewAdmission(validator(t), nil)
	ok := v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny", Conditions: &v1alpha1.ToolConditions{Patterns: []string{"rm -rf"}}}
	badRE := v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny", Conditions: &v1alpha1.ToolConditions{Patterns: []string{"ok", "(unclosed"}}}
	badScope := ok
	badScope.Scope = v1alpha1.Scope{Team: "infra"}
	badCEL := v1alpha1.ValidatingPolicySpec{Validations: []v1alpha1.Validation{{Expression: "tool.name ==", Message: "m"}}}
	nonBool := v1alpha1.ValidatingPolicySpec{Validations: []v1alpha1.Validation{{Expression: "1 + 1", Message: "m"}}}
	tests := []struct {
		name    string
		req     *admissionv1.AdmissionRequest
		allowed bool
		code    int32
		message string // exact, or a prefix ending in "*"
	}{
		{name: "valid ToolPolicy", req: reviewOf(t, admissionv1.Create, "ToolPolicy", tool(ok)), allowed: true},
		{name: "valid ValidatingPolicy", req: reviewOf(t, admissionv1.Update, "ValidatingPolicy",
			validating(v1alpha1.ValidatingPolicySpec{Validations: []v1alpha1.Validation{{Expression: `tool.name != "Bash"`, Message: "no Bash"}}})), allowed: true},
		{name: "bad RE2", req: reviewOf(t, admissionv1.Create, "ToolPolicy", tool(badRE)), code: 422,
			message: restMessage(t, &policy.Policy{Name: "acme.p", Kind: "ToolPolicy", Spec: []byte(`{"tool_name":"Bash","action":"deny","conditions":{"patterns":["ok","(unclosed"]}}`)})},
		{name: "bad CEL", req: reviewOf(t, admissionv1.Create, "ValidatingPolicy", validating(badCEL)), code: 422,
			message: restMessage(t, &policy.Policy{Name: "acme.p", Kind: "ValidatingPolicy", Spec: []byte(`{"validations":[{"expression":"tool.name ==","message":"m"}]}`)})},
		{name: "CEL not a bool", req: reviewOf(t, admissionv1.Create, "ValidatingPolicy", validating(nonBool)), code: 422,
			message: "spec.validations[0].expression: must evaluate to bool, got int"},
		{name: "bad scope", req: reviewOf(t, admissionv1.Create, "ToolPolicy", tool(badScope)), code: 422,
			message: "scope.org: required when scope.team or scope.employee is set"},
		{name: "bad name", req: reviewOf(t, admissionv1.Create, "ToolPolicy", func() *v1alpha1.ToolPolicy { p := tool(ok); p.Name = "Acme_P"; return p }()), code: 422,
			message: "name: must be a lowercase DNS-1123 subdomain*"},
		{name: "missing toolName, camelCase path", req: reviewOf(t, admissionv1.Create, "ToolPolicy", tool(v1alpha1.ToolPolicySpec{Action: "deny"})), code: 422,
			message: "spec.toolName: required"},
		{name: "unknown spec field", req: reviewOf(t, admissionv1.Create, "ToolPolicy", map[string]any{
			"metadata": map[string]any{"name": "acme.p"}, "spec": map[string]any{"toolName": "Bash", "action": "deny", "toolname": "x"}}), code: 422,
			message: "spec.toolname: unknown field*"},
		{name: "spec not an object", req: reviewOf(t, admissionv1.Create, "ToolPolicy", map[string]any{"metadata": map[string]any{"name": "acme.p"}, "spec": 7}), code: 422,
			message: "spec*"},
		{name: "no spec", req: reviewOf(t, admissionv1.Create, "ToolPolicy", map[string]any{"metadata": map[string]any{"name": "acme.p"}}), code: 422,
			message: "spec: required"},
		{name: "object not an object", req: reviewOf(t, admissionv1.Create, "ToolPolicy", []int{1}), code: 400, message: "object: not a ToolPolicy*"},
		{name: "no object", req: reviewOf(t, admissionv1.Create, "ToolPolicy", nil), code: 400, message: "object: missing"},
		{name: "wrong kind", req: reviewOf(t, admissionv1.Create, "Widget", tool(ok)), code: 400, message: "kind Widget is not served here*"},
		{name: "wrong group", req: func() *admissionv1.AdmissionRequest {
			r := reviewOf(t, admissionv1.Create, "ToolPolicy", tool(ok))
			r.Kind.Group = "example.com"
			return r
		}(), code: 400, message: "kind ToolPolicy.example.com is not served here*"},
		{name: "delete", req: reviewOf(t, admissionv1.Delete, "ToolPolicy", nil), allowed: true},
		{name: "status write", req: func() *admissionv1.AdmissionRequest {
			r := reviewOf(t, admissionv1.Update, "ToolPolicy", tool(badRE))
			r.SubResource = "status"
			return r
		}(), allowed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := post(t, h, reviewBody(t, tc.req))
			if rec.Code != http.StatusOK {
				t.Fatalf("HTTP %d: %s", rec.Code, rec.Body)
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
				t.Fatalf("answer is not a review: %v: %s", err, rec.Body)
			}
			resp := out.Response
			if got, want := resp.UID, tc.req.UID; got != want {
				t.Errorf("uid = %q, want %q", got, want)
			}
			if got, want := resp.Allowed, tc.allowed; got != want {
				t.Fatalf("allowed = %v, want %v (%+v)", got, want, resp.Result)
			}
			if tc.allowed {
				return
			}
			if got, want := resp.Result.Code, tc.code; got != want {
				t.Errorf("code = %d, want %d", got, want)
			}
			if prefix, ok := strings.CutSuffix(tc.message, "*"); ok {
				if !strings.HasPrefix(resp.Result.Message, prefix) {
					t.Errorf("message = %q, want it to start with %q", resp.Result.Message, prefix)
				}
			} else if diff := cmp.Diff(tc.message, resp.Result.Message); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAdmissionRefusesHostileBodies checks that what is not an admission
// review gets a 4xx.
func TestAdmissionRefusesHostileBodies(t *testing.T) {
	h := NewAdmission(nil, nil)
	valid := reviewBody(t, reviewOf(t, admissionv1.Create, "ToolPolicy", tool(v1alpha1.ToolPolicySpec{ToolName: "Bash", Action: "deny"})))
	tests := []struct {
		name        string
		method      string
		contentType string
		body        []byte
		code        int
	}{
		{"GET", http.MethodGet, "application/json", nil, http.StatusMethodNotAllowed},
		{"not JSON content", http.MethodPost, "text/plain", valid, http.StatusUnsupportedMediaType},
		{"malformed JSON", http.MethodPost, "application/json", []byte(`{"apiVersion":`), http.StatusBadRequest},
		{"null", http.MethodPost, "application/json", []byte(`null`), http.StatusBadRequest},
		{"wrong apiVersion", http.MethodPost, "application/json", bytes.Replace(valid, []byte("admission.k8s.io/v1"), []byte("admission.k8s.io/v1beta1"), 1), http.StatusBadRequest},
		{"no request", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest},
		{"no uid", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}`), http.StatusBadRequest},
		{"invalid UTF-8", http.MethodPost, "application/json", bytes.Replace(valid, []byte("Bash"), []byte("B\xffsh"), 1), http.StatusBadRequest},
		{"lone surrogate", http.MethodPost, "application/json", bytes.Replace(valid, []byte("Bash"), []byte(`B\ud800sh`), 1), http.StatusBadRequest},
		{"oversize", http.MethodPost, "application/json", append(append([]byte(`{"pad":"`), bytes.Repeat([]byte("a"), MaxReviewBytes)...), `"}`...), http.StatusRequestEntityTooLarge},
		{"valid", http.MethodPost, "application/json", valid, http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(tc.method, AdmissionPath, bytes.NewReader(tc.body))
			r.Header.Set("Content-Type", tc.contentType)
			h.ServeHTTP(rec, r)
			if got, want := rec.Code, tc.code; got != want {
				t.Fatalf("HTTP %d, want %d: %s", got, want, rec.Body)
			}
		})
	}
}
