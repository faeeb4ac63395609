package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"google.golang.org/grpc"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// Transports.
const (
	// TransportGRPC is the discovery stream (api/discovery/v1).
	TransportGRPC = "grpc"
	// TransportWS is the WebSocket feed (api/feed/v1).
	TransportWS = "ws"
)

// Defaults applied by New to zero fields.
const (
	DefaultGrace          = 5 * time.Minute
	DefaultHealthInterval = 30 * time.Second
	DefaultBackoffMin     = 100 * time.Millisecond
	DefaultBackoffMax     = 10 * time.Second
	// DefaultUnknownIdentityGrace is how long an identity the server does
	// not know is retried before it counts as revoked: long enough for a
	// provisioning script to create the employee after starting its proxy,
	// or for a lagging node to catch up.
	DefaultUnknownIdentityGrace = 30 * time.Second
	// DefaultMaxMessageBytes bounds one received snapshot or message.
	DefaultMaxMessageBytes = 64 << 20
	// DefaultCELCostLimit is the CEL cost budget of one expression's
	// evaluation: a tenth of Kubernetes' per-call limit, since a sidecar
	// decides on the request path (it stops a runaway expression within
	// tens of milliseconds on a small machine).
	DefaultCELCostLimit = 100_000
)

// Scope names the identity whose policies a gRPC client asks for. With the
// server in auth.mode jwt it may be left empty (the token's identity is used)
// or must name the token's org and employee; the team served is the employee
// record's whatever Scope names, so a sidecar whose employee moved team
// follows the new team without being reconfigured.
type Scope struct {
	Org      string `json:"org"`
	Team     string `json:"team"`
	Employee string `json:"employee"`
}

