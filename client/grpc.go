package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
)

// maxHealthTimeout bounds one health check (or WebSocket ping).
const maxHealthTimeout = 10 * time.Second

// healthFailuresToReconnect is how many health checks in a row must fail with
// Unavailable or DeadlineExceeded before the stream is given up.
const healthFailuresToReconnect = 2

// errStreamEnded is reported when a server ends the stream without a status.
var errStreamEnded = errors.New("stream closed by the server")

// grpcTransport speaks the discovery protocol.
type grpcTransport struct {
	c *Client
	// held is the last response's policies, decoded, which the next
	// response reuses where its bytes are the same (see decodeResponse).
	// It outlives a session: a full snapshot after a reconnect, to this
	// node or another, is then mostly reused.
	held []rawPolicy
}

func (g *grpcTransport) session(ctx context.Context, server string) (synced bool, err error) {
	c := g.c
	conn, err := g.conn(server)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
		if conn != c.cfg.GRPCConn {
			_ = conn.Close()
		}
	}()
	token, err := c.token(ctx)
	if err != nil {
		return false, err
	}
	if token != "" {
		sctx = metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer "+token)
	}
	api := discoveryv1.NewPolicyDiscoveryServiceClient(conn)
	stream, err := api.StreamPolicies(sctx, grpc.MaxCallRecvMsgSize(c.cfg.MaxMessageBytes), grpc.ForceCodecV2(newRawCodec()))
	if err != nil {
		return false, classifyGRPC(sctx, err)
	}
	scope := &discoveryv1.Scope{Org: c.cfg.Scope.Org, Team: c.cfg.Scope.Team, Employee: c.cfg.Scope.Employee}
	_, version, _, _ := c.snapshot()
	// The server keeps the first request's capabilities for the stream;
	// one that predates them skips the unknown field.
	first := &discoveryv1.PolicyDiscoveryRequest{ClientAddress: c.cfg.ClientAddress, VersionInfo: version, Scope: scope,
		Capabilities: c.capabilities()}
	if err := stream.Send(first); err != nil {
		return false, classifyGRPC(sctx, sendErr(stream, err))
	}
	c.count(func(s *Stats) { s.Connects++; s.Server = server })
	c.logger.Info("discovery stream open", "server", server, "version", version)

	wg.Add(1)
	go func() {
		defer wg.Done()
		g.healthLoop(sctx, api, cancel)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.shadowLoop(sctx, c.cfg.ShadowReportInterval, func(ctx context.Context, deltas []ShadowCount) error {
			counts := make([]*discoveryv1.ShadowCount, len(deltas))
			for i, d := range deltas {
				counts[i] = &discoveryv1.ShadowCount{Policy: d.Policy, WouldBlock: d.WouldBlock, WouldAllow: d.WouldAllow, Evaluated: d.Evaluated}
			}
			_, err := api.ReportShadow(ctx, &discoveryv1.ShadowReport{ClientAddress: c.cfg.ClientAddress, Counts: counts})
			return err
		})
	}()
	if c.dlog != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.shipLoop(sctx, nil, func(ctx context.Context, records [][]byte, drops decisionsv1.Drops) (shipResult, error) {
				return reportDecisions(ctx, api, c.cfg.ClientAddress, records, drops)
			})
		}()
	}

	var raw rawResponse
	for {
		if err := stream.RecvMsg(&raw); err != nil {
			return synced, classifyGRPC(sctx, err)
		}
		resp, err := g.decode(raw)
		if err != nil {
			// What grpc-go reports for a message its codec cannot decode.
			return synced, status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
		}
		req := g.answer(resp, server)
		req.ClientAddress, req.ResponseNonce, req.Scope = c.cfg.ClientAddress, resp.nonce, scope
		if err := stream.Send(req); err != nil {
			return synced, classifyGRPC(sctx, sendErr(stream, err))
		}
		if _, _, _, has := c.snapshot(); has && !synced {
			synced = true
			c.synced()
		}
	}
}

// reportDecisions sends one batch on the stream's connection and maps the
// node's refusals to what the shipper does with them.
func reportDecisions(ctx context.Context, api discoveryv1.PolicyDiscoveryServiceClient, address string, records [][]byte, drops decisionsv1.Drops) (shipResult, error) {
	resp, err := api.ReportDecisions(ctx, &discoveryv1.DecisionBatch{
		ClientAddress: address,
		Records:       records,
		Dropped: &discoveryv1.DecisionDrops{SampledOut: drops.SampledOut, BufferFull: drops.BufferFull,
			RateLimited: drops.RateLimited, MaskFailed: drops.MaskFailed},
	})
	switch status.Code(err) {
	case codes.OK:
		return shipResult{accepted: uint64(resp.GetAccepted()), refused: uint64(resp.GetRefused())}, nil
	case codes.Unimplemented:
		return shipResult{}, fmt.Errorf("%w: %w", errShipUnsupported, err)
	case codes.InvalidArgument:
		return shipResult{}, fmt.Errorf("%w: %w", errShipInvalid, err)
	}
	return shipResult{}, err
}

