package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// fakeObjects stands in for the server's informers in unit tests.
type fakeObjects struct {
	mu         sync.Mutex
	objs       map[string]*unstructured.Unstructured // kind/namespace/name
	parentErr  error
	nsErr      error
	lastCtx    context.Context
	parentCall int
	// fresh, when set, is what FreshParent reads (the API server ahead
	// of the cache); freshGone makes it not found, freshErr fail.
	fresh     *unstructured.Unstructured
	freshGone bool
	freshErr  error
	freshCall int
}

func (f *fakeObjects) freshCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.freshCall
}

func (f *fakeObjects) FreshParent(ctx context.Context, namespace string, ref metav1.OwnerReference) (*unstructured.Unstructured, error) {
	f.mu.Lock()
	f.freshCall++
	fresh, gone, err := f.fresh, f.freshGone, f.freshErr
	f.mu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case gone:
		return nil, nil
	case fresh != nil:
		return fresh, nil
	}
	return f.Parent(ctx, namespace, ref)
}

func newFakeObjects(objs ...*unstructured.Unstructured) *fakeObjects {
	f := &fakeObjects{objs: map[string]*unstructured.Unstructured{}}
	for _, o := range objs {
		f.objs[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = o
	}
	return f
}

func (f *fakeObjects) Parent(ctx context.Context, namespace string, ref metav1.OwnerReference) (*unstructured.Unstructured, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastCtx, f.parentCall = ctx, f.parentCall+1
	if f.parentErr != nil {
		return nil, f.parentErr
	}
	return f.objs[ref.Kind+"/"+namespace+"/"+ref.Name], nil
}

func (f *fakeObjects) Namespace(_ context.Context, name string) (*unstructured.Unstructured, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nsErr != nil {
		return nil, f.nsErr
	}
	return f.objs["Namespace//"+name], nil
}

// recordingSink stands in for the Raft proposer.
type recordingSink struct {
	mu      sync.Mutex
	batches [][]Effect
	err     error
}

func (s *recordingSink) Submit(_ context.Context, effects []Effect) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, effects)
	return s.err
}

func (s *recordingSink) kinds() [][]EffectKind {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]EffectKind
	for _, b := range s.batches {
		var ks []EffectKind
		for _, e := range b {
			ks = append(ks, e.Kind)
		}
		out = append(out, ks)
	}
	return out
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

type webhook struct {
	url  string
	h    *Handler
	objs *fakeObjects
	sink *recordingSink
	reg  *prometheus.Registry
}

func startWebhook(t *testing.T, cfg Config, objs *fakeObjects) *webhook {
	t.Helper()
	w := &webhook{objs: objs, sink: &recordingSink{}, reg: prometheus.NewRegistry()}
	w.h = NewHandler(cfg, slog.New(slog.DiscardHandler), objs, w.sink, w.reg).(*Handler)
	w.h.now = func() time.Time { return now }
	mux := http.NewServeMux()
	mux.Handle("POST "+Path, w.h)
	mux.Handle(Path, w.h) // so that other methods reach the handler's own answer
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	w.url = srv.URL + Path
	return w
}

// post sends body and returns the HTTP status and, for a 200, the review.
func (w *webhook) post(t *testing.T, contentType string, body []byte) (int, *admissionv1.AdmissionReview, string) {
	t.Helper()
	resp, err := http.Post(w.url+"?timeout=3s", contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, string(b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("response Content-Type %q", ct)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &review); err != nil {
		t.Fatalf("response is not an AdmissionReview: %v: %s", err, b)
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" || review.Response == nil {
		t.Fatalf("response review %s", b)
	}
	return resp.StatusCode, &review, string(b)
}

func TestHandlerHTTPErrors(t *testing.T) {
	w := startWebhook(t, enforce(), newFakeObjects())
	valid := reviewBody(t, request(admissionv1.Update, ctrlUser, childOf(steadyParent()), childOf(steadyParent())))
	tests := []struct {
		name        string
		method      string
		contentType string
		body        []byte
		wantCode    int
		wantText    string
	}{
		{"GET", http.MethodGet, "application/json", nil, http.StatusMethodNotAllowed, "POST"},
		{"text body", http.MethodPost, "text/plain", valid, http.StatusUnsupportedMediaType, "application/json"},
		{"no content type", http.MethodPost, "", valid, http.StatusUnsupportedMediaType, "application/json"},
		{"not JSON", http.MethodPost, "application/json", []byte("<xml/>"), http.StatusBadRequest, "bad admission review"},
		{"JSON array", http.MethodPost, "application/json", []byte("[]"), http.StatusBadRequest, "bad admission review"},
		{"v1beta1", http.MethodPost, "application/json", bytes.Replace(valid, []byte("admission.k8s.io/v1"), []byte("admission.k8s.io/v1beta1"), 1), http.StatusBadRequest, "want admission.k8s.io/v1 AdmissionReview"},
		{"no request", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest, "no request"},
		{"no uid", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`), http.StatusBadRequest, "no uid"},
		{"wrong field type", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}`), http.StatusBadRequest, "bad admission review"},
		{"invalid UTF-8", http.MethodPost, "application/json", []byte("{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{\"uid\":\"u\",\"object\":{\"metadata\":{\"name\":\"a\xffb\"}}}}"), http.StatusBadRequest, "request.object.metadata.name is not valid UTF-8"},
		{"lone surrogate escape", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"\udc00"}}`), http.StatusBadRequest, "request.uid is not valid UTF-8"},
		{"too large", http.MethodPost, "application/json", append(append([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":"`), bytes.Repeat([]byte("a"), MaxReviewBytes)...), '"', '}'), http.StatusRequestEntityTooLarge, "too large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, w.url, bytes.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantCode || !strings.Contains(string(b), tc.wantText) {
				t.Errorf("%d %q, want %d containing %q", resp.StatusCode, b, tc.wantCode, tc.wantText)
			}
		})
	}
	if got := testutil.ToFloat64(w.h.metrics.invalid); got != 9 {
		t.Errorf("invalid reviews counted %v, want 9", got)
	}
}

