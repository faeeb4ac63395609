package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
)

// The console's tests drive headless Chromium (Debian's chromium, found
// by hack/chromium.sh) against a real 3-node cluster with SDK sidecars.

const (
	consoleAdminToken = "console-admin-token-0123456789"
	consoleReadToken  = "console-read-token-0123456789"
	// hostile is untrusted text that would run script if shown unescaped.
	hostile = `<script>alert(1)</script>"><img src=x onerror=alert(2)>`
)

// chromiumPath is the browser the tests drive; "" skips them.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("drives a browser: not in -short (make check)")
	}
	if p := os.Getenv("POLICYD_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium: hack/chromium.sh installs Debian's chromium (make test runs it), or set POLICYD_CHROMIUM")
	return ""
}

// browser is one headless Chromium; its tabs record every dialog, console
// error and uncaught exception, which fail the test.
type browser struct {
	t    *testing.T
	root context.Context

	mu       sync.Mutex
	problems []string
}

func newBrowser(t *testing.T) *browser {
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	root, cancel := chromedp.NewContext(alloc)
	if err := chromedp.Do(root); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("start %s: %v", path, err)
	}
	t.Cleanup(func() {
		_ = chromedp.Cancel(root)
		cancel()
		cancelAlloc()
	})
	return &browser{t: t, root: root}
}

// tab is one browser tab; isolated tabs have their own cookies.
type tab struct {
	t    testing.TB
	b    *browser
	ctx  context.Context
	name string
}

// in is the tab reporting to t, a subtest's.
func (tb *tab) in(t testing.TB) *tab {
	c := *tb
	c.t = t
	return &c
}

func (b *browser) tab(t testing.TB, name string, isolated bool) *tab {
	tb := &tab{t: t, b: b, name: name}
	listen := chromedp.WithListener(func(ev any) {
		var p string
		switch e := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			p = fmt.Sprintf("%s: a %s dialog opened: %q", name, e.Type, e.Message)
		case *runtime.EventExceptionThrown:
			p = fmt.Sprintf("%s: uncaught exception: %s", name, e.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				p = fmt.Sprintf("%s: console.error", name)
			}
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError && !expectedRefusal(e.Entry) {
				p = fmt.Sprintf("%s: console error: %s (%s)", name, e.Entry.Text, e.Entry.URL)
			}
		}
		if p != "" {
			b.mu.Lock()
			b.problems = append(b.problems, p)
			b.mu.Unlock()
		}
	})
	opts := []chromedp.ContextOption{listen}
	if isolated {
		opts = append(opts, chromedp.WithNewBrowserContext())
	}
	ctx, cancel := chromedp.NewContext(b.root, opts...)
	b.t.Cleanup(cancel)
	tb.ctx = ctx
	if err := chromedp.Do(ctx); err != nil {
		b.t.Fatalf("open tab %s: %v", name, err)
	}
	return tb
}

// expectedRefusal is a refused request a test makes on purpose (the 403s
// and the 401 of a wrong token), which the browser logs as an error.
func expectedRefusal(e *log.Entry) bool {
	return e.Source == log.EntrySourceNetwork && (strings.Contains(e.Text, "403") || strings.Contains(e.Text, "401"))
}

// noProblems fails the test on anything the tabs recorded.
func (b *browser) noProblems() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		b.t.Error(p)
	}
	b.problems = nil
}

func (tb *tab) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		tb.t.Fatalf("%s: %s: %v", tb.name, what, err)
	}
}

// open navigates to path and waits for the page's heading.
func (tb *tab) open(base, path string) {
	tb.t.Helper()
	tb.run("open "+path, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS("h1")))
}

// text is the rendered text of the first element sel matches, read in
// one step (a live view may replace the element at any time).
func (tb *tab) text(sel string) string {
	tb.t.Helper()
	b, _ := json.Marshal(sel)
	s := eval[*string](tb, fmt.Sprintf("(e => e ? e.innerText : null)(document.querySelector(%s))", b))
	if s == nil {
		tb.t.Fatalf("%s: no element %s", tb.name, sel)
	}
	return strings.TrimSpace(*s)
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](tb *tab, js string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("%s: eval %s: %v", tb.name, js, err)
	}
	return v
}

