package discovery

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/server/shadow"
)

// ReportShadow takes a sidecar's shadow-policy counts (docs/rollouts.md)
// into the node's aggregate. The sidecar must hold a stream on this node
// under client_address, as the same employee: its scope and the set it is
// served decide which counts are taken. ResourceExhausted: too soon after
// the previous report (the SDK sends it again with the next);
// InvalidArgument: too many entries or absurd counts;
// FailedPrecondition: no such stream here.
func (s *Service) ReportShadow(ctx context.Context, req *discoveryv1.ShadowReport) (*discoveryv1.ShadowReportResponse, error) {
	if s.deps.Shadow == nil {
		return nil, status.Error(codes.Unimplemented, "shadow reports are not taken by this node")
	}
	addr := req.GetClientAddress()
	st, err := s.reporter(ctx, addr)
	if err != nil {
		return nil, err
	}
	id := st.currentScope()
	set := s.setFor(st, id)
	counts := make([]shadow.Count, 0, min(len(req.GetCounts()), shadow.MaxEntries+1))
	for i, c := range req.GetCounts() {
		if i > shadow.MaxEntries {
			break // refused as too many: no need to copy them all
		}
		counts = append(counts, shadow.Count{Policy: c.GetPolicy(), WouldBlock: c.GetWouldBlock(), WouldAllow: c.GetWouldAllow(), Evaluated: c.GetEvaluated()})
	}
	err = s.deps.Shadow.Report(shadow.Report{
		Member:   "grpc:" + addr,
		Identity: id,
		Counts:   counts,
		Served: func(name string) bool {
			rp, ok := set.Lookup(name)
			return ok && rp.Policy.Shadow()
		},
		Exists: func(name string) bool {
			_, ok := s.deps.Policies.Get(name)
			return ok
		},
	})
	switch {
	case errors.Is(err, shadow.ErrRateLimited):
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, shadow.ErrInvalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &discoveryv1.ShadowReportResponse{}, nil
}

// reporter authenticates a report's caller and finds the stream client
// addr holds on this node as that employee: a report is taken only from a
// sidecar this node serves (FailedPrecondition otherwise).
func (s *Service) reporter(ctx context.Context, addr string) (*stream, error) {
	who, err := s.authenticate(ctx)
	if err != nil {
		return nil, statusOf(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for cand := range s.byAddr[addr] {
		if cand.employee == who.employee {
			return cand, nil
		}
	}
	return nil, status.Errorf(codes.FailedPrecondition, "no discovery stream of client %.128q on this node", addr)
}
