package authz

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/apierror"
)

// CheckRequest is the body of POST /v1/check: Tool and Input for a
// ToolPolicy, Request (the attributes of docs/authz.md) for a
// ValidatingPolicy, and the other CEL variables when a policy needs them.
type CheckRequest struct {
	Tool      string         `json:"tool,omitempty"`
	Input     map[string]any `json:"input,omitempty"`
	Request   map[string]any `json:"request,omitempty"`
	Object    any            `json:"object,omitempty"`
	OldObject any            `json:"oldObject,omitempty"`
	Params    any            `json:"params,omitempty"`
}

// CheckResponse is the answer of POST /v1/check.
type CheckResponse struct {
	Allowed bool   `json:"allowed"`
	Policy  string `json:"policy,omitempty"`
	Message string `json:"message,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Error is the evaluation error that denied the request, if any.
	Error string `json:"error,omitempty"`
	// State is the SDK's state when the decision was made.
	State string `json:"state"`
}

// Handler serves the local decision API, the probes and metrics from g.
func (s *Server) Handler(g prometheus.Gatherer) http.Handler {
	mux := s.probeMux()
	mux.HandleFunc("POST /v1/check", s.serveCheck)
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux
}

// ProbeHandler serves /healthz and /readyz alone, for a listener the
// kubelet can reach: it tells only whether the process runs and whether
// the SDK is synced, as a node's open /healthz and /readyz do.
func (s *Server) ProbeHandler() http.Handler { return s.probeMux() }

func (s *Server) probeMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	return mux
}

// serveReady is 200 only in state ready: before the first sync, after a
// revocation, and while disconnected the proxy should stop sending traffic.
func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	st := s.d.State()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if st != client.StateReady {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = io.WriteString(w, string(st)+"\n")
}

func (s *Server) serveCheck(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	// The body is JSON whatever its Content-Type says: `curl -d` sends
	// form-encoded, and a decision has no side effect to guard.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxBodyBytes)))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.metrics.rejected.WithLabelValues(reasonBody).Inc()
			apierror.Write(w, http.StatusRequestEntityTooLarge, apierror.CodeInvalid, "request body exceeds "+strconv.Itoa(s.cfg.MaxBodyBytes)+" bytes")
			return
		}
		s.reject(w, http.StatusBadRequest, "read request body: "+err.Error())
		return
	}
	var req CheckRequest
	if err := policy.DecodeStrict(body, &req); err != nil {
		s.reject(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Tool == "" && req.Request == nil && req.Object == nil {
		s.reject(w, http.StatusBadRequest, "nothing to decide: set tool (ToolPolicy) or request or object (ValidatingPolicy)")
		return
	}
	d, rej := s.decide(r.Context(), client.Request{
		Request: req.Request, Object: req.Object, OldObject: req.OldObject,
		Params: req.Params, Tool: req.Tool, Input: req.Input,
	})
	if rej != nil {
		apierror.Write(w, rej.status, apierror.CodeUnavailable, rej.message)
		return
	}
	s.metrics.observe(apiHTTP, d, start)
	resp := CheckResponse{Allowed: d.Allowed, Policy: d.Policy, Message: d.Message, Reason: d.Reason, State: string(s.d.State())}
	if d.Err != nil {
		resp.Error = d.Err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(resp) // the caller may be gone; nothing useful to do
}

func (s *Server) reject(w http.ResponseWriter, status int, msg string) {
	s.metrics.rejected.WithLabelValues(reasonBadRequest).Inc()
	apierror.Write(w, status, apierror.CodeInvalid, msg)
}