// shot saves a PNG of the whole page under the test's artifact directory.
func (tb *tab) shot(name string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.t.Fatalf("%s: screenshot: %v", tb.name, err)
	}
	path := filepath.Join(tb.t.ArtifactDir(), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	tb.t.Logf("screenshot %s", path)
}

// follow runs steps that load a new page (a click on a link or a form's
// button) and waits until the new page has loaded.
func (tb *tab) follow(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	eval[bool](tb, "window.policydOldPage = true")
	tb.run(what, steps...)
	poll.Eventually(tb.t, tb.name+": "+what+": the next page", func() error {
		ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
		defer cancel()
		done, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("window.policydOldPage === undefined && document.readyState === 'complete'"))
		if err != nil {
			return err
		}
		if !done {
			return errors.New("still on the old page")
		}
		return nil
	})
}

// waitLive waits until the page's live view says it is connected.
func (tb *tab) waitLive() {
	tb.t.Helper()
	poll.Eventually(tb.t, tb.name+": the live view to connect", func() error {
		if got := tb.text("#live-status"); !strings.HasPrefix(got, "Live") {
			return fmt.Errorf("live status %q", got)
		}
		return nil
	})
}

func (tb *tab) signIn(base, token string) {
	tb.t.Helper()
	tb.open(base, "/ui/signin")
	tb.run("type the token", chromedp.SetValue(chromedp.ID("token"), token))
	tb.follow("sign in", chromedp.Click(chromedp.ID("signin")))
}

// cookie is the console's session cookie the tab holds.
func (tb *tab) cookie(base string) *http.Cookie {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	cookies, err := chromedp.Run(ctx, func(ctx context.Context, _ *chromedp.Target) ([]*network.Cookie, error) {
		res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/ui/"}})
		if err != nil {
			return nil, err
		}
		return res.Cookies, nil
	})
	if err != nil {
		tb.t.Fatalf("%s: cookies: %v", tb.name, err)
	}
	for _, c := range cookies {
		if c.Name == "policyd_console" {
			return &http.Cookie{Name: c.Name, Value: c.Value}
		}
	}
	tb.t.Fatalf("%s: no session cookie", tb.name)
	return nil
}

// consoleCluster is the cluster the browser tests share: three nodes
// taking the two console tokens, sidecars on both transports, a policy
// holding hostile text and a sidecar that NACKs it.
type consoleCluster struct {
	*cluster
	admin *adminclient.Client
}

