package server

import (
	"context"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
)

// The gRPC health service (grpc.health.v1) reports per service:
//
//   - the discovery service (policyd.discovery.v1's PolicyDiscoveryService)
//     is SERVING only while the node is ready, by the rule of /readyz
//     (Ready); gRPC readiness probes and load balancers name it;
//   - the overall service "" is SERVING while the process serves, like
//     /livez: kubelet's gRPC probes ask for "" unless told otherwise, and a
//     liveness probe must not restart a node that is only catching up.
//
// Both go NOT_SERVING when the node shuts down.
var discoveryService = discoveryv1.PolicyDiscoveryService_ServiceDesc.ServiceName

// healthInterval is how often the discovery service's status follows
// readiness; each check costs at most one read index (raftnode's cache and
// coalescing are shared with /readyz).
const healthInterval = 500 * time.Millisecond

// staleError is Ready's answer while the node is stale.
type staleError struct{}

func (*staleError) Error() string     { return errStale }
func (*staleError) Unavailable() bool { return true }

// healthLoop keeps the discovery service's health status in step with
// readiness until the node stops.
func (n *Node) healthLoop() {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	for {
		n.updateHealth()
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) updateHealth() {
	ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
	defer cancel()
	st := healthpb.HealthCheckResponse_SERVING
	if err := n.Ready(ctx); err != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	if n.ctx.Err() != nil {
		return // Close has shut the health server down; leave it so
	}
	n.health.SetServingStatus(discoveryService, st)
}
