package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/sources/gittest"
	"github.com/policyd/policyd/internal/store"
)

// gitDoc is a policy document as policyd policy apply -f takes it.
func gitDoc(name, reason string, extra ...string) string {
	return fmt.Sprintf("name: %s\nkind: ToolPolicy\nscope: {org: acme}\nspec: {tool_name: Bash, action: deny, reason: %q}\n%s", name, reason, strings.Join(extra, "\n"))
}

// gitCluster is a 3-node cluster whose leader reconciles one Git source,
// git:policies, from a loopback git http-backend that needs a token.
type gitCluster struct {
	*cluster
	repo   *gittest.Repo
	secret string
}

func newGitCluster(t *testing.T, interval time.Duration) *gitCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster: not in -short (make check)")
	}
	srv := gittest.NewServer(t, "t0ken")
	repo := srv.Repo(t, "policies")
	repo.Write("README.md", "policies\n")
	repo.Commit("init")
	dir := t.TempDir()
	tokenFile, secretFile := filepath.Join(dir, "token"), filepath.Join(dir, "secret")
	if err := os.WriteFile(tokenFile, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secretFile, []byte("hook-s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3, func(cfg *config.Config) {
		cfg.Sources.Git = []config.SourceGit{{
			Name: "policies", URL: repo.URL, Ref: "main", Path: "policies", Interval: interval,
			Auth: config.GitAuth{TokenFile: tokenFile}, WebhookSecretFile: secretFile,
		}}
	})
	return &gitCluster{cluster: c, repo: repo, secret: "hook-s3cret"}
}

