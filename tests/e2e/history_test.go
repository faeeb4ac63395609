package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/adminapi"
	"github.com/policyd/policyd/internal/store"
)

var appliedRE = regexp.MustCompile(`applied \(revision (\d+)\)`)

// TestHistoryDiffRevertCLI runs `policy|employee history`, `diff` and
// `revert` against a real 3-node cluster, each step through another node:
// the history names every write's actor, diff shows the change between two
// revisions, revert writes an old one back and is refused when another
// write came first, and bad requests exit non-zero with a clear message.
func TestHistoryDiffRevertCLI(t *testing.T) {
	c := newProcCluster(t, 3)
	c.leader(0, 1, 2)
	poll.Eventually(t, "every node to write command version 3", func() error {
		for i := range c.ids {

			var st adminapi.ClusterStatus
			if err := getJSON(c.http[i]+"/v1/cluster", &st); err != nil {
				return err
			}
			if st.CommandVersion != command.CommandVersion || len(st.Members) != len(c.ids) {
				return fmt.Errorf("%s writes command version %d, %d members", c.ids[i], st.CommandVersion, len(st.Members))
			}
			for _, m := range st.Members {
				if m.CommandVersion != command.CommandVersion {
					return fmt.Errorf("%s: member %s registered command version %d", c.ids[i], m.ID, m.CommandVersion)
				}
			}
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	applyDoc := func(i int, kind, doc string) uint64 {
		t.Helper()
		out, err := cliInput(t, c.dir, doc, "--server", c.http[i], kind, "apply", "-f", "-")
		m := appliedRE.FindStringSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("%s apply through %s: %v\n%s", kind, c.ids[i], err, out)
		}
		rev, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	policyWith := func(reason string) string {
		return `{"name": "acme.h", "kind": "ToolPolicy", "scope": {"org": "acme"},
 "spec": {"tool_name": "Bash", "action": "deny", "reason": "` + reason + `", "conditions": {"patterns": ["rm -rf"]}}}`
	}
	fails := func(i int, mention string, args ...string) {
		t.Helper()
		out, err := cliErr(t, c.dir, append([]string{"--server", c.http[i]}, args...)...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(out, mention) {
			t.Errorf("policyd %s: %v, output %q; want a non-zero exit mentioning %q", strings.Join(args, " "), err, out, mention)
		}
	}

	r1 := applyDoc(0, "policy", policyWith("one"))
	r2 := applyDoc(1, "policy", policyWith("two"))

	t.Run("diff", func(t *testing.T) {
		// Three lines of context; the revision and timestamps, which every
		// write changes, are left out.
		body := `@@ -13,7 +13,7 @@
         "rm -rf"
       ]
     },
-    "reason": "one",
+    "reason": "two",
     "tool_name": "Bash"
   }
 }
`
		want := fmt.Sprintf("--- policy/acme.h@%d\n+++ policy/acme.h@%d\n%s", r1, r2, body)
		if diff := cmp.Diff(want, c.cli(2, "policy", "diff", "acme.h", "--from", fmt.Sprint(r1), "--to", fmt.Sprint(r2))); diff != "" {
			t.Errorf("diff output (-want +got):\n%s", diff)
		}
		want = fmt.Sprintf("--- policy/acme.h@%d\n+++ policy/acme.h@current\n%s", r1, body)
		if diff := cmp.Diff(want, c.cli(1, "policy", "diff", "acme.h", "--from", fmt.Sprint(r1))); diff != "" {
			t.Errorf("diff against the current revision (-want +got):\n%s", diff)
		}
		if out := c.cli(0, "policy", "diff", "acme.h", "--from", fmt.Sprint(r2), "--to", fmt.Sprint(r2)); out != "" {
			t.Errorf("diff of a revision with itself: %q, want nothing", out)
		}
		fails(0, "--from", "policy", "diff", "acme.h")
		fails(0, "no revision 999999", "policy", "diff", "acme.h", "--from", "999999")
	})

	var r3 uint64
	t.Run("revert", func(t *testing.T) {
		out := c.cli(2, "policy", "revert", "acme.h", "--to", fmt.Sprint(r1))
		if _, err := fmt.Sscanf(out, "policy/acme.h reverted to revision %d (new revision %d)", new(uint64), &r3); err != nil || r3 <= r2 {
			t.Fatalf("revert output %q (%v)", out, err)
		}
		if out := c.cli(0, "policy", "get", "acme.h"); !strings.Contains(out, `"reason":"one"`) && !strings.Contains(out, `"reason": "one"`) {
			t.Fatalf("after the revert: %s", out)
		}
		// Another write lands after the operator looked: the revert that
		// names the revision seen is refused and changes nothing.
		applyDoc(1, "policy", policyWith("four"))
		fails(0, "409 conflict", "policy", "revert", "acme.h", "--to", fmt.Sprint(r2), "--if-match", fmt.Sprint(r3))
		if out := c.cli(2, "policy", "get", "acme.h"); !strings.Contains(out, "four") {
			t.Fatalf("a refused revert changed the policy: %s", out)
		}
		fails(1, "no revision 999999", "policy", "revert", "acme.h", "--to", "999999")
		fails(1, "--to", "policy", "revert", "acme.h")
	})

	t.Run("history", func(t *testing.T) {
		out := c.cli(1, "policy", "history", "acme.h")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 5 || !strings.HasPrefix(lines[0], "REVISION") {
			t.Fatalf("history: %q, want a header and 4 revisions", out)
		}
		for i, want := range []string{
			fmt.Sprintf(`^%d\s+\S+\s+CREATE\s+anonymous\s+[0-9a-f]{32}\s*$`, r1),
			fmt.Sprintf(`^%d\s+\S+\s+UPDATE\s+anonymous\s+[0-9a-f]{32}\s*$`, r2),
			fmt.Sprintf(`^%d\s+\S+\s+UPDATE\s+anonymous\s+[0-9a-f]{32}\s+revert to %d$`, r3, r1),
			`^\d+\s+\S+\s+UPDATE\s+anonymous`,
		} {
			if !regexp.MustCompile(want).MatchString(lines[i+1]) {
				t.Errorf("history line %d: %q, want %s", i+1, lines[i+1], want)
			}
		}
		fails(2, "404 not_found", "policy", "history", "acme.never")

		c.cli(0, "policy", "delete", "acme.h")
		var h adminapi.History
		if err := json.Unmarshal([]byte(c.cli(2, "-o", "json", "policy", "history", "acme.h")), &h); err != nil {
			t.Fatal(err)
		}
		if n := len(h.Revisions); n != 5 || h.Revisions[n-1].Action != store.ActionDelete {
			t.Fatalf("history of the deleted policy: %+v, want 5 revisions ending in a DELETE", h.Revisions)
		}
		out = c.cli(1, "policy", "revert", "acme.h", "--to", fmt.Sprint(r2))
		if !strings.Contains(out, "reverted to revision") {
			t.Fatalf("revert of the deleted policy: %s", out)
		}
	})

	t.Run("employee", func(t *testing.T) {
		e1 := applyDoc(0, "employee", `{"id": "alice", "org": "acme", "team": "red"}`)
		e2 := applyDoc(1, "employee", `{"id": "alice", "org": "acme", "team": "blue"}`)
		out := c.cli(2, "employee", "diff", "alice", "--from", fmt.Sprint(e1), "--to", fmt.Sprint(e2))
		if !strings.Contains(out, `-  "team": "red"`) || !strings.Contains(out, `+  "team": "blue"`) {
			t.Errorf("employee diff: %s", out)
		}
		out = c.cli(0, "employee", "revert", "alice", "--to", fmt.Sprint(e1))
		if !strings.Contains(out, fmt.Sprintf("employee/alice reverted to revision %d", e1)) {
			t.Fatalf("employee revert: %s", out)
		}
		var h adminapi.History
		if err := json.Unmarshal([]byte(c.cli(1, "-o", "json", "employee", "history", "alice")), &h); err != nil {
			t.Fatal(err)
		}
		if n := len(h.Revisions); n != 3 || h.Revisions[2].RevertedTo != e1 || h.Revisions[2].Actor != "anonymous" {
			t.Fatalf("employee history: %+v, want 3 revisions, the last a revert to %d", h.Revisions, e1)
		}
		if out := c.cli(2, "employee", "get", "alice"); !strings.Contains(out, `"team": "red"`) {
			t.Errorf("employee after the revert: %s", out)
		}
	})
	c.converged(0, 1, 2)
}
