package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/policyd/policyd/internal/admissionreview"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// MaxReviewBytes bounds a request body. An AdmissionReview carries at most
// two objects, each below etcd's 1.5 MiB request limit, plus the request
// metadata.
const MaxReviewBytes = 7 << 20

// maxObjectTimeout caps the time spent reading the parent and namespace,
// whatever timeout the API server passes.
const maxObjectTimeout = 10 * time.Second

// Handler serves AdmissionReview admission.k8s.io/v1 over HTTP POST.
type Handler struct {
	cfg     Config
	logger  *slog.Logger
	objs    Objects
	sink    Sink
	metrics *metrics
	now     func() time.Time
}

// NewHandler returns the webhook handler. objs may be nil only when no
// request will have an owner (tests); sink may be nil to drop effects; reg
// may be nil for no metrics.
func NewHandler(cfg Config, logger *slog.Logger, objs Objects, sink Sink, reg prometheus.Registerer) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg.normalized(), logger: logger, objs: objs, sink: sink, metrics: newMetrics(reg, logger), now: time.Now}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	review, err := admissionreview.Read(w, r, MaxReviewBytes)
	if err != nil {
		if errors.Is(err, admissionreview.ErrBad) {
			h.metrics.invalid.Inc()
			h.logger.Debug("rejected admission review", "err", err, "remote", r.RemoteAddr)
		}
		return
	}
	req := review.Request
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout(r))
	defer cancel()

	d := h.review(ctx, req)
	if len(d.Effects) > 0 && h.sink != nil && (req.DryRun == nil || !*req.DryRun) {
		if err := h.sink.Submit(ctx, d.Effects); err != nil {
			h.metrics.effectErrors.Inc()
			h.logger.Warn("submit drift follow-up", "uid", req.UID, "effects", len(d.Effects), "err", err)
		}
	}
	h.write(w, req, d)
	h.metrics.observe(string(req.Operation), d, time.Since(start))
	// Denials, logged drift and ignored annotations (unparsable approvals,
	// invalid trace labels: also sent to the client as warnings) are
	// logged; the rest only counted.
	if !d.Allowed || d.Outcome == OutcomeDriftLogged || len(d.Warnings) > 0 {
		h.logger.Info("drift admission", "outcome", d.Outcome, "allowed", d.Allowed, "code", d.Code,
			"operation", req.Operation, "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name,
			"user", req.UserInfo.Username, "message", d.Message, "warnings", d.Warnings)
	}
}

// review decodes the objects, resolves the parent and decides.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) Decision {
	oldObj, err := decodeObject(req.OldObject.Raw)
	if err != nil {
		return denied(OutcomeBadRequest, http.StatusBadRequest, metav1.StatusReasonBadRequest, "oldObject: "+err.Error())
	}
	newObj, err := decodeObject(req.Object.Raw)
	if err != nil {
		return denied(OutcomeBadRequest, http.StatusBadRequest, metav1.StatusReasonBadRequest, "object: "+err.Error())
	}
	in := Input{Request: req, Old: oldObj, New: newObj, Now: h.now(), Config: h.cfg}
	obj := subject(req, oldObj, newObj)
	if obj == nil || h.objs == nil {
		return Decide(in)
	}
	ref := controllerRef(obj)
	if ref == nil {
		return Decide(in)
	}
	ns := req.Namespace
	if ns == "" {
		ns = obj.GetNamespace()
	}
	if in.Parent, err = h.objs.Parent(ctx, ns, *ref); err != nil {
		return h.parentError(fmt.Errorf("resolve parent %s %s/%s: %w", ref.Kind, ns, ref.Name, err))
	}
	if in.Parent != nil && ns != "" {
		if in.Namespace, err = h.objs.Namespace(ctx, ns); err != nil {
			return h.parentError(fmt.Errorf("read namespace %s: %w", ns, err))
		}
	}
	d := Decide(in)
	switch d.Outcome {
	case OutcomeDriftDenied, OutcomeDriftLogged, OutcomeApproved, OutcomeRejected:
		return h.confirm(ctx, in, ns, *ref, d)
	}
	return d
}

// confirm decides again on the parent as the API server has it, when the
// decision rests on the parent being at rest and the parent came from a
// cache (FreshObjects). If that read fails, the cached copy's decision
// stands: it was right a moment ago, and a 500 is for a parent
// that cannot be resolved at all.
func (h *Handler) confirm(ctx context.Context, in Input, ns string, ref metav1.OwnerReference, d Decision) Decision {
	f, ok := h.objs.(FreshObjects)
	if !ok {
		return d
	}
	p, err := f.FreshParent(ctx, ns, ref)
	if err != nil {
		h.logger.Warn("drift admission cannot confirm the parent; deciding on the cached copy", "parent", ref.Kind+" "+ns+"/"+ref.Name, "err", err)
		return d
	}
	if p != nil && p.GetResourceVersion() == in.Parent.GetResourceVersion() {
		return d
	}
	in.Parent = p
	return Decide(in)
}