func newConsoleCluster(t *testing.T) *consoleCluster {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("admin "+consoleAdminToken+" ops-admin\nread "+consoleReadToken+" ops-read\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3, func(c *config.Config) { c.Auth.AdminTokensFile = path })
	for _, n := range c.nodes {
		waitCommandVersion(t, n)
	}
	admin, err := adminclient.New(adminclient.Config{Servers: []string{"http://" + c.nodes[0].HTTPAddr(),
		"http://" + c.nodes[1].HTTPAddr(), "http://" + c.nodes[2].HTTPAddr()}, Token: consoleAdminToken})
	if err != nil {
		t.Fatal(err)
	}
	return &consoleCluster{cluster: c, admin: admin}
}

func (cc *consoleCluster) put(t *testing.T, name string, doc map[string]any) *adminclient.Written {
	t.Helper()
	doc["name"] = name
	b, _ := json.Marshal(doc)
	w, err := cc.admin.PutPolicy(t.Context(), name, b, -1)
	if err != nil {
		t.Fatalf("PUT %s: %v", name, err)
	}
	return w
}

func TestConsoleInBrowser(t *testing.T) {
	b := newBrowser(t)
	cc := newConsoleCluster(t)
	ctx := t.Context()
	cc.put(t, "acme.deny-shell", map[string]any{"kind": "ToolPolicy", "scope": map[string]string{"org": "acme"},
		"labels": map[string]string{"owner": "platform"},
		"spec":   map[string]any{"tool_name": "Bash", "action": "deny", "reason": "v1 " + hostile}})
	w2 := cc.put(t, "acme.deny-shell", map[string]any{"kind": "ToolPolicy", "scope": map[string]string{"org": "acme"},
		"spec": map[string]any{"tool_name": "Bash", "action": "deny", "reason": "v2 " + hostile}})
	cc.put(t, "beta.shadow", map[string]any{"kind": "ToolPolicy", "scope": map[string]string{"org": "beta"}, "enforcement": "shadow",
		"spec": map[string]any{"tool_name": "Bash", "action": "deny", "reason": "shadow"}})

	// Sidecars on every node, both transports; nack-* refuse any set
	// holding acme.validate, with a hostile message.
	nack := func(set []client.Policy) error {
		for _, p := range set {
			if p.Name == "acme.validate" {
				return errors.New("refused " + hostile)
			}
		}
		return nil
	}
	for i, n := range cc.nodes {
		emp := fmt.Sprintf("beta-%d", i)
		if _, err := cc.admin.PutEmployee(ctx, emp, []byte(`{"org":"beta","team":"blue"}`), -1); err != nil {
			t.Fatal(err)
		}
		startSDK(t, client.Config{Servers: []string{n.GRPCAddr()}, ClientAddress: fmt.Sprintf("grpc-%d", i), Scope: client.Scope{Org: "acme", Team: "red"}})
		startSDK(t, client.Config{Servers: []string{n.HTTPAddr()}, Transport: client.TransportWS, Employee: emp})
	}
	startSDK(t, client.Config{Servers: []string{cc.nodes[1].GRPCAddr()}, ClientAddress: "nack-1", Scope: client.Scope{Org: "acme", Team: "blue"}, Apply: nack})
	// Put after the sidecars are ready, so nack-1 refuses an update.
	cc.put(t, "acme.validate", map[string]any{"kind": "ValidatingPolicy", "scope": map[string]string{"org": "acme"},
		"spec": map[string]any{"validations": []map[string]any{{
			"expression": `!has(request.method) || request.method != "` + strings.ReplaceAll(hostile, `"`, `\"`) + `"`,
			"message":    "message " + hostile}}}})
	poll.Eventually(t, "7 sidecars, one NACKing", func() error {
		l, err := cc.admin.ClientsPage(ctx, adminclient.ClientFilter{Limit: 1})
		if err != nil {
			return err
		}
		if l.Total != 7 || l.Counts.Nacked != 1 {
			return fmt.Errorf("%d sidecars, %d NACKed", l.Total, l.Counts.Nacked)
		}
		return nil
	}, poll.Within(20*time.Second))

	leader := cc.leader()
	base := "http://" + leader.HTTPAddr()
	admin := b.tab(t, "admin", false)

	t.Run("sign-in", func(t *testing.T) {
		admin := admin.in(t)
		admin.open(base, "/ui/")
		if got := admin.text("h1"); got != "Sign in" {
			t.Fatalf("without a session /ui/ shows %q, want the sign-in page", got)
		}
		admin.shot("signin")
		admin.signIn(base, "not-a-token-of-this-cluster")
		if got := admin.text("#problem"); !strings.Contains(got, "not valid") {
			t.Fatalf("a wrong token shows %q", got)
		}
		admin.signIn(base, consoleAdminToken)
		if got := admin.text("h1"); got != "Overview" {
			t.Fatalf("after sign-in: %q", got)
		}
		if got := admin.text("#role"); got != "admin" {
			t.Fatalf("role shown %q", got)
		}
		ck := admin.cookie(base)
		cookies := eval[string](admin, "document.cookie")
		if strings.Contains(cookies, "policyd_console") {
			t.Errorf("the session cookie is readable by script (not HttpOnly): %q", cookies)
		}
		if ck.Value == "" {
			t.Fatal("empty session cookie")
		}
	})

	// Each page against what the REST API answers.
	t.Run("pages match the REST API", func(t *testing.T) {
		admin := admin.in(t)
		st, err := cc.admin.Cluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		admin.open(base, "/ui/")
		poll.Eventually(t, "the overview's leader", func() error {
			if got := admin.text("#leader"); got != st.LeaderID {
				return fmt.Errorf("leader %q, REST says %q", got, st.LeaderID)
			}
			return nil
		})
		if got := admin.text("#cluster-id"); got != st.ClusterID {
			t.Errorf("cluster id %q, REST %q", got, st.ClusterID)
		}
		if got := eval[int](admin, "document.querySelectorAll('#members-table tbody tr').length"); got != len(st.Members) {
			t.Errorf("%d members shown, REST has %d", got, len(st.Members))
		}
		if got := admin.text("#members-table tbody"); strings.Contains(got, "—") || strings.Contains(got, "not ready") {
			t.Errorf("every member ready, with its applied index: %q", got)
		}
		if got := admin.text("#attention"); !strings.Contains(got, "1 sidecar NACKed") {
			t.Errorf("needs attention: %q, want the NACK", got)
		}
		admin.shot("overview")

		admin.open(base, "/ui/sidecars")
		if got := admin.text("#sidecar-total"); !strings.HasPrefix(got, "7 sidecars match") {
			t.Errorf("sidecars: %q", got)
		}
		admin.open(base, "/ui/sidecars?state=nacked")
		if got := admin.text("#sidecars-table tbody"); !strings.Contains(got, "nack-1") || !strings.Contains(got, hostile) {
			t.Errorf("the NACKed sidecar and its message: %q", got)
		}
		admin.shot("sidecars")

		list, err := cc.admin.Policies(ctx, adminclient.PolicyFilter{})
		if err != nil {
			t.Fatal(err)
		}
		admin.open(base, "/ui/policies")
		if got := eval[int](admin, "document.querySelectorAll('#policies-table tbody tr').length"); got != len(list.Policies) {
			t.Errorf("%d policies shown, REST has %d", got, len(list.Policies))
		}
		admin.open(base, "/ui/policies?org=beta")
		if got := admin.text("#policies-table tbody"); !strings.Contains(got, "beta.shadow") || strings.Contains(got, "acme.") {
			t.Errorf("org filter: %q", got)
		}
		admin.open(base, "/ui/policies")
		admin.shot("policies")

		admin.open(base, "/ui/policies/acme.deny-shell")
		if got := admin.text("#policy-revision"); got != fmt.Sprint(w2.Revision) {
			t.Errorf("revision %q, REST %d", got, w2.Revision)
		}
		if got := admin.text("#policy-spec"); !strings.Contains(got, "v2 <script>alert(1)</script>") || !strings.Contains(got, "<img src=x onerror=alert(2)>") {
			t.Errorf("the spec shows %q, want the reason as text", got)
		}
		admin.open(base, "/ui/policies/acme.validate")
		if got := admin.text("#policy-spec"); !strings.Contains(got, "message <script>alert(1)</script>") || !strings.Contains(got, `request.method != \"<script>`) {
			t.Errorf("the validating policy shows %q", got)
		}
		admin.open(base, "/ui/policies/beta.shadow")
		if got := admin.text("#shadow-totals"); !strings.Contains(got, "would block") {
			t.Errorf("shadow counts: %q", got)
		}
		if got := admin.text("#policy-holding"); !strings.Contains(got, "3 ACKed") {
			t.Errorf("beta's 3 feed sidecars hold beta.shadow: %q", got)
		}

		for _, p := range []struct{ path, sel, want string }{
			{"/ui/drift", "#drift-table tbody", "No drift reports."},
			{"/ui/reload", "#reload-state", "disabled"},
			{"/ui/sources", "#sources-none", "No policy source is configured"},
		} {
			admin.open(base, p.path)
			if got := admin.text(p.sel); !strings.Contains(got, p.want) {
				t.Errorf("%s: %q, want %q", p.path, got, p.want)
			}
			admin.shot(strings.TrimPrefix(p.path, "/ui/"))
		}
		rel, err := cc.admin.Reload(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rel.Controller.State != "disabled" {
			t.Errorf("REST reload state %q", rel.Controller.State)
		}

		events, err := cc.admin.Events(ctx, adminclient.EventFilter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		admin.open(base, "/ui/events")
		newest := events.Events[len(events.Events)-1]
		if got := eval[string](admin, "document.querySelector('#events-table tbody tr').dataset.event"); got != fmt.Sprint(newest.ID) {
			t.Errorf("the newest event shown is %s, REST's is %d", got, newest.ID)
		}
		admin.shot("events")
		// Nothing hostile rendered as markup anywhere.
		if n := eval[int](admin, "document.images.length + document.querySelectorAll('script:not([src])').length"); n != 0 {
			t.Errorf("%d injected elements", n)
		}
		b.noProblems()
	})

	t.Run("pages read without JavaScript", func(t *testing.T) {
		noJS := b.tab(t, "no-js", false)
		noJS.run("turn scripts off", func(ctx context.Context, _ *chromedp.Target) (chromedp.Void, error) {
			_, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
			return chromedp.Void{}, err
		})
		st, err := cc.admin.Cluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []struct{ path, sel, want string }{
			{"/ui/", "#leader", st.LeaderID},
			{"/ui/sidecars?state=nacked", "#sidecars-table tbody", "nack-1"},
			{"/ui/policies/acme.deny-shell", "#history-table", "token:ops-admin"},
			{"/ui/events", "#events-table tbody", "acme.deny-shell"},
		} {
			noJS.open(base, p.path)
			if got := noJS.text(p.sel); !strings.Contains(got, p.want) {
				t.Errorf("%s without JavaScript: %s is %q, want %q", p.path, p.sel, got, p.want)
			}
			// The live script did not run: nothing said it is live.
			if got := eval[string](noJS, "(document.getElementById('live-status') || {}).textContent || ''"); got != "" {
				t.Errorf("%s: scripts ran (live status %q)", p.path, got)
			}
		}
	})

	t.Run("revert from the policy page, live on the events page", func(t *testing.T) {
		admin := admin.in(t)
		events := b.tab(t, "events", false)
		events.open(base, "/ui/events?type=policy")
		events.waitLive()
		hist, err := cc.admin.History(ctx, "policies", "acme.deny-shell", false)
		if err != nil {
			t.Fatal(err)
		}
		first := hist.Revisions[0].Revision
		admin.open(base, "/ui/policies/acme.deny-shell")
		admin.follow("click revert", chromedp.Click(chromedp.CSS(fmt.Sprintf(`a[href$="revert?to=%d"]`, first))))
		admin.shot("policy-revert")
		admin.follow("confirm", chromedp.Click(chromedp.ID("confirm")))
		if got := admin.text("#flash"); !strings.HasPrefix(got, fmt.Sprintf("Reverted to revision %d", first)) {
			t.Errorf("after the revert: %q", got)
		}
		p, err := cc.admin.Policy(ctx, "acme.deny-shell")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(p.Spec), "v1 ") {
			t.Fatalf("after the revert the policy is %s", p.Spec)
		}
		admin.shot("policy")
		poll.Eventually(t, "the revert's event on the live events page", func() error {
			row := eval[string](events, fmt.Sprintf("(document.querySelector('tr[data-event=\"%d\"]') || {}).textContent || ''", p.Revision))
			if !strings.Contains(row, "token:ops-admin") || !strings.Contains(row, "acme.deny-shell") {
				return fmt.Errorf("row %q", row)
			}
			return nil
		})
		b.noProblems()
	})

	t.Run("abort from the rollout page, live on the events page", func(t *testing.T) {
		admin := admin.in(t)
		events := b.tab(t, "events-rollout", false)
		events.open(base, "/ui/events?type=rollout")
		events.waitLive()
		ro, err := cc.admin.StartRollout(ctx, adminclient.StartRollout{
			Changes: []adminclient.StartChange{{Op: "put", Policy: toolPolicy("acme.p2", "acme", "candidate")}},
			Stages:  []adminclient.StartStage{{Percent: 50, Bake: "1h"}, {Percent: 100, Bake: "1h"}}, MaxNackRatio: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		admin.open(base, "/ui/rollouts")
		if got := admin.text("#rollouts-table tbody"); !strings.Contains(got, ro.ID) {
			t.Errorf("rollouts list: %q", got)
		}
		admin.shot("rollouts")
		admin.open(base, "/ui/rollouts/"+ro.ID)
		if got := admin.text("#rollout-state"); got != "running" {
			t.Errorf("state %q", got)
		}
		if got := admin.text("#stages"); !strings.Contains(got, "50%") || !strings.Contains(got, "current") {
			t.Errorf("stages: %q", got)
		}
		admin.shot("rollout")

		// Keyboard: Tab reaches every action of the page.
		actions := eval[[]string](admin, "[...document.querySelectorAll('[data-action]')].map(e => e.dataset.action)")
		if len(actions) != 3 {
			t.Fatalf("actions of a running rollout: %v", actions)
		}
		reached := map[string]bool{}
		for range 60 {
			admin.run("tab", chromedp.KeyEvent(kb.Tab))
			if a := eval[string](admin, "document.activeElement.dataset.action || ''"); a != "" {
				reached[a] = true
			}
		}
		for _, a := range actions {
			if !reached[a] {
				t.Errorf("Tab never reaches %q (reached %v)", a, reached)
			}
		}
		admin.follow("open abort by keyboard", chromedp.Focus(chromedp.CSS(`[data-action="abort"]`)), chromedp.KeyEvent(kb.Enter))
		admin.shot("rollout-abort")
		admin.follow("confirm by keyboard", chromedp.Focus(chromedp.ID("confirm")), chromedp.KeyEvent(kb.Enter))
		if got := admin.text("#flash"); !strings.Contains(got, "aborted") {
			t.Errorf("after the abort: %q", got)
		}
		got, err := cc.admin.StagedRollout(ctx, ro.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != "aborted" {
			t.Fatalf("after abort: state %s", got.State)
		}
		poll.Eventually(t, "the abort's event on the live events page", func() error {
			rows := eval[string](events, "document.querySelector('#events-table tbody').textContent")
			if !strings.Contains(rows, ro.ID) || strings.Count(rows, "token:ops-admin") < 2 {
				return fmt.Errorf("rows %q", rows)
			}
			return nil
		})
		b.noProblems()
	})

	t.Run("keyboard reaches the policy page's actions", func(t *testing.T) {
		admin := admin.in(t)
		admin.open(base, "/ui/policies/acme.deny-shell")
		want := eval[int](admin, "document.querySelectorAll('[data-action]').length")
		if want == 0 {
			t.Fatal("no actions on the policy page")
		}
		seen := map[string]bool{}
		for range 80 {
			admin.run("tab", chromedp.KeyEvent(kb.Tab))
			if h := eval[string](admin, "document.activeElement.dataset.action ? document.activeElement.href : ''"); h != "" {
				seen[h] = true
			}
		}
		if len(seen) != want {
			t.Errorf("Tab reached %d of %d actions: %v", len(seen), want, seen)
		}
	})

	t.Run("a read token sees no actions and its POST gets 403", func(t *testing.T) {
		reader := b.tab(t, "reader", true)
		reader.signIn(base, consoleReadToken)
		if got := reader.text("#role"); got != "read" {
			t.Fatalf("role %q", got)
		}
		hist, err := cc.admin.History(ctx, "policies", "acme.deny-shell", false)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/ui/policies/acme.deny-shell", "/ui/rollouts", fmt.Sprintf("/ui/policies/acme.deny-shell/revert?to=%d", hist.Revisions[0].Revision)} {
			reader.open(base, path)
			if n := eval[int](reader, "document.querySelectorAll('[data-action], form[method=post]:not([action=\"/ui/signout\"])').length"); n != 0 {
				t.Errorf("%s: a read token sees %d actions", path, n)
			}
		}
		reader.shot("policy-read-only")
		before, err := cc.admin.Policy(ctx, "acme.deny-shell")
		if err != nil {
			t.Fatal(err)
		}
		// A hand-made POST with the session's own CSRF token: the API
		// refuses the role.
		status := eval[int](reader, fmt.Sprintf(`fetch('/ui/policies/acme.deny-shell/revert', {method: 'POST', redirect: 'manual',
			body: new URLSearchParams({csrf: document.querySelector('input[name=csrf]').value, to: '%d'})}).then(r => r.status)`, hist.Revisions[0].Revision))
		if status != http.StatusForbidden {
			t.Errorf("a read token's POST: %d, want 403", status)
		}
		after, err := cc.admin.Policy(ctx, "acme.deny-shell")
		if err != nil {
			t.Fatal(err)
		}
		if after.Revision != before.Revision {
			t.Errorf("the refused POST wrote revision %d", after.Revision)
		}
	})

	t.Run("a POST without the CSRF token is refused", func(t *testing.T) {
		admin := admin.in(t)
		before, err := cc.admin.Policy(ctx, "acme.deny-shell")
		if err != nil {
			t.Fatal(err)
		}
		admin.open(base, "/ui/policies/acme.deny-shell")
		status := eval[int](admin, `fetch('/ui/policies/acme.deny-shell/revert', {method: 'POST', redirect: 'manual',
			body: new URLSearchParams({to: '1'})}).then(r => r.status)`)
		if status != http.StatusForbidden {
			t.Errorf("same-site POST without a CSRF token: %d, want 403", status)
		}
		// Another site's form: the browser would send the cookie only
		// without SameSite=Strict; the server refuses it regardless.
		ck := admin.cookie(base)
		csrf := eval[string](admin, "document.querySelector('input[name=csrf]').value")
		for _, tc := range []struct {
			name, body, origin string
		}{
			{"no token", "to=1", "http://evil.example"},
			{"the right token from another origin", "csrf=" + url.QueryEscape(csrf) + "&to=1", "http://evil.example"},
			{"a wrong token", "csrf=forged&to=1", ""},
		} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/ui/policies/acme.deny-shell/revert", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
				req.Header.Set("Sec-Fetch-Site", "cross-site")
			}
			req.AddCookie(ck)
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s: %d, want 403", tc.name, resp.StatusCode)
			}
		}
		after, err := cc.admin.Policy(ctx, "acme.deny-shell")
		if err != nil {
			t.Fatal(err)
		}
		if after.Revision != before.Revision {
			t.Errorf("a refused POST wrote revision %d", after.Revision)
		}
	})

	t.Run("the overview recovers when the leader is killed", func(t *testing.T) {
		old := cc.leader()
		var follower *Node
		for _, n := range cc.running() {
			if n != old {
				follower = n
				break
			}
		}
		watch := b.tab(t, "overview", false)
		fbase := "http://" + follower.HTTPAddr()
		watch.signIn(fbase, consoleAdminToken)
		poll.Eventually(t, "the overview to show the leader", func() error {
			if got := watch.text("#leader"); got != old.ID() {
				return fmt.Errorf("leader %q, want %s", got, old.ID())
			}
			return nil
		})
		cc.crash(slices.Index(cc.nodes, old))
		next := cc.leader()
		poll.Eventually(t, "the open overview to show the new leader", func() error {
			if got := watch.text("#leader"); got != next.ID() {
				return fmt.Errorf("leader %q, want %s", got, next.ID())
			}
			if got := watch.text("#members-table"); !strings.Contains(got, "not ready") {
				return fmt.Errorf("the dead node is not shown as not ready: %q", got)
			}
			return nil
		}, poll.Within(30*time.Second))
		watch.shot("overview-after-failover")
		b.noProblems()
	})
}

// TestConsoleSessionExpires signs in on a node whose sessions end after
// two idle seconds: the next page is the sign-in page.
func TestConsoleSessionExpires(t *testing.T) {
	b := newBrowser(t)
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("admin "+consoleAdminToken+" ops-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, _ := singleNode(t, func(c *config.Config) {
		c.Auth.AdminTokensFile = path
		c.HTTP.Console.SessionTTL, c.HTTP.Console.IdleTimeout = time.Minute, 2*time.Second
	})
	base := "http://" + n.HTTPAddr()
	tb := b.tab(t, "expiry", false)
	tb.signIn(base, consoleAdminToken)
	if got := tb.text("h1"); got != "Overview" {
		t.Fatalf("after sign-in: %q", got)
	}
	// Leave the console, so the browser sends nothing more, and ask with
	// its cookie, ignoring refreshed ones, until the node calls it idle.
	tb.run("leave", chromedp.Navigate("about:blank"))
	ck := tb.cookie(base)
	poll.Eventually(t, "the session to end after 2s idle", func() error {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/ui/policies", nil)
		req.AddCookie(ck)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/signin") {
			return fmt.Errorf("%d %s", resp.StatusCode, loc)
		}
		return nil
	}, poll.Within(20*time.Second))
	tb.open(base, "/ui/policies")
	if got := tb.text("h1"); got != "Sign in" {
		t.Fatalf("an idle session still shows %q", got)
	}
	b.noProblems()
}