// conn returns the connection to server: Config.GRPCConn when set (the
// caller's, never closed here), else a new one the session closes.
func (g *grpcTransport) conn(server string) (*grpc.ClientConn, error) {
	c := g.c
	if c.cfg.GRPCConn != nil {
		return c.cfg.GRPCConn, nil
	}
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS.Clone())
	}
	// Fixed flow-control windows: grpc-go's dynamic ones answer every
	// response received with a bandwidth-probing PING, a write on each side
	// per change for a sidecar that holds one small stream. A stream's
	// window takes a set of a few hundred policies in one go.
	conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(creds),
		grpc.WithStaticStreamWindowSize(grpcWindow), grpc.WithStaticConnWindowSize(grpcWindow))
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", server, err)
	}
	return conn, nil
}

// grpcWindow is the SDK's HTTP/2 stream and connection window.
const grpcWindow = 1 << 20

// decode decodes a response received, reusing the policies held from the
// previous one, and holds its policies for the next (an "unchanged" answer
// carries none and leaves them).
func (g *grpcTransport) decode(raw rawResponse) (*response, error) {
	resp, err := decodeResponse(raw, g.held)
	if err != nil {
		return nil, err
	}
	if !resp.unchanged {
		g.held = resp.policies
	}
	return resp, nil
}

// answer applies a response and returns its ACK or NACK (without the
// fields every request carries).
func (g *grpcTransport) answer(resp *response, server string) *discoveryv1.PolicyDiscoveryRequest {
	c := g.c
	_, held, _, has := c.snapshot()
	nack := func(err error) *discoveryv1.PolicyDiscoveryRequest {
		return &discoveryv1.PolicyDiscoveryRequest{VersionInfo: held, ErrorDetail: &discoveryv1.ErrorDetail{Message: err.Error()}}
	}
	if resp.unchanged {
		c.count(func(s *Stats) { s.Unchanged++ })
		if !has || resp.version != held {
			c.count(func(s *Stats) { s.Rejected++ })
			return nack(fmt.Errorf("unchanged answer for version %q, but this client holds %q", resp.version, held))
		}
		return &discoveryv1.PolicyDiscoveryRequest{VersionInfo: held}
	}
	c.count(func(s *Stats) { s.FullSyncs++ })
	if has && resp.version == held {
		return &discoveryv1.PolicyDiscoveryRequest{VersionInfo: held} // same content, nothing to do
	}
	set := make([]Policy, 0, len(resp.policies))
	for _, p := range resp.policies {
		set = append(set, p.p)
	}
	if err := c.install(sortByName(set), resp.version, 0, true, server); err != nil {
		return nack(err)
	}
	return &discoveryv1.PolicyDiscoveryRequest{VersionInfo: resp.version}
}

// healthLoop refreshes the stream's last-active time on its node, and ends
// the session (cancel) when the node stops answering.
func (g *grpcTransport) healthLoop(ctx context.Context, api discoveryv1.PolicyDiscoveryServiceClient, cancel context.CancelCauseFunc) {
	c := g.c
	t := time.NewTicker(c.cfg.HealthInterval)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hctx, hcancel := context.WithTimeout(ctx, min(c.cfg.HealthInterval, maxHealthTimeout))
		_, err := api.HealthCheck(hctx, &discoveryv1.HealthCheckRequest{ClientAddress: c.cfg.ClientAddress})
		hcancel()
		if err == nil {
			failures = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		c.logger.Warn("health check failed", "err", err)
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded:
			failures++
		default:
			failures = 0
		}
		if failures >= healthFailuresToReconnect {
			cancel(fmt.Errorf("%d health checks in a row failed: %w", failures, err))
			return
		}
	}
}

// sendErr turns the io.EOF of a Send on an ended stream into the stream's
// status.
func sendErr(stream grpc.BidiStreamingClient[discoveryv1.PolicyDiscoveryRequest, discoveryv1.PolicyDiscoveryResponse], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// classifyGRPC maps the end of a stream to what Run does next.
func classifyGRPC(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if errors.Is(err, io.EOF) {
		return errStreamEnded
	}
	switch st := status.Convert(err); st.Code() {
	case codes.PermissionDenied, codes.Unauthenticated:
		return &authError{msg: st.Message(), err: err,
			unknown: st.Code() == codes.Unauthenticated && hasReason(st, discoveryv1.ReasonUnknownEmployee)}
	}
	return err
}

// hasReason reports whether st carries an ErrorInfo of policyd's domain
// with reason.
func hasReason(st *status.Status, reason string) bool {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == discoveryv1.ErrorDomain && ei.GetReason() == reason {
			return true
		}
	}
	return false
}
