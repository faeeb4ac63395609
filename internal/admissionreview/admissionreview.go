// Package admissionreview reads the AdmissionReview v1 requests that
// policyd's admission webhooks (drift, and the policy sources') take, with
// the same refusals for both.
package admissionreview

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/policyd/policyd/internal/utf8field"
)

// ErrBad is a body that is not an AdmissionReview v1 with a request: it is
// answered with HTTP 400 (413 when too large), as there is no request UID
// to answer to.
var ErrBad = errors.New("bad admission review")

// Read reads r's review: a POST of application/json, at most limit bytes.
// On an error it has answered w already (405, 415, 400 or 413); an error
// about the body wraps ErrBad.
func Read(w http.ResponseWriter, r *http.Request, limit int64) (*admissionv1.AdmissionReview, error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "admission reviews are POSTed", http.StatusMethodNotAllowed)
		return nil, fmt.Errorf("method %s", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return nil, fmt.Errorf("content type %q", r.Header.Get("Content-Type"))
	}
	review, err := decode(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		code := http.StatusBadRequest
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			code = http.StatusRequestEntityTooLarge
		}
		http.Error(w, err.Error(), code)
		return nil, err
	}
	return review, nil
}

// decode reads an AdmissionReview v1 with a request.
func decode(body io.Reader) (*admissionv1.AdmissionReview, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, fmt.Errorf("%w: read body: %w", ErrBad, err)
	}
	// encoding/json would take invalid UTF-8 for U+FFFD without a word.
	if err := utf8field.JSON(b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBad, err)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &review); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBad, err)
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("%w: apiVersion %q kind %q, want %s AdmissionReview", ErrBad, review.APIVersion, review.Kind, admissionv1.SchemeGroupVersion)
	}
	if review.Request == nil {
		return nil, fmt.Errorf("%w: no request", ErrBad)
	}
	if review.Request.UID == "" {
		return nil, fmt.Errorf("%w: request has no uid", ErrBad)
	}
	return &review, nil
}
