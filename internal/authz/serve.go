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

// Listeners are what Serve answers on; a nil one is not served. They carry
// any TLS and connection limit the caller wants.
type Listeners struct {
	// GRPC serves ext_authz and gRPC health.
	GRPC net.Listener
	// HTTP serves /v1/check, /healthz, /readyz and /metrics.
	HTTP net.Listener
	// Probe serves /healthz and /readyz only.
	Probe net.Listener
}

// Serve answers on ls until ctx ends, then stops every listener
// gracefully.
func (s *Server) Serve(ctx context.Context, ls Listeners, g prometheus.Gatherer) error {
	grpcLn := ls.GRPC
	errc := make(chan error, 3)
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
	var https []*http.Server
	for _, l := range []struct {
		what string
		ln   net.Listener
		h    http.Handler
	}{{"decision HTTP", ls.HTTP, s.Handler(g)}, {"probe HTTP", ls.Probe, s.ProbeHandler()}} {
		if l.ln == nil {
			continue
		}
		hs := &http.Server{
			Handler:           l.h,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		}
		https = append(https, hs)
		n++
		go func() { errc <- serveErr(l.what, hs.Serve(l.ln)) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		n--
	}
	drain, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	for _, hs := range https {
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
