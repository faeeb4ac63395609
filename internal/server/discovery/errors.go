package discovery

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/auth"
)

// errInvalid marks a malformed request (InvalidArgument).
var errInvalid = errors.New("invalid request")

// statusOf is the one place where errors become gRPC codes.
func statusOf(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, auth.ErrUnknownEmployee):
		// Unauthenticated, as before the reason existed, so that an older
		// SDK still stops; a newer one reads the reason and retries for a
		// while, since the employee may be created in a moment.
		return withReason(status.New(codes.Unauthenticated, err.Error()), discoveryv1.ReasonUnknownEmployee)
	case errors.Is(err, auth.ErrNoCredentials), errors.Is(err, auth.ErrBadCredentials):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, auth.ErrInactiveEmployee), errors.Is(err, auth.ErrForbidden):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, errInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
}

// withReason attaches an ErrorInfo of policyd's domain to st.
func withReason(st *status.Status, reason string) error {
	d, err := st.WithDetails(&errdetails.ErrorInfo{Domain: discoveryv1.ErrorDomain, Reason: reason})
	if err != nil {
		return st.Err() // only a detail that cannot be marshalled fails
	}
	return d.Err()
}
