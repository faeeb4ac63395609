package discovery

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/auth"
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
	case errors.Is(err, auth.ErrNoCredentials), errors.Is(err, auth.ErrBadCredentials),
		errors.Is(err, auth.ErrUnknownEmployee):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, auth.ErrInactiveEmployee), errors.Is(err, auth.ErrForbidden):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, errInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
}