// owners maps each policy on node n to its source.
func owners(t *testing.T, n *Node) map[string]string {
	t.Helper()
	ps, err := n.Store().ListPolicies(store.PolicyFilter{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range ps {
		out[p.Name] = p.Source
	}
	return out
}

// everywhere waits until every running node holds exactly want (name →
// source).
func (g *gitCluster) everywhere(what string, want map[string]string) {
	g.t.Helper()
	poll.Eventually(g.t, what, func() error {
		for _, n := range g.running() {
			got := owners(g.t, n)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("%s holds %v, want %v", n.ID(), got, want)
			}
		}
		return nil
	}, poll.Within(20*time.Second))
}

func (g *gitCluster) hook(n *Node, body string, header map[string]string) response {
	g.t.Helper()
	return apiFor(g.t, n).do(http.MethodPost, "/v1/sources/git:policies/hook", []byte(body), header)
}

func githubSignature(secret, body string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// sourceView reads git:policies from the leader.
func (g *gitCluster) sourceView() adminclient.Source {
	g.t.Helper()
	list, err := apiFor(g.t, g.leader()).client.Sources(g.t.Context())
	if err != nil {
		g.t.Fatal(err)
	}
	for _, s := range list.Sources {
		if s.Name == "git:policies" {
			return s
		}
	}
	g.t.Fatalf("no git:policies in %+v", list)
	return adminclient.Source{}
}

// TestGitSource walks a Git source on a 3-node cluster through its cases:
// a push syncs on the webhook alone (the interval is an hour), in one
// entry with the source's actor; the API cannot change what it owns; a bad
// signature does nothing; a commit with one invalid document applies
// nothing and says where; a conflict with the API's policy, then adopt; a
// prune refusal, then --allow-prune.
func TestGitSource(t *testing.T) {
	g := newGitCluster(t, time.Hour)
	follower := g.follower()
	api := apiFor(t, follower)
	api.putPolicy("acme.api", "acme", "written through the API")

	// The first sync, at leadership, finds no policies.
	poll.Eventually(t, "the first sync", func() error {
		if s := g.sourceView(); s.Reconciler == nil || s.Reconciler.LastResult == "" {
			return fmt.Errorf("no sync yet: %+v", s)
		}
		return nil
	})

	g.repo.Write("policies/a.yaml", gitDoc("acme.a", "one")+"---\n"+gitDoc("acme.b", "two"))
	commit := g.repo.Commit("two policies")
	body := `{"ref":"refs/heads/main"}`
	if r := g.hook(follower, body, map[string]string{"X-Hub-Signature-256": githubSignature("wrong", body)}); r.status != http.StatusUnauthorized {
		t.Fatalf("hook with a bad signature: %d %s, want 401", r.status, r.body)
	}
	if r := g.hook(follower, body, map[string]string{"X-Hub-Signature-256": githubSignature(g.secret, body)}); r.status != http.StatusAccepted {
		t.Fatalf("hook: %d %s, want 202", r.status, r.body)
	}
	g.everywhere("the push's policies", map[string]string{"acme.api": "", "acme.a": "git:policies", "acme.b": "git:policies"})

	page, err := follower.Store().ListEvents(store.EventFilter{Type: store.EntityPolicy})
	if err != nil {
		t.Fatal(err)
	}
	idx := map[string]uint64{}
	for _, ev := range page.Events {
		if ev.EntityID == "acme.a" || ev.EntityID == "acme.b" {
			if want := "source:git:policies@" + commit; ev.Actor != want {
				t.Errorf("event of %s: actor %q, want %q", ev.EntityID, ev.Actor, want)
			}
			idx[ev.EntityID] = ev.ID
		}
	}
	if idx["acme.a"] == 0 || idx["acme.a"] != idx["acme.b"] {
		t.Errorf("the sync's events are at indexes %v; want one entry", idx)
	}

	// The API cannot change what the source owns.
	r := api.do(http.MethodPut, "/v1/policies/acme.a", toolPolicy("acme.a", "acme", "by hand"), nil)
	if r.status != http.StatusConflict || !strings.Contains(string(r.body), "managed by git:policies (ToolPolicy acme.a); change it there") {
		t.Errorf("PUT of a managed policy: %d %s", r.status, r.body)
	}
	if r := api.do(http.MethodDelete, "/v1/policies/acme.b", nil, nil); r.status != http.StatusConflict {
		t.Errorf("DELETE of a managed policy: %d %s", r.status, r.body)
	}
	var got struct {
		Source string `json:"source"`
	}
	api.do(http.MethodGet, "/v1/policies/acme.a", nil, nil).decode(t, &got)
	if got.Source != "git:policies" {
		t.Errorf("GET shows source %q, want git:policies", got.Source)
	}

	// One invalid document: nothing of the commit applies.
	g.repo.Write("policies/a.yaml", gitDoc("acme.a", "changed")+"---\n"+gitDoc("acme.b", "two"))
	g.repo.Write("policies/bad.yaml", "name: acme.bad\nkind: ToolPolicy\nscope: {org: acme}\nspec: {tool_name: Bash, action: explode}\n")
	g.repo.Commit("one bad document")
	g.sync(follower, false)
	poll.Eventually(t, "the invalid commit's status", func() error {
		rc := g.sourceView().Reconciler
		if rc == nil || rc.LastResult != "invalid" || !strings.Contains(rc.LastError, "policies/bad.yaml#1") || !strings.Contains(rc.LastError, "spec.action") {
			return fmt.Errorf("reconciler %+v", rc)
		}
		return nil
	})
	if p, err := follower.Store().GetPolicy("acme.a"); err != nil || !strings.Contains(string(p.Spec), `"one"`) {
		t.Errorf("acme.a after the refused commit: %v %v; want it unchanged", p, err)
	}

	// A conflict with the API's policy, then adopt.
	g.repo.Remove("policies/bad.yaml")
	g.repo.Write("policies/api.yaml", gitDoc("acme.api", "taken"))
	g.repo.Commit("declare the API's policy")
	g.sync(follower, false)
	poll.Eventually(t, "the conflict", func() error {
		rc := g.sourceView().Reconciler
		if rc == nil || len(rc.Conflicts) != 1 || !strings.Contains(rc.Conflicts[0].Message, "owned by the API") {
			return fmt.Errorf("reconciler %+v", rc)
		}
		return nil
	})
	g.everywhere("the changed policy beside the conflict", map[string]string{"acme.api": "", "acme.a": "git:policies", "acme.b": "git:policies"})
	g.repo.Write("policies/api.yaml", gitDoc("acme.api", "taken", "adopt: true"))
	g.repo.Commit("adopt it")
	g.sync(follower, false)
	g.everywhere("the adopted policy", map[string]string{"acme.api": "git:policies", "acme.a": "git:policies", "acme.b": "git:policies"})

	// Emptying the path is refused, until it is allowed.
	g.repo.Remove("policies/a.yaml")
	g.repo.Remove("policies/api.yaml")
	g.repo.Write("policies/keep.txt", "not a document\n")
	g.repo.Commit("empty the source")
	g.sync(follower, false)
	poll.Eventually(t, "the prune refusal", func() error {
		rc := g.sourceView().Reconciler
		if rc == nil || rc.PruneRefused == nil || rc.PruneRefused.Deletes != 3 || rc.PruneRefused.Owned != 3 {
			return fmt.Errorf("reconciler %+v", rc)
		}
		return nil
	})
	g.everywhere("nothing pruned", map[string]string{"acme.api": "git:policies", "acme.a": "git:policies", "acme.b": "git:policies"})
	g.sync(follower, true)
	g.everywhere("the allowed prune", map[string]string{})
	if s := g.sourceView(); s.PruneAllowed || s.Policies != 0 {
		t.Errorf("after the prune: %+v; want the grant used up and no policies", s)
	}

	// The leader's metrics.
	r = apiFor(t, g.leader()).do(http.MethodGet, "/metrics", nil, nil)
	for _, want := range []string{
		`policyd_source_syncs_total\{result="committed",source="git:policies"\} [1-9]`,
		`policyd_source_syncs_total\{result="invalid",source="git:policies"\} [1-9]`,
		`policyd_source_syncs_total\{result="prune_refused",source="git:policies"\} [1-9]`,
		`policyd_source_policies\{source="git:policies"\} 0\n`,
		`policyd_source_last_sync_timestamp_seconds\{source="git:policies"\} 1\.`,
		`policyd_source_sync_duration_seconds_count [1-9]`,
	} {
		if !regexp.MustCompile(want).Match(r.body) {
			t.Errorf("/metrics has no line matching %s", want)
		}
	}
}

// sync asks for a sync through n, as policyd sources sync does.
func (g *gitCluster) sync(n *Node, allowPrune bool) {
	g.t.Helper()
	if _, err := apiFor(g.t, n).client.SyncSource(g.t.Context(), "git:policies", allowPrune); err != nil {
		g.t.Fatal(err)
	}
}

// TestGitSourceLeaderCrash: the leader crashes right after it is asked to
// sync a large commit; the new leader converges on it, each policy
// created once, and a poll alone (no webhook) finds later pushes.
func TestGitSourceLeaderCrash(t *testing.T) {
	g := newGitCluster(t, time.Second)
	files := map[string]string{}
	want := map[string]string{}
	for i := range 300 {
		name := fmt.Sprintf("acme.p%03d", i)
		files[fmt.Sprintf("policies/p%03d.yaml", i)] = gitDoc(name, strings.Repeat("x", 2000))
		want[name] = "git:policies"
	}
	g.repo.ImportFiles(files)
	leader := g.leader()
	i := g.indexOf(leader)
	g.sync(g.follower(), false)
	g.crash(i)
	g.leader()
	g.everywhere("the commit on the new leader's watch", want)
	for _, n := range g.running() {
		page, err := n.Store().ListEvents(store.EventFilter{Type: store.EntityPolicy, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		creates := map[string]int{}
		for _, ev := range page.Events {
			if ev.Action == store.ActionCreate {
				creates[ev.EntityID]++
			}
		}
		for name := range want {
			if creates[name] != 1 {
				t.Fatalf("%s: %s created %d times", n.ID(), name, creates[name])
			}
		}
	}
	g.restart(i)
	g.repo.Git("pull", "-q", "origin", "main")
	g.repo.Git("rm", "-q", "policies/p000.yaml")
	g.repo.Commit("drop one")
	delete(want, "acme.p000")
	g.everywhere("a push the poll finds", want)
}

// indexOf is n's position in the cluster.
func (c *cluster) indexOf(n *Node) int {
	for i, m := range c.nodes {
		if m == n {
			return i
		}
	}
	c.t.Fatalf("%s is not in the cluster", n.ID())
	return -1
}
