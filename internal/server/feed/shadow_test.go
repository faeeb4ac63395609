package feed

import (
	"strconv"
	"testing"

	"github.com/policyd/policyd/internal/command"

	"github.com/google/go-cmp/cmp"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/policy"
)

// TestShadowDelivery: a connection that declared the shadow capability is
// sent shadow policies, marked; one that did not never is: it hears
// nothing of a new shadow policy, gets a delete when an enforced policy
// turns shadow, an upsert when it turns back, and a resume replays the
// same.
func TestShadowDelivery(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	seedData(f)
	alice := identity("acme", "red", "alice")
	put := func(name, enforcement string) {
		p := toolPolicy(name, scopeOrg("acme"), "r")
		p.Enforcement = enforcement
		f.apply(must(t)(command.PutPolicy(p, nil)))
	}
	shadowConn, init := f.connect(t, alice, feedv1.QueryCapabilities+"=shadow")
	v1Conn, v1Init := f.connect(t, alice, "")
	if init.Digest != v1Init.Digest {
		t.Fatalf("digests differ without shadow policies: %s, %s", init.Digest, v1Init.Digest)
	}
	marker := 0
	step := func(what string, want, wantV1 []string) (shadowMsgs []feedv1.Message) {
		t.Helper()
		marker++
		name := "marker-" + strconv.Itoa(marker)
		f.apply(f.putPolicy(name, policy.Scope{}, "m"))
		shadowMsgs = shadowConn.until(name)
		if diff := cmp.Diff(want, summary(shadowMsgs)); diff != "" {
			t.Errorf("%s: shadow connection (-want +got):\n%s", what, diff)
		}
		if diff := cmp.Diff(wantV1, summary(v1Conn.until(name))); diff != "" {
			t.Errorf("%s: v1 connection (-want +got):\n%s", what, diff)
		}
		return shadowMsgs
	}
	put("s1", "shadow")
	msgs := step("new shadow policy", []string{"upsert:s1"}, []string{})
	if msgs[0].Policy.Enforcement != policy.EnforcementShadow {
		t.Errorf("shadow upsert enforcement %q, want shadow", msgs[0].Policy.Enforcement)
	}
	put("s1", "enforce")
	msgs = step("turned enforced", []string{"upsert:s1"}, []string{"upsert:s1"})
	if msgs[0].Policy.Enforcement != "" {
		t.Errorf("enforced upsert enforcement %q, want none", msgs[0].Policy.Enforcement)
	}
	before := f.next - 1 // the marker's index: both hold s1 enforced
	put("s1", "shadow")
	step("turned shadow", []string{"upsert:s1"}, []string{"delete:s1"})

	// A resume from before the turn replays it the same way: a delete
	// for a v1 connection, the shadow upsert for the other.
	for _, tc := range []struct{ query, want string }{
		{"", "delete:s1"},
		{feedv1.QueryCapabilities + "=shadow&", "upsert:s1"},
	} {
		c := f.dial(t, dialOpts{token: f.token(alice.Employee, alice.Org, alice.Team), query: tc.query + "since=" + strconv.FormatUint(before, 10)})
		first := c.next()
		if got := summary([]feedv1.Message{first}); !cmp.Equal(got, []string{tc.want}) {
			t.Errorf("resume %q replayed %v first, want %s", tc.query, got, tc.want)
		}
	}
}
