package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/admissionreview"
	"github.com/policyd/policyd/internal/policy"
)

// AdmissionPath is where the webhook is served, on the drift listener.
const AdmissionPath = "/admission/policies"

// MaxReviewBytes bounds a request body: an AdmissionReview carries at most
// two objects, each below etcd's 1.5 MiB request limit, plus metadata.
const MaxReviewBytes = 7 << 20

// admission validates ToolPolicy and ValidatingPolicy objects as the REST
// API validates policies.
type admission struct {
	validator *policy.Validator
	logger    *slog.Logger
}

// NewAdmission returns the validating webhook for the two kinds
// (AdmissionReview admission.k8s.io/v1). A nil validator takes the built-in
// kinds' rules.
func NewAdmission(validator *policy.Validator, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &admission{validator: validator, logger: logger}
}

func (a *admission) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	review, err := admissionreview.Read(w, r, MaxReviewBytes)
	if err != nil {
		a.logger.Debug("rejected admission review", "err", err, "remote", r.RemoteAddr)
		return
	}
	req := review.Request
	resp := a.review(req)
	resp.UID = req.UID
	if !resp.Allowed {
		a.logger.Info("policy admission denied", "operation", req.Operation, "kind", req.Kind.Kind, "name", req.Name,
			"user", req.UserInfo.Username, "message", resp.Result.Message)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil { // plain fields only: a failure here is a bug
		http.Error(w, "encode admission review: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b) // a write error means the API server is gone
}

// review decides one request.
func (a *admission) review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Kind.Group != v1alpha1.Group {
		return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("kind %s.%s is not served here (want %s)", req.Kind.Kind, req.Kind.Group, v1alpha1.Group))
	}
	if _, ok := resourceOf(req.Kind.Kind); !ok {
		return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("kind %s is not served here (want %s or %s)", req.Kind.Kind, policy.KindToolPolicy, policy.KindValidatingPolicy))
	}
	if req.SubResource != "" || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return &admissionv1.AdmissionResponse{Allowed: true} // a status write, a delete: nothing to validate
	}
	o, err := fromRaw(req.Kind.Kind, req.Object.Raw)
	if err != nil {
		return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, "object: "+err.Error())
	}
	if o.Name == "" {
		o.Name = req.Name
	}
	d, err := convert(o)
	if err == nil {
		err = a.validator.Policy(d.Policy)
	}
	if err != nil {
		return deny(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, kubeMessage(err.Error()))
	}
	return &admissionv1.AdmissionResponse{Allowed: true}
}

func deny(code int32, reason metav1.StatusReason, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: clip(msg)}}
}

// rawObject is the part of an object conversion reads.
type rawObject struct {
	Metadata struct {
		Name        string            `json:"name"`
		Generation  int64             `json:"generation"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// fromRaw takes what conversion needs from an object's JSON.
func fromRaw(kind string, raw []byte) (object, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return object{}, errors.New("missing")
	}
	var r rawObject
	if err := json.Unmarshal(raw, &r); err != nil {
		return object{}, fmt.Errorf("not a %s: %w", kind, err)
	}
	return object{
		Kind:       kind,
		Name:       r.Metadata.Name,
		Generation: r.Metadata.Generation,
		Adopt:      r.Metadata.Annotations[v1alpha1.AnnotationAdopt] == "true",
		Spec:       r.Spec,
	}, nil
}
