package discovery

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/server/decisionlog"
)

// ReportDecisions takes a batch of a sidecar's decision records into the
// node's decision log (docs/decisions.md). The sidecar must hold a stream
// on this node under client_address, as the same employee: the records
// are kept under the scope that stream is served. ResourceExhausted: over
// the sidecar's rate (the SDK keeps the batch and sends it again);
// InvalidArgument: over a batch's caps or absurd drop counts;
// FailedPrecondition: no such stream here. Records refused one by one
// (malformed, another identity's) are counted in the answer.
func (s *Service) ReportDecisions(ctx context.Context, req *discoveryv1.DecisionBatch) (*discoveryv1.DecisionBatchResponse, error) {
	if s.deps.Decisions == nil {
		return nil, status.Error(codes.Unimplemented, "decision logs are not taken by this node (decisions.enabled is false)")
	}
	addr := req.GetClientAddress()
	st, err := s.reporter(ctx, addr)
	if err != nil {
		return nil, err
	}
	d := req.GetDropped()
	res, err := s.deps.Decisions.Ingest(decisionlog.Batch{
		Identity: st.currentScope(), ClientAddress: addr, Transport: "grpc", Records: req.GetRecords(), Resent: true,
		Dropped: decisionsv1.Drops{SampledOut: d.GetSampledOut(), BufferFull: d.GetBufferFull(), RateLimited: d.GetRateLimited(), MaskFailed: d.GetMaskFailed()},
	})
	switch {
	case errors.Is(err, decisionlog.ErrRateLimited):
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, decisionlog.ErrTooLarge), errors.Is(err, decisionlog.ErrInvalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &discoveryv1.DecisionBatchResponse{Accepted: uint32(res.Accepted), Refused: uint32(res.Refused)}, nil //nolint:gosec // at most MaxBatchRecords
}