// Config configures a Client. Only Servers is required.
type Config struct {
	// Servers are the nodes, tried in order with failover. For
	// TransportGRPC: gRPC addresses (host:port, or any target grpc.NewClient
	// accepts). For TransportWS: HTTP addresses (host:port) or http(s):// or
	// ws(s):// URLs; a URL without a path gets /ws/policies.
	Servers []string
	// Transport is TransportGRPC (default) or TransportWS.
	Transport string
	// Token is the sidecar's JWT, sent as "authorization: Bearer" metadata
	// (gRPC) or header (WebSocket). Empty: no token (server in auth.mode none).
	Token string
	// TokenSource, when set, is called before each connection attempt and
	// replaces Token, so a rotated token is picked up on reconnect.
	TokenSource func(ctx context.Context) (string, error)
	// Employee names the employee for TransportWS when there is no token
	// (server in auth.mode none): it is sent as ?employee=. Ignored when a
	// token is sent.
	Employee string
	// Scope is what a TransportGRPC client asks for (ignored by
	// TransportWS, where the identity is the token's or Employee).
	Scope Scope
	// ClientAddress is the unique id sent on the discovery stream and its
	// health checks. Default: hostname-pid-random.
	ClientAddress string
	// TLS, when set, is used for gRPC and for https/wss. Nil: plaintext
	// (unless a Servers entry says https:// or wss://). TLSFiles builds one
	// from a CA bundle and, for nodes requiring mutual TLS, a client key
	// pair.
	TLS *tls.Config

	// Grace is how long cached policies are served while disconnected
	// before everything is blocked. Default 5m.
	Grace time.Duration
	// HealthInterval is how often the connection is checked: a HealthCheck
	// RPC (gRPC), a WebSocket ping frame (ws). Default 30s; it must stay
	// below the server's discovery.max_client_inactive (2m by default).
	HealthInterval time.Duration
	// ShadowReportInterval is how often the counts of shadow policies
	// (evaluated, never enforced; see Stats.Shadow) are sent to the node,
	// as deltas since the last report, when there are any. Default 10s,
	// at least 1s. A node takes one report per 5 s from a sidecar: over
	// gRPC a refused report is kept and sent again; over the feed, which
	// has no answer, reports go at most every 6s whatever the setting.
	ShadowReportInterval time.Duration
	// BackoffMin and BackoffMax bound the jittered exponential backoff
	// between connection attempts. Defaults 100ms and 10s.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// CELCostLimit is the CEL cost budget of one ValidatingPolicy
	// expression's evaluation; past it the expression fails and Evaluate
	// denies, so a policy cannot stall a sidecar. 0: DefaultCELCostLimit.
	CELCostLimit uint64
	// CELEnvOptions are appended to the shared CEL environment (package
	// api/celenv) the client compiles ValidatingPolicies in: for a sidecar
	// that restricts its environment, e.g. a smaller expression size limit
	// (cel.ParserExpressionSizeLimit). A policy the server accepted that
	// does not compile in the restricted environment rejects its set (a
	// NACK over gRPC), and the previous set stays in force.
	CELEnvOptions []cel.EnvOption
	// MaxMessageBytes bounds one received snapshot (gRPC) or message (ws).
	// Default 64 MiB.
	MaxMessageBytes int
	// GRPCConn, when set, is the connection a TransportGRPC client opens
	// its discovery stream and health checks on, instead of dialing a
	// Servers entry itself: an agent that serves many identities (one
	// Client each) can multiplex their streams on one connection per node,
	// as grpc-go multiplexes streams. The caller owns the connection and
	// closes it after Run has returned; its target and credentials are its
	// own, so TLS must be nil. Failover is then the connection's (give it
	// a resolver with several nodes) and a stream that ends is reopened on
	// it. Servers may be empty (the connection's target names the node in
	// Stats and logs) or hold that one name. The connections the SDK dials
	// itself have fixed 1 MiB flow-control windows (grpc.WithStaticStreamWindowSize
	// and WithStaticConnWindowSize), which spare a PING exchange per
	// response; give such a connection the same.
	GRPCConn *grpc.ClientConn
	// UnknownIdentityGrace is how long a refusal at connect because the
	// server knows no employee of the token (gRPC Unauthenticated with the
	// ErrorInfo reason UNKNOWN_EMPLOYEE, WebSocket 401 with that reason) is
	// retried, with the usual backoff and failover, before it counts as
	// revoked: the employee may not have been created yet, or not reached
	// the node. It runs in real time from the first such refusal since the
	// last sync. Every other refusal (an inactive employee, another org, a
	// bad token, a server that gives no reason) revokes at once, and so does
	// a revocation on an open connection. Default 30s.
	UnknownIdentityGrace time.Duration
	// RetryUnauthorized treats an authentication refusal when connecting
	// (gRPC PermissionDenied/Unauthenticated, WebSocket 401/403) as an
	// ordinary connection failure: back off and retry, instead of revoking.
	// A revoke message and close code 4403 revoke regardless.
	RetryUnauthorized bool

	// Apply, when set, is called with every complete set before it is put in
	// force, from the goroutine running Run. Returning an error rejects the
	// set: the previous one stays in force and, over gRPC, the response is
	// NACKed with the error and the last good version. The slice and its
	// policies must not be modified.
	Apply func([]Policy) error
	// OnStateChange is called for every state transition, in order, from the
	// goroutine running Run, with no SDK lock held.
	OnStateChange func(from, to State)
	// OnUpdate is called after each change of the set in force (a full set,
	// or a WebSocket upsert/delete), from the goroutine running Run. It is
	// not called for a gRPC "unchanged" answer or a set identical to the one
	// held.
	OnUpdate func(Update)
	// DecisionLog, when set, records Evaluate's decisions: every denial and
	// a share of allows, masked, in a bounded buffer that Run ships to the
	// connected node (TakeDecisions, DecisionLogStats). Nil: off. See
	// docs/sidecars.md.
	DecisionLog *DecisionLog
	// Clock drives the grace timer and timestamps. Default: the real clock.
	// Backoff and health checks always use real time.
	Clock Clock
}

