// Package authz is `policyd authz`: a sidecar that follows one identity's
// policies through the client SDK and answers authorization questions from
// that replica, so a proxy decides locally and fails closed with the SDK.
// It serves Envoy's ext_authz gRPC API (envoy.service.auth.v3.Authorization)
// and a local HTTP decision API (POST /v1/check), with /healthz, /readyz and
// /metrics beside it, and optionally a plain probe listener. It bounds
// concurrent evaluations (Config.MaxInFlight); connections and streams are
// bounded by the caller (Serve). The answers, limits and flags are in
// docs/authz.md.
package authz

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"

	"github.com/policyd/policyd/client"
)

// Defaults of Config.
const (
	DefaultMaxHeaderBytes = 64 << 10
	DefaultMaxBodyBytes   = 1 << 20
	DefaultMaxInFlight    = 1024
	// maxQueueWait bounds how long a check waits for an evaluation slot.
	maxQueueWait = time.Second
	// queueMargin is how long before a check's deadline its wait for a
	// slot ends (at most a fifth of what is left).
	queueMargin = 20 * time.Millisecond
)

// Response headers naming why a request was denied.
const (
	HeaderPolicy = "x-policyd-policy"
	HeaderReason = "x-policyd-reason"
	HeaderState  = "x-policyd-state"
)

// Decider is the part of the SDK's client.Client the server uses.
type Decider interface {
	Evaluate(ctx context.Context, req client.Request) client.Decision
	State() client.State
	Policies() []client.Policy
	EvalErrors() uint64
}

// Config bounds the server. Zero values take the defaults.
type Config struct {
	Limits
	// MaxInFlight bounds the evaluations running at once.
	MaxInFlight int
}

func (c Config) withDefaults() Config {
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	return c
}

// Server answers checks from a Decider. It implements
// authv3.AuthorizationServer, and Handler serves the HTTP side.
type Server struct {
	authv3.UnimplementedAuthorizationServer

	cfg     Config
	logger  *slog.Logger
	d       Decider
	slots   chan struct{}
	metrics *metrics
	health  *health.Server
}

// New returns a server deciding with d, its metrics registered on reg.
func New(cfg Config, logger *slog.Logger, d Decider, reg prometheus.Registerer) (*Server, error) {
	cfg = cfg.withDefaults()
	m, err := newMetrics(reg, d)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, logger: logger, d: d, slots: make(chan struct{}, cfg.MaxInFlight), metrics: m, health: health.NewServer()}
	s.StateChanged("", d.State())
	return s, nil
}

// Config returns the configuration in force, defaults applied.
func (s *Server) Config() Config { return s.cfg }

// Check implements Envoy's ext_authz Check. Every outcome is an answer, not
// an error, so that Envoy's failure_mode_allow never decides.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := time.Now()
	attrs, rej := attributes(req, s.cfg.Limits)
	if rej != nil {
		s.metrics.rejected.WithLabelValues(rej.reason).Inc()
		return deniedResponse(rej.status, codes.InvalidArgument, rej.message, nil), nil
	}
	d, rej := s.decide(ctx, client.Request{Request: attrs})
	if rej != nil {
		return deniedResponse(rej.status, codes.Unavailable, rej.message, nil), nil
	}
	s.metrics.observe(apiGRPC, d, start)
	if d.Allowed {
		return &authv3.CheckResponse{
			Status:       &rpcstatus.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
		}, nil
	}
	return deniedResponse(http.StatusForbidden, codes.PermissionDenied, d.Message, s.denialHeaders(d)), nil
}

// decide evaluates req in one of the bounded slots. maxQueueWait bounds
// only the wait for a slot: the evaluation runs under the caller's ctx, or
// a check that got its slot just in time would be denied as cancelled.
func (s *Server) decide(ctx context.Context, req client.Request) (client.Decision, *rejection) {
	select {
	case s.slots <- struct{}{}:
	default:
		// Give up early enough that the deny reaches the caller before its
		// own deadline: Envoy would otherwise time out first and let
		// failure_mode_allow decide.
		budget := maxQueueWait
		if dl, ok := ctx.Deadline(); ok {
			left := time.Until(dl)
			budget = min(budget, left-min(queueMargin, left/5))
		}
		wait, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		select {
		case s.slots <- struct{}{}:
		case <-wait.Done():
			s.metrics.rejected.WithLabelValues(reasonOverloaded).Inc()
			return client.Decision{}, &rejection{http.StatusServiceUnavailable, reasonOverloaded, "policyd authz is overloaded"}
		}
	}
	defer func() { <-s.slots }()
	return s.d.Evaluate(ctx, req), nil
}

// denialHeaders name the policy, or the state, that denied.
func (s *Server) denialHeaders(d client.Decision) [][2]string {
	if d.Policy == "" {
		if d.Err != nil {
			return nil // an error outside any policy (a cancelled request)
		}
		return [][2]string{{HeaderState, string(s.d.State())}}
	}
	h := [][2]string{{HeaderPolicy, d.Policy}}
	if d.Reason != "" {
		h = append(h, [2]string{HeaderReason, d.Reason})
	}
	return h
}

func deniedResponse(httpStatus int, code codes.Code, body string, headers [][2]string) *authv3.CheckResponse {
	opts := make([]*corev3.HeaderValueOption, 0, len(headers)+1)
	opts = append(opts, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-type", Value: "text/plain; charset=utf-8"}})
	for _, h := range headers {
		opts = append(opts, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h[0], Value: h[1]}})
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code), Message: body},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(httpStatus)},
			Headers: opts,
			Body:    body,
		}},
	}
}
