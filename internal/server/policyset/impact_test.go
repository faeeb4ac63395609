package policyset

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// clientNames is each policy's name and revision, as names gives a Set's.
func clientNames(ps []client.Policy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name+"@"+strconv.FormatUint(p.Revision, 10))
	}
	return out
}

func TestImpactSets(t *testing.T) {
	env := newRolloutEnv(t)
	x := env.x
	env.put("keep", policy.Scope{Org: "a"}, "k")                                // 1
	env.put("change", policy.Scope{Org: "a", Team: "t"}, "old")                 // 2
	env.put("remove", policy.Scope{Org: "a", Team: "u"}, "r")                   // 3
	env.put("elsewhere", policy.Scope{Org: "b"}, "e")                           // 4
	env.put("mine", policy.Scope{Org: "a", Team: "t", Employee: "named"}, "me") // 5
	changes := []*commandv1.RolloutChange{
		putChange(testPolicy("change", policy.Scope{Org: "a", Team: "t"}, "new")),
		putChange(testPolicy("added", policy.Scope{Org: "a", Team: "t", Employee: "e2"}, "n")),
		{Op: "delete", Name: "remove"},
		{Op: "delete", Name: "never-was"},
	}
	im, err := x.Impact(changes)
	if err != nil {
		t.Fatal(err)
	}
	// Written after the copy: the replay does not see it.
	env.put("later", policy.Scope{}, "l") // 6
	if got := im.Index(); got != 5 {
		t.Errorf("Index = %d, want 5", got)
	}

	tests := []struct {
		name                string
		id                  policy.Identity
		affected            bool
		baseline, candidate []string
	}{
		{name: "other org", id: policy.Identity{Org: "b", Team: "t", Employee: "e1"}},
		{name: "team the changes miss", id: policy.Identity{Org: "a", Team: "v", Employee: "e1"}},
		{name: "put replaces", id: policy.Identity{Org: "a", Team: "t", Employee: "e1"}, affected: true,
			baseline: []string{"change@2", "keep@1"}, candidate: []string{"change@0", "keep@1"}},
		{name: "employee named by a stable policy", id: policy.Identity{Org: "a", Team: "t", Employee: "named"}, affected: true,
			baseline: []string{"change@2", "keep@1", "mine@5"}, candidate: []string{"change@0", "keep@1", "mine@5"}},
		{name: "employee named by a put", id: policy.Identity{Org: "a", Team: "t", Employee: "e2"}, affected: true,
			baseline: []string{"change@2", "keep@1"}, candidate: []string{"added@0", "change@0", "keep@1"}},
		{name: "delete", id: policy.Identity{Org: "a", Team: "u", Employee: "e1"}, affected: true,
			baseline: []string{"keep@1", "remove@3"}, candidate: []string{"keep@1"}},
		{name: "team identity", id: policy.Identity{Org: "a", Team: "u"}, affected: true,
			baseline: []string{"keep@1", "remove@3"}, candidate: []string{"keep@1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 { // the second from the cache
				base, cand, affected := im.Sets(tc.id.Org, tc.id.Team, tc.id.Employee)
				if affected != tc.affected {
					t.Fatalf("affected = %v, want %v", affected, tc.affected)
				}
				if diff := gocmp.Diff(tc.baseline, clientNames(base)); diff != "" {
					t.Errorf("baseline (-want +got):\n%s", diff)
				}
				if diff := gocmp.Diff(tc.candidate, clientNames(cand)); diff != "" {
					t.Errorf("candidate (-want +got):\n%s", diff)
				}
			}
		})
	}

	t.Run("candidate is the rollout's candidate", func(t *testing.T) {
		// The same changes as a rollout at 100%: every cohort member of
		// an affected identity is served what Sets calls the candidate,
		// but for the rollout's creation time in the stored bytes.
		id := "r" + strconv.FormatUint(env.next, 10)
		r := newRollout(id, store.RolloutRunning, 2, changes...)
		env.update(env.rolloutChange(r))
		e1 := policy.Identity{Org: "a", Team: "t", Employee: "e2"}
		served := x.SetFor(e1, "m", Caps{Rollouts: true, Shadow: true})
		_, cand, _ := im.Sets(e1.Org, e1.Team, e1.Employee)
		want := ClientPolicies(served)
		want = slices.DeleteFunc(want, func(p client.Policy) bool { return p.Name == "later" })
		if diff := gocmp.Diff(want, cand); diff != "" {
			t.Errorf("candidate (-rollout's +Sets):\n%s", diff)
		}
	})
}

func TestImpactRejectsBadChanges(t *testing.T) {
	env := newRolloutEnv(t)
	env.put("keep", policy.Scope{Org: "a"}, "k")
	tests := []struct {
		name    string
		change  *commandv1.RolloutChange
		mention string
	}{
		{"unknown op", &commandv1.RolloutChange{Op: "patch", Name: "keep"}, "patch"},
		{"put without a policy", &commandv1.RolloutChange{Op: "put"}, "no policy name"},
		{"delete without a name", &commandv1.RolloutChange{Op: "delete"}, "no policy name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := env.x.Impact([]*commandv1.RolloutChange{tc.change})
			if err == nil || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("Impact = %v, want an error mentioning %q", err, tc.mention)
			}
		})
	}
}

// TestImpactEvaluates: the sets are what the SDK compiles, shadow
// policies in them included but not deciding.
func TestImpactEvaluates(t *testing.T) {
	env := newRolloutEnv(t)
	env.put("bash", policy.Scope{Org: "a"}, "no bash")
	shadow := putChange(testPolicy("bash", policy.Scope{Org: "a"}, "no bash"))
	shadow.Policy.Enforcement = policy.EnforcementShadow
	im, err := env.x.Impact([]*commandv1.RolloutChange{shadow})
	if err != nil {
		t.Fatal(err)
	}
	base, cand, affected := im.Sets("a", "t", "e")
	if !affected {
		t.Fatal("not affected")
	}
	req := client.Request{Tool: "Bash", Input: map[string]any{"command": "ls"}}
	for _, tc := range []struct {
		name    string
		set     []client.Policy
		allowed bool
	}{{"baseline", base, false}, {"candidate", cand, true}} {
		ev, err := client.NewEvaluator(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		if d := ev.Evaluate(t.Context(), req); d.Allowed != tc.allowed {
			t.Errorf("%s: %+v, want allowed %v", tc.name, d, tc.allowed)
		}
	}
}
