package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"golang.org/x/net/netutil"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/authz"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/tlsfiles"
)

// authzCommand is `policyd authz`: the SDK as a local decision point for a
// proxy, over Envoy's ext_authz gRPC API and a small HTTP API.
func authzCommand() *cobra.Command {
	var (
		sf                         = sidecarFlags{env: "POLICYD_AUTHZ", cmd: "authz"}
		grpcAddr, httpAddr, probe  string
		serveCert, serveKey, trust string
		cfg                        authz.Config
		maxConns                   int
		costLimit                  uint64
		dlf                        decisionLogFlags
	)
	cmd := &cobra.Command{
		Use:   "authz",
		Short: "Serve decisions to a proxy: Envoy ext_authz gRPC and POST /v1/check",
		Long: `authz follows the policies of one identity from the cluster, as watch does, and
decides requests locally:
  - Envoy's ext_authz gRPC API (envoy.service.auth.v3.Authorization/Check) on
    --grpc-addr: ValidatingPolicies over the request's attributes;
  - POST /v1/check on --http-addr: {"tool","input"} for ToolPolicies,
    {"request"} for ValidatingPolicies; with /healthz, /readyz (200 only when
    synced) and /metrics.
It fails closed: before the first sync, after revocation, and once the grace
period has passed without a node, every request is denied. It keeps serving
those denials until SIGINT/SIGTERM. A non-loopback listen address needs
--serve-cert-file, --serve-key-file and --serve-client-ca-file (mutual TLS).
--probe-addr serves /healthz and /readyz alone, without TLS, on any address:
they tell only whether the process runs and whether it is synced.
--decision-log records decisions and ships them to the node; with
--decision-log-dir they go through a disk ring fsynced every second.
See docs/authz.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ccfg, err := sf.config(cmd)
			if err != nil {
				return err
			}
			ccfg.CELCostLimit = costLimit
			serveTLS, err := authzServeTLS(grpcAddr, httpAddr, serveCert, serveKey, trust)
			if err != nil {
				return err
			}
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo}))
			var spool *decisionSpool
			if ccfg.DecisionLog, spool, err = dlf.config(cmd.Flags(), logger); err != nil {
				return err
			}
			if spool != nil {
				defer func() {
					if err := spool.close(); err != nil {
						logger.Warn("decision log: closing the disk ring", "err", err)
					}
				}()
			}
			var srv *authz.Server
			ccfg.OnStateChange = func(from, to client.State) {
				logger.Info("state", "from", from, "to", to)
				if srv != nil {
					srv.StateChanged(from, to)
				}
			}
			c, err := client.New(ccfg, logger)
			if err != nil {
				return &usageError{err}
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
			if srv, err = authz.New(cfg, logger, c, reg); err != nil {
				return err
			}
			gln, err := authzListen(grpcAddr, maxConns, serveTLS, "h2")
			if err != nil {
				return err
			}
			hln, err := authzListen(httpAddr, maxConns, serveTLS, "http/1.1")
			if err != nil {
				_ = gln.Close()
				return err
			}
			ls := authz.Listeners{GRPC: gln, HTTP: hln}
			if probe != "" {
				if ls.Probe, err = authzListen(probe, maxConns, nil, ""); err != nil {
					_, _ = gln.Close(), hln.Close()
					return err
				}
			}
			logger.Info("authz listening", "grpc", gln.Addr().String(), "http", hln.Addr().String(), "probe", probe, "servers", ccfg.Servers)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- c.Run(ctx) }()
			spilled := make(chan struct{})
			if spool != nil {
				go func() {
					defer close(spilled)
					spool.spillLoop(ctx, c)
				}()
			} else {
				close(spilled)
			}
			serveErr := srv.Serve(ctx, ls, reg)
			cancel()
			err = <-runErr
			<-spilled
			if errors.Is(err, client.ErrRevoked) || errors.Is(err, context.Canceled) {
				err = nil // revocation was served as denials until the signal
			}
			return errors.Join(serveErr, err)
		},
	}
	f := cmd.Flags()
	sf.register(f)
	f.StringVar(&grpcAddr, "grpc-addr", "127.0.0.1:9191", "address of the Envoy ext_authz gRPC listener")
	f.StringVar(&httpAddr, "http-addr", "127.0.0.1:9192", "address of the HTTP listener: /v1/check, /healthz, /readyz, /metrics")
	f.StringVar(&probe, "probe-addr", "", "address of a plain-HTTP listener with /healthz and /readyz only, for the kubelet; any address (off by default)")
	f.StringVar(&serveCert, "serve-cert-file", "", "certificate of the listeners (TLS)")
	f.StringVar(&serveKey, "serve-key-file", "", "private key of the listeners")
	f.StringVar(&trust, "serve-client-ca-file", "", "CA bundle the listeners verify callers' certificates with (mutual TLS)")
	f.IntVar(&cfg.MaxHeaderBytes, "max-header-bytes", authz.DefaultMaxHeaderBytes, "largest request headers (names, values and path) decided; more is a 431 deny")
	f.IntVar(&cfg.MaxBodyBytes, "max-body-bytes", authz.DefaultMaxBodyBytes, "largest request body decided; more is a 413 deny")
	f.IntVar(&cfg.MaxInFlight, "max-in-flight", authz.DefaultMaxInFlight, "evaluations run at once; the rest wait until their deadline (then a 503 deny)")
	f.IntVar(&maxConns, "max-conns", 256, "connections each listener accepts at once")
	f.Uint64Var(&costLimit, "cel-cost-limit", client.DefaultCELCostLimit, "CEL cost budget of one expression; over it is a deny")
	dlf.register(f)
	return cmd
}

// authzServeTLS is the listeners' TLS: none on loopback without the files,
// mutual TLS with all three, and a refusal to start for a non-loopback
// address without them, so that no stranger can probe the decisions.
func authzServeTLS(grpcAddr, httpAddr, cert, key, ca string) (*tlsfiles.Reloader, error) {
	if cert == "" && key == "" && ca == "" {
		for _, a := range []string{grpcAddr, httpAddr} {
			host, _, err := net.SplitHostPort(a)
			if err != nil {
				return nil, &usageError{fmt.Errorf("listen address %q: %w", a, err)}
			}
			if !config.IsLoopback(host) {
				return nil, &usageError{fmt.Errorf("listen address %q is not loopback: it needs --serve-cert-file, --serve-key-file and --serve-client-ca-file (mutual TLS)", a)}
			}
		}
		return nil, nil
	}
	if cert == "" || key == "" || ca == "" {
		return nil, &usageError{errors.New("--serve-cert-file, --serve-key-file and --serve-client-ca-file go together: the listeners serve mutual TLS")}
	}
	r, err := tlsfiles.New(config.TLS{CertFile: cert, KeyFile: key, ClientCAFile: ca}, nil)
	if err != nil {
		return nil, &usageError{fmt.Errorf("listener TLS: %w", err)}
	}
	return r, nil
}

// authzListen opens addr with at most maxConns connections at once, behind
// TLS when r is set.
func authzListen(addr string, maxConns int, r *tlsfiles.Reloader, proto string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	ln = netutil.LimitListener(ln, maxConns)
	if r != nil {
		ln = tls.NewListener(ln, r.ServerConfig(proto))
	}
	return ln, nil
}
