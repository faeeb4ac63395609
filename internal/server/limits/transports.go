package limits

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/internal/server/apierror"
)

// HTTP gates next (the WebSocket feed's handshake): the slot is held for the
// whole handler, which covers token verification, the employee look-up, the
// upgrade and the first messages (init); the connection then runs on its own
// and the handler returns. A refused request gets 503 with Retry-After.
func (g *Gate) HTTP(transport string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, err := g.Enter(r.Context(), transport)
		if err != nil {
			if errors.Is(err, ErrBusy) {
				apierror.Write(w, http.StatusServiceUnavailable, apierror.CodeUnavailable,
					"node busy setting up connections ("+err.Error()+"); retry, or use another node")
			}
			// Otherwise the client went away while waiting.
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// StreamInterceptor gates the streams of the given methods (full method
// names): the slot is taken before the handler runs and given back when the
// handler first reads from the client (its set-up — authentication and the
// read-index wait — is done by then) or returns. Holding it until the first
// request arrives instead would let a client that never sends one pin a
// slot. A refused stream ends with Unavailable.
func (g *Gate) StreamInterceptor(transport string, methods ...string) grpc.StreamServerInterceptor {
	gated := map[string]bool{}
	for _, m := range methods {
		gated[m] = true
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !gated[info.FullMethod] {
			return handler(srv, ss)
		}
		release, err := g.Enter(ss.Context(), transport)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return status.FromContextError(err).Err()
			}
			return status.Errorf(codes.Unavailable, "node busy setting up streams (%v); retry, or use another node", err)
		}
		defer release()
		return handler(srv, &gatedStream{ServerStream: ss, release: release})
	}
}

// gatedStream gives the set-up slot back on the first RecvMsg (release
// is idempotent).
type gatedStream struct {
	grpc.ServerStream
	release func()
}

func (s *gatedStream) RecvMsg(m any) error {
	s.release()
	return s.ServerStream.RecvMsg(m)
}