// subject is the object whose parent matters, or nil when Decide will not
// look at a parent (status and other subresources, CONNECT).
func subject(req *admissionv1.AdmissionRequest, oldObj, newObj *unstructured.Unstructured) *unstructured.Unstructured {
	if req.SubResource != "" {
		return nil
	}
	switch req.Operation {
	case admissionv1.Create, admissionv1.Update:
		return newObj
	case admissionv1.Delete:
		return oldObj
	}
	return nil
}

// parentError is the 500: the decision needs the parent and it could
// not be read.
func (h *Handler) parentError(err error) Decision {
	h.logger.Warn("drift admission cannot resolve parent", "err", err)
	return denied(OutcomeParentError, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
}

func (h *Handler) write(w http.ResponseWriter, req *admissionv1.AdmissionRequest, d Decision) {
	resp := &admissionv1.AdmissionResponse{
		UID:              req.UID,
		Allowed:          d.Allowed,
		Warnings:         d.Warnings,
		AuditAnnotations: d.AuditAnnotations,
	}
	if !d.Allowed {
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: d.Code, Reason: d.Reason, Message: d.Message}
	} else if len(d.Patch) > 0 {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = d.Patch, &pt
	}
	out := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	}
	b, err := json.Marshal(out)
	if err != nil { // only plain fields: a failure here is a bug
		http.Error(w, "encode admission review: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b) // a write error means the API server is gone
}

// decodeObject parses an embedded object; nil for an absent one. Numbers
// become int64 where integral, as unstructured accessors expect.
func decodeObject(raw []byte) (*unstructured.Unstructured, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var m map[string]any
	if err := utiljson.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if m == nil {
		return nil, errors.New("not a JSON object")
	}
	if md, ok := m["metadata"]; ok {
		if _, ok := md.(map[string]any); !ok {
			return nil, errors.New("metadata is not an object")
		}
		if ann, ok := md.(map[string]any)["annotations"]; ok && ann != nil {
			am, ok := ann.(map[string]any)
			if !ok {
				return nil, errors.New("metadata.annotations is not an object")
			}
			for k, v := range am {
				if _, ok := v.(string); !ok {
					return nil, fmt.Errorf("annotation %q is not a string", k)
				}
			}
		}
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// requestTimeout is the API server's webhook timeout (the timeout query
// parameter it sends), capped.
func requestTimeout(r *http.Request) time.Duration {
	if t, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && t > 0 && t < maxObjectTimeout {
		return t
	}
	return maxObjectTimeout
}

type metrics struct {
	decisions    *prometheus.CounterVec
	latency      prometheus.Histogram
	invalid      prometheus.Counter
	effectErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, logger *slog.Logger) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "policyd_drift_admission_decisions_total",
			Help: "Drift admission decisions by operation, outcome and whether the request was allowed.",
		}, []string{"operation", "outcome", "allowed"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "policyd_drift_admission_duration_seconds",
			Help:    "Time to answer an admission review, parent lookup included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "policyd_drift_admission_invalid_total",
			Help: "Request bodies rejected as not an AdmissionReview v1 (HTTP 4xx).",
		}),
		effectErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "policyd_drift_admission_effect_errors_total",
			Help: "Decisions whose follow-up work could not be submitted to the cluster.",
		}),
	}
	if reg == nil {
		return m
	}
	// A second handler on the same registry (a restarted listener) shares
	// the first one's collectors.
	m.decisions = register(reg, m.decisions, logger)
	m.latency = register(reg, m.latency, logger)
	m.invalid = register(reg, m.invalid, logger)
	m.effectErrors = register(reg, m.effectErrors, logger)
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C, logger *slog.Logger) C {
	err := reg.Register(c)
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	if err != nil {
		logger.Warn("register drift admission metric", "err", err)
	}
	return c
}

func (m *metrics) observe(op string, d Decision, took time.Duration) {
	switch admissionv1.Operation(op) {
	case admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect:
	default:
		op = "other" // the label set stays bounded whatever a client sends
	}
	m.decisions.WithLabelValues(op, d.Outcome, strconv.FormatBool(d.Allowed)).Inc()
	m.latency.Observe(took.Seconds())
}
