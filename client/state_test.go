package client

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/internal/poll"
)

// TestStateMachineGraceAndRecovery walks the SDK's state machine against a
// real (in-process) discovery server, with the grace period driven by a fake
// clock: connecting blocks all; ready enforces; disconnected serves the
// cached policies until grace has elapsed, then blocks all; a reconnect
// brings it back to ready and lifts the block; stopping blocks all.
func TestStateMachineGraceAndRecovery(t *testing.T) {
	clock := newFakeClock()
	f := newFakeDiscovery("v1", tp("deny-rm", "Bash", "deny", "no rm", "rm -rf"))
	n := serveDiscovery(t, f, "")
	c, rec := newClient(t, Config{Servers: []string{n.addr}, Grace: 5 * time.Minute, Clock: clock})

	// connecting: everything is blocked.
	if reason, blocked := c.IsBlocked("Bash", map[string]any{"command": "ls"}); !blocked || reason != ReasonConnecting {
		t.Fatalf("connecting: IsBlocked = (%q, %v)", reason, blocked)
	}
	r := start(t, c, rec)
	if err := r.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}

	// ready: the policies are enforced.
	assertEnforcing := func(when string) {
		t.Helper()
		if r.ShouldBlockAll() {
			t.Fatalf("%s: blocks all", when)
		}
		if reason, blocked := r.IsBlocked("Bash", map[string]any{"command": "rm -rf /"}); !blocked || reason != "no rm" {
			t.Fatalf("%s: rm -rf: (%q, %v)", when, reason, blocked)
		}
		if _, blocked := r.IsBlocked("Bash", map[string]any{"command": "ls"}); blocked {
			t.Fatalf("%s: ls blocked", when)
		}
	}
	assertEnforcing("ready")

	// disconnected: the cached policies are served for the grace period.
	addr := n.addr
	n.stop()
	r.waitState(t, StateDisconnected)
	poll.Eventually(t, "the grace timer", func() error {
		if clock.armed() != 1 {
			return errors.New("not armed")
		}
		return nil
	})

	assertEnforcing("disconnected, within grace")
	clock.Advance(5*time.Minute - time.Second)
	assertEnforcing("disconnected, 1s before grace ends")
	clock.Advance(time.Second)
	if !r.ShouldBlockAll() || r.State() != StateDisconnected {
		t.Fatalf("after grace: block all %v, state %s", r.ShouldBlockAll(), r.State())
	}
	if reason, blocked := r.IsBlocked("Bash", map[string]any{"command": "ls"}); !blocked || reason != ReasonDisconnected {
		t.Fatalf("after grace: IsBlocked = (%q, %v)", reason, blocked)
	}
	if got := len(r.Policies()); got != 1 {
		t.Fatalf("%d policies cached after grace, want 1", got)
	}

	// reconnect: the node comes back on the same address; the client
	// answers unchanged and is ready again.
	serveDiscovery(t, f, addr)
	r.waitState(t, StateReady)
	assertEnforcing("ready again")
	if clock.armed() != 0 {
		t.Fatal("a grace timer is still armed while ready")
	}
	if st := r.Stats(); st.Unchanged != 1 || st.FullSyncs != 1 {
		t.Fatalf("stats %+v: want the reconnect answered unchanged", st)
	}

	// stop: a stopped client never fails open.
	r.cancel()
	if err := r.wait(t); err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
	if reason, blocked := r.IsBlocked("Bash", nil); !blocked || reason != ReasonStopped {
		t.Fatalf("stopped: IsBlocked = (%q, %v)", reason, blocked)
	}
	want := []string{"connecting->ready", "ready->disconnected", "disconnected->ready", "ready->disconnected"}
	if diff := cmp.Diff(want, rec.transitions()); diff != "" {
		t.Fatalf("transitions (-want +got):\n%s", diff)
	}
	if err := c.Run(t.Context()); !errors.Is(err, ErrAlreadyRun) {
		t.Fatalf("second Run = %v", err)
	}
}

// TestGraceTimerCancelledByReconnect: a grace timer that would fire after a
// reconnect has no effect.
func TestGraceTimerCancelledByReconnect(t *testing.T) {
	clock := newFakeClock()
	f := newFakeDiscovery("v1", tp("a", "Bash", "deny", "x"))
	n := serveDiscovery(t, f, "")
	r := runClient(t, Config{Servers: []string{n.addr}, Grace: time.Minute, Clock: clock})
	r.waitState(t, StateReady)
	addr := n.addr
	n.stop()
	r.waitState(t, StateDisconnected)
	clock.Advance(30 * time.Second)
	serveDiscovery(t, f, addr)
	r.waitState(t, StateReady)
	clock.Advance(time.Hour)
	if r.ShouldBlockAll() {
		t.Fatal("a grace timer from an earlier disconnection blocked a ready client")
	}
}

// TestRevokedWhileDisconnectedBlocksImmediately: revocation blocks all even
// within grace, and is terminal.
func TestRevokedBlocksImmediately(t *testing.T) {
	clock := newFakeClock()
	ff := newFeed(t)
	r := runClient(t, Config{Servers: []string{ff.addr()}, Transport: TransportWS, Employee: "alice", Clock: clock})
	fc := ff.next(t)
	fc.send(t, map[string]any{"type": "init", "version": 3, "digest": "d3", "policies": []any{feedPolicy("a", "Bash", "deny", "x")}})
	r.waitState(t, StateReady)
	fc.send(t, map[string]any{"type": "revoke", "reason": "employee deactivated"})
	mustRevoked(t, r.wait(t), "employee deactivated")
	if !r.ShouldBlockAll() || r.State() != StateRevoked {
		t.Fatalf("after revoke: block all %v, state %s", r.ShouldBlockAll(), r.State())
	}
	if reason, _ := r.IsBlocked("Read", nil); reason != "Access revoked (employee deactivated). All requests blocked." {
		t.Fatalf("reason %q", reason)
	}
	if clock.armed() != 0 {
		t.Fatal("a grace timer is armed after revocation")
	}
}
