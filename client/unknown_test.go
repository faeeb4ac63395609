package client

import (
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
)

// refusingServer is a fake node of one transport that refuses the first n
// connections (all with n 0) as the server refuses an employee: unknown
// (with the reason) or inactive (without).
type refusingServer struct {
	cfg func() Config
	// accept completes the sync of the connection accepted after the
	// refusals.
	accept   func(t *testing.T)
	attempts func() int
}

var refusingServers = []struct {
	name string
	new  func(t *testing.T, n int, unknown bool) refusingServer
}{
	{TransportGRPC, func(t *testing.T, n int, unknown bool) refusingServer {
		f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "x"))
		f.refuse, f.refuseN = codes.PermissionDenied, n
		if unknown {
			f.refuse, f.refuseReason = codes.Unauthenticated, discoveryv1.ReasonUnknownEmployee
		}
		node := serveDiscovery(t, f, "")
		return refusingServer{
			cfg:      func() Config { return Config{Servers: []string{node.addr}} },
			accept:   func(*testing.T) {},
			attempts: func() int { opened, _ := f.counts(); return opened },
		}
	}},
	{TransportWS, func(t *testing.T, n int, unknown bool) refusingServer {
		ff := newFeed(t)
		ff.reject, ff.rejectN = http.StatusForbidden, n
		if unknown {
			ff.reject, ff.rejectReason = http.StatusUnauthorized, feedv1.ReasonUnknownEmployee
		}
		return refusingServer{
			cfg: func() Config { return Config{Servers: []string{ff.addr()}, Transport: TransportWS, Employee: "alice"} },
			accept: func(t *testing.T) {
				ff.next(t).send(t, map[string]any{"type": "init", "version": 1, "digest": "d1", "policies": []any{}})
			},
			attempts: func() int { return len(ff.reqs()) },
		}
	}},
}

// TestUnknownIdentityIsRetried: a connection refused because the server
// knows no such employee is retried with backoff, and the client becomes
// ready once the employee exists (a provisioning script that starts the
// proxy right after creating its identity).
func TestUnknownIdentityIsRetried(t *testing.T) {
	for _, tr := range refusingServers {
		t.Run(tr.name, func(t *testing.T) {
			srv := tr.new(t, 3, true)
			cfg := srv.cfg()
			cfg.UnknownIdentityGrace = time.Minute
			c := runClient(t, cfg)
			srv.accept(t)
			c.waitState(t, StateReady)
			if got, want := srv.attempts(), 4; got != want {
				t.Fatalf("%d connection attempts, want 3 refused and 1 accepted", got)
			}
		})
	}
}

// TestUnknownIdentityRevokedAfterGrace: an employee that never comes into
// existence is retried for UnknownIdentityGrace, then revoked; an inactive
// one is revoked at its first refusal, whatever the grace.
func TestUnknownIdentityRevokedAfterGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	for _, tr := range refusingServers {
		t.Run(tr.name+"/unknown", func(t *testing.T) {
			srv := tr.new(t, 0, true)
			cfg := srv.cfg()
			cfg.UnknownIdentityGrace = grace
			start := time.Now()
			c := runClient(t, cfg)
			mustRevoked(t, c.wait(t), "unknown employee")
			took := time.Since(start)
			if took < grace || took > grace+5*time.Second {
				t.Errorf("revoked after %v, want after the grace of %v and soon after", took, grace)
			}
			if got := srv.attempts(); got < 2 {
				t.Errorf("%d connection attempts within the grace, want retries", got)
			}
			if c.State() != StateRevoked || !c.ShouldBlockAll() {
				t.Errorf("state %s, block all %v", c.State(), c.ShouldBlockAll())
			}
		})
		t.Run(tr.name+"/inactive", func(t *testing.T) {
			srv := tr.new(t, 0, false)
			cfg := srv.cfg()
			cfg.UnknownIdentityGrace = time.Hour
			c := runClient(t, cfg)
			mustRevoked(t, c.wait(t), "alice is")
			if got := srv.attempts(); got != 1 {
				t.Errorf("%d connection attempts, want 1: an inactive employee revokes at once", got)
			}
		})
	}
}
