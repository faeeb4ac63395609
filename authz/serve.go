package authz

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/policyd/policyd/client"
)

// MaxStreamsPerConn bounds the concurrent gRPC checks on one connection;
// with the caller's bound on connections it bounds the goroutines checks
// can hold. Envoy opens one connection per worker thread.
const MaxStreamsPerConn = 256

// drainTimeout bounds the graceful stop of both listeners.
const drainTimeout = 5 * time.Second

// StateChanged follows the SDK's state into the gRPC health service (fit
// for client.Config.OnStateChange): SERVING only in state ready, like
// /readyz.
func (s *Server) StateChanged(_, to client.State) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if to == client.StateReady {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range []string{"", authv3.Authorization_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(svc, st)
	}
}

// Serve answers ext_authz on grpcLn and the HTTP API on httpLn (either may
// be nil) until ctx ends, then stops both gracefully. The listeners carry
// any TLS and connection limit the caller wants.
func (s *Server) Serve(ctx context.Context, grpcLn, httpLn net.Listener, g prometheus.Gatherer) error {
	errc := make(chan error, 2)
	n := 0
	var gs *grpc.Server
	if grpcLn != nil {
		gs = grpc.NewServer(
			// Room for the largest request the limits accept, so that one
			// over them reaches Check and gets its deny; anything larger
			// is refused by gRPC, which Envoy also turns into a deny.
			grpc.MaxRecvMsgSize(s.cfg.MaxHeaderBytes+s.cfg.MaxBodyBytes+64<<10),
			grpc.MaxConcurrentStreams(MaxStreamsPerConn),
		)
		authv3.RegisterAuthorizationServer(gs, s)
		healthpb.RegisterHealthServer(gs, s.health)
		n++
		go func() { errc <- serveErr("ext_authz gRPC", gs.Serve(grpcLn)) }()
	}
	var hs *http.Server
	if httpLn != nil {
		hs = &http.Server{
			Handler:           s.Handler(g),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		}
		n++
		go func() { errc <- serveErr("decision HTTP", hs.Serve(httpLn)) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		n--
	}
	drain, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if hs != nil {
		_ = hs.Shutdown(drain) // past the deadline, Close below ends what is left
		_ = hs.Close()
	}
	if gs != nil {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-drain.Done():
			gs.Stop()
		}
	}
	for ; n > 0; n-- {
		if e := <-errc; err == nil {
			err = e
		}
	}
	return err
}

func serveErr(what string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("serve %s: %w", what, err)
}