func TestHandlerDecisions(t *testing.T) {
	parent := steadyParent()
	child := childOf(parent)
	drift := with(child, specField("replicas", int64(2)))
	nsEnforce := with(newObj("v1", "Namespace", "ns"), func(u *unstructured.Unstructured) { delete(md(u), "namespace") }, ann("mode", ModeEnforce))

	t.Run("drift is denied with 403, the uid echoed, and reported", func(t *testing.T) {
		w := startWebhook(t, enforce(), newFakeObjects(parent))
		code, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, ctrlUser, child, drift)))
		if code != 200 {
			t.Fatalf("HTTP %d: %s", code, raw)
		}
		r := review.Response
		if r.UID != "req-1" || r.Allowed || r.Result == nil || r.Result.Code != 403 || r.Result.Reason != metav1.StatusReasonForbidden || !strings.Contains(r.Result.Message, "drift") {
			t.Fatalf("response %s", raw)
		}
		if r.Patch != nil || r.PatchType != nil {
			t.Errorf("denial with a patch: %s", raw)
		}
		if r.AuditAnnotations["decision"] != OutcomeDriftDenied || r.AuditAnnotations["actor"] != "controller" {
			t.Errorf("audit annotations %v", r.AuditAnnotations)
		}
		if got := w.sink.kinds(); len(got) != 1 || len(got[0]) != 1 || got[0][0] != EffectDriftDetected {
			t.Errorf("sink got %v, want one DriftDetected", got)
		}
		if got := testutil.ToFloat64(w.h.metrics.decisions.WithLabelValues("UPDATE", OutcomeDriftDenied, "false")); got != 1 {
			t.Errorf("decision metric %v, want 1", got)
		}
		if got := testutil.CollectAndCount(w.h.metrics.latency); got != 1 {
			t.Errorf("latency series %d", got)
		}
		w.objs.mu.Lock()
		dl, ok := w.objs.lastCtx.Deadline()
		w.objs.mu.Unlock()
		if !ok || time.Until(dl) > 3*time.Second {
			t.Errorf("parent lookup deadline %v (set %v), want within the API server's 3s timeout", dl, ok)
		}
	})
	t.Run("the namespace's mode is read", func(t *testing.T) {
		w := startWebhook(t, logMode(), newFakeObjects(parent, nsEnforce))
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, ctrlUser, child, drift)))
		if review.Response.Allowed || review.Response.Result.Code != 403 {
			t.Fatalf("response %s", raw)
		}
	})
	t.Run("drift is confirmed on the API server's copy of the parent", func(t *testing.T) {
		reconciling := with(parent, gen(4), func(u *unstructured.Unstructured) { md(u)["resourceVersion"] = "8" })
		approved := with(parent, ann("approvals", `[{"kind":"Gadget","name":"g","mode":"always"}]`), func(u *unstructured.Unstructured) { md(u)["resourceVersion"] = "9" })
		for _, tc := range []struct {
			name        string
			setup       func(*fakeObjects)
			wantAllowed bool
			wantOutcome string
		}{
			{"the cache is current: drift", func(*fakeObjects) {}, false, OutcomeDriftDenied},
			{"the cache trails a spec change: expected", func(f *fakeObjects) { f.fresh = reconciling }, true, OutcomeExpected},
			{"the cache trails an approval: approved", func(f *fakeObjects) { f.fresh = approved }, true, OutcomeApproved},
			{"the parent is gone: allowed", func(f *fakeObjects) { f.freshGone = true }, true, OutcomeParentGone},
			{"the read fails: the cached copy decides", func(f *fakeObjects) { f.freshErr = errors.New("apiserver down") }, false, OutcomeDriftDenied},
		} {
			t.Run(tc.name, func(t *testing.T) {
				objs := newFakeObjects(parent)
				tc.setup(objs)
				w := startWebhook(t, enforce(), objs)
				_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, ctrlUser, child, drift)))
				if review.Response.Allowed != tc.wantAllowed || review.Response.AuditAnnotations["decision"] != tc.wantOutcome {
					t.Fatalf("response %s, want allowed=%v outcome %s", raw, tc.wantAllowed, tc.wantOutcome)
				}
				if n := objs.freshCalls(); n != 1 {
					t.Errorf("%d fresh reads, want 1", n)
				}
			})
		}
		t.Run("no fresh read off the drift path", func(t *testing.T) {
			objs := newFakeObjects(parent)
			w := startWebhook(t, enforce(), objs)
			w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, human, child, drift)))
			if n := objs.freshCalls(); n != 0 {
				t.Errorf("%d fresh reads for a new origin, want 0", n)
			}
		})
	})
	t.Run("a bad trace label is ignored with a warning, not an error", func(t *testing.T) {
		w := startWebhook(t, enforce(), newFakeObjects(parent))
		newObj := with(child, specField("replicas", int64(2)), ann("trace--x", "y"), ann("trace-big", strings.Repeat("z", 2048)))
		code, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, human, child, newObj)))
		if code != 200 || !review.Response.Allowed || len(review.Response.Warnings) != 2 || !strings.Contains(review.Response.Warnings[0], "ignoring "+pfx+"trace-") {
			t.Fatalf("HTTP %d: %s", code, raw)
		}
	})
	t.Run("log mode: allowed with a warning and a JSONPatch", func(t *testing.T) {
		w := startWebhook(t, logMode(), newFakeObjects(parent))
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, ctrlUser, child, drift)))
		r := review.Response
		if !r.Allowed || r.Result != nil || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "drift") {
			t.Fatalf("response %s", raw)
		}
		if r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch {
			t.Fatalf("patch type %v", r.PatchType)
		}
		p, err := jsonpatch.DecodePatch(r.Patch)
		if err != nil {
			t.Fatal(err)
		}
		out, err := p.Apply(mustJSON(drift.Object))
		if err != nil {
			t.Fatalf("patch does not apply: %v", err)
		}
		if !strings.Contains(string(out), `"drift\":true`) {
			t.Errorf("trace does not mark the drift: %s", out)
		}
	})
	t.Run("dry run: same answer, nothing submitted", func(t *testing.T) {
		w := startWebhook(t, enforce(), newFakeObjects(parent))
		req := request(admissionv1.Update, ctrlUser, child, drift)
		req.DryRun = new(true)
		_, review, raw := w.post(t, "application/json", reviewBody(t, req))
		if review.Response.Allowed || review.Response.Result.Code != 403 {
			t.Fatalf("response %s", raw)
		}
		if got := w.sink.kinds(); len(got) != 0 {
			t.Errorf("dry run submitted %v", got)
		}
	})
	t.Run("parent not found: allowed", func(t *testing.T) {
		w := startWebhook(t, enforce(), newFakeObjects())
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, ctrlUser, child, drift)))
		if !review.Response.Allowed || review.Response.AuditAnnotations["decision"] != OutcomeParentGone {
			t.Fatalf("response %s", raw)
		}
	})
	t.Run("error resolving the parent: 500", func(t *testing.T) {
		objs := newFakeObjects(parent)
		objs.parentErr = errors.New("informer not synced")
		w := startWebhook(t, enforce(), objs)
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, human, child, drift)))
		r := review.Response
		if r.Allowed || r.Result.Code != 500 || r.Result.Reason != metav1.StatusReasonInternalError ||
			!strings.Contains(r.Result.Message, "informer not synced") || !strings.Contains(r.Result.Message, "Widget ns/w") {
			t.Fatalf("response %s", raw)
		}
	})
	t.Run("error reading the namespace: 500", func(t *testing.T) {
		objs := newFakeObjects(parent)
		objs.nsErr = errors.New("forbidden")
		w := startWebhook(t, enforce(), objs)
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, human, child, drift)))
		if review.Response.Allowed || review.Response.Result.Code != 500 {
			t.Fatalf("response %s", raw)
		}
	})
	t.Run("no controller owner: no lookup, allowed", func(t *testing.T) {
		objs := newFakeObjects(parent)
		objs.parentErr = errors.New("must not be called")
		w := startWebhook(t, enforce(), objs)
		orphan := with(child, ownedBy(parent, false))
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, ctrlUser, orphan, with(orphan, specField("replicas", int64(2))))))
		if !review.Response.Allowed || objs.parentCall != 0 {
			t.Fatalf("response %s (parent calls %d)", raw, objs.parentCall)
		}
	})
	t.Run("status update: no parent lookup, controller recorded", func(t *testing.T) {
		objs := newFakeObjects()
		objs.parentErr = errors.New("must not be called")
		w := startWebhook(t, enforce(), objs)
		owned := with(parent, ownedBy(newObj("example.com/v1", "Top", "top"), true), noAnn("controllers"))
		req := request(admissionv1.Update, ctrlUser, owned, owned)
		req.SubResource = "status"
		_, review, raw := w.post(t, "application/json", reviewBody(t, req))
		if !review.Response.Allowed || review.Response.Patch == nil || objs.parentCall != 0 {
			t.Fatalf("response %s", raw)
		}
		if got := w.sink.kinds(); len(got) != 1 || got[0][0] != EffectRecordController {
			t.Errorf("sink got %v", got)
		}
	})
	t.Run("DELETE reads the parent from oldObject", func(t *testing.T) {
		w := startWebhook(t, enforce(), newFakeObjects(parent))
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Delete, ctrlUser, child, nil)))
		if review.Response.Allowed || review.Response.Result.Code != 403 || review.Response.Patch != nil {
			t.Fatalf("response %s", raw)
		}
	})
	t.Run("a failing sink does not change the answer", func(t *testing.T) {
		w := startWebhook(t, logMode(), newFakeObjects(parent))
		w.sink.err = errors.New("no leader")
		_, review, raw := w.post(t, "application/json", reviewBody(t, request(admissionv1.Update, ctrlUser, child, drift)))
		if !review.Response.Allowed {
			t.Fatalf("response %s", raw)
		}
		if got := testutil.ToFloat64(w.h.metrics.effectErrors); got != 1 {
			t.Errorf("effect errors %v, want 1", got)
		}
	})
}