// Clock is the time source for the grace period, injectable for tests.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or, for a fake clock, from
	// the goroutine advancing it) once d has elapsed, unless stopped.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it
	// did.
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// withDefaults validates cfg and fills in its defaults.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	if cfg.Transport == "" {
		cfg.Transport = TransportGRPC
	}
	if cfg.Transport != TransportGRPC && cfg.Transport != TransportWS {
		errs = append(errs, fmt.Errorf("transport %q: want %q or %q", cfg.Transport, TransportGRPC, TransportWS))
	}
	if cfg.GRPCConn != nil {
		switch {
		case cfg.Transport != TransportGRPC:
			errs = append(errs, fmt.Errorf("grpc conn: set for transport %q", cfg.Transport))
		case cfg.TLS != nil:
			errs = append(errs, errors.New("grpc conn: TLS must be nil; the connection's own credentials are used"))
		case len(cfg.Servers) > 1:
			errs = append(errs, fmt.Errorf("grpc conn: servers must name the connection's one node, got %d entries", len(cfg.Servers)))
		case len(cfg.Servers) == 0:
			cfg.Servers = []string{cfg.GRPCConn.Target()}
		}
	}
	if len(cfg.Servers) == 0 {
		errs = append(errs, errors.New("servers: at least one node address is required"))
	}
	cfg.Servers = append([]string(nil), cfg.Servers...)
	for i, s := range cfg.Servers {
		s = strings.TrimSpace(s)
		cfg.Servers[i] = s
		if s == "" {
			errs = append(errs, fmt.Errorf("servers[%d]: empty address", i))
			continue
		}
		if cfg.Transport == TransportWS {
			if _, err := feedURL(s, cfg.TLS != nil); err != nil {
				errs = append(errs, fmt.Errorf("servers[%d]: %w", i, err))
			}
		}
	}
	if cfg.Transport == TransportWS && cfg.Token == "" && cfg.TokenSource == nil && cfg.Employee == "" {
		errs = append(errs, errors.New("transport ws needs a token (Token, TokenSource) or, with the server in auth.mode none, an Employee"))
	}
	if cfg.Transport == TransportGRPC && (cfg.Scope.Team != "" || cfg.Scope.Employee != "") && cfg.Scope.Org == "" {
		errs = append(errs, errors.New("scope: a team or employee scope needs an org"))
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"grace", &cfg.Grace, DefaultGrace},
		{"unknown identity grace", &cfg.UnknownIdentityGrace, DefaultUnknownIdentityGrace},
		{"health interval", &cfg.HealthInterval, DefaultHealthInterval},
		{"shadow report interval", &cfg.ShadowReportInterval, DefaultShadowReportInterval},
		{"backoff min", &cfg.BackoffMin, DefaultBackoffMin},
		{"backoff max", &cfg.BackoffMax, DefaultBackoffMax},
	} {
		if *d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: %v is negative", d.name, *d.v))
		}
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if cfg.ShadowReportInterval < MinShadowReportInterval {
		errs = append(errs, fmt.Errorf("shadow report interval: %v is below %v", cfg.ShadowReportInterval, MinShadowReportInterval))
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		errs = append(errs, fmt.Errorf("backoff max %v is below backoff min %v", cfg.BackoffMax, cfg.BackoffMin))
	}
	if cfg.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max message bytes: %d is negative", cfg.MaxMessageBytes))
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.CELCostLimit == 0 {
		cfg.CELCostLimit = DefaultCELCostLimit
	}
	if cfg.ClientAddress == "" {
		cfg.ClientAddress = defaultClientAddress()
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, fmt.Errorf("client config: %w", err)
	}
	return cfg, nil
}

func defaultClientAddress() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "sidecar"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// feedURL turns a Servers entry into the feed's WebSocket URL (without
// query).
func feedURL(server string, useTLS bool) (*url.URL, error) {
	raw := server
	if !strings.Contains(raw, "://") {
		scheme := "ws"
		if useTLS {
			scheme = "wss"
		}
		raw = scheme + "://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", server, err)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return nil, fmt.Errorf("%q: scheme %q, want ws, wss, http or https", server, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q: no host", server)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = feedv1.Path
	}
	u.RawQuery = ""
	u.Fragment = ""
	return u, nil
}