// TestHandlerBadObjects: a well-formed review with a bad object gets a
// clear denial for that request, not an HTTP error.
func TestHandlerBadObjects(t *testing.T) {
	w := startWebhook(t, enforce(), newFakeObjects(steadyParent()))
	base := request(admissionv1.Update, ctrlUser, childOf(steadyParent()), childOf(steadyParent()))
	for _, tc := range []struct {
		name, object, old, want string
	}{
		{"object is a string", `"pod"`, "", "object: not a JSON object"},
		{"object is null with an UPDATE", `null`, "", "UPDATE request has no object"},
		{"oldObject is an array", `{"metadata":{}}`, `[1,2]`, "oldObject: not a JSON object"},
		{"metadata is a string", `{"metadata":"x"}`, "", "metadata is not an object"},
		{"annotations hold a number", `{"metadata":{"annotations":{"a":1}}}`, "", `annotation "a" is not a string`},
		{"annotations are a list", `{"metadata":{"annotations":["a"]}}`, "", "annotations is not an object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := base.DeepCopy()
			req.Object.Raw = []byte(tc.object)
			if tc.old != "" {
				req.OldObject.Raw = []byte(tc.old)
			}
			code, review, raw := w.post(t, "application/json; charset=utf-8", reviewBody(t, req))
			if code != 200 {
				t.Fatalf("HTTP %d: %s", code, raw)
			}
			r := review.Response
			if r.Allowed || r.UID != "req-1" || r.Result.Code != 400 || !strings.Contains(r.Result.Message, tc.want) {
				t.Errorf("response %s, want a 400 denial containing %q", raw, tc.want)
			}
		})
	}
}

func TestHandlerSharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := NewHandler(enforce(), nil, nil, nil, reg).(*Handler)
	b := NewHandler(enforce(), nil, nil, nil, reg).(*Handler)
	if a.metrics.decisions != b.metrics.decisions {
		t.Error("second handler did not reuse the registered collectors")
	}
	// No Objects and no Sink: still answers.
	rec := httptest.NewRecorder()
	child := childOf(steadyParent())
	r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(reviewBody(t, request(admissionv1.Update, ctrlUser, child, with(child, specField("replicas", int64(9)))))))
	r.Header.Set("Content-Type", "application/json")
	b.ServeHTTP(rec, r)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"allowed":true`) {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}
