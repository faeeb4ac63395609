package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/policyd/policyd/internal/poll"
)

// onlyWithFeature are metric prefixes the alert rules may use that a node
// exposes only while the feature runs (documented in alerts.yml).
var onlyWithFeature = []string{"configmap_reload_"}

// TestPrometheusRulesUseExistingMetrics starts `policyd serve`, scrapes its
// /metrics, and checks deploy/prometheus: the rules parse, every alert has
// an expression, a severity and a summary, and every metric an expression
// names is exposed by the node (or only appears with its feature). With
// promtool on PATH it also runs `promtool check config`.
func TestPrometheusRulesUseExistingMetrics(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "--data-dir", filepath.Join(dir, "data"), "--node-id", "n1", "--bootstrap",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0", "--log-level", "info")
	addr := daemonHTTPAddr(t, d)
	waitReady(t, "http://"+addr)
	exposed := scrape(t, "http://"+addr+"/metrics")

	for _, name := range []string{"policyd_build_info", "proxy_state", "policyd_ready", "policyd_drift_reports", "policyd_raft_is_leader"} {
		if _, ok := exposed[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	want := builtInfo(t, policydBinary(t), "")
	if got := exposed["policyd_build_info"]; len(got) != 1 || got[0]["goversion"] != want.GoVersion || got[0]["version"] != want.Version || got[0]["commit"] != want.Commit {
		t.Errorf("policyd_build_info = %v, want the build's %+v", got, want)
	}

	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			t.Run(r.Alert, func(t *testing.T) {
				if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Fatalf("rule lacks alert, expr, severity or summary: %+v", r)
				}
				names := exprMetrics(r.Expr)
				if len(names) == 0 {
					t.Fatalf("no metric found in %q", r.Expr)
				}
				for _, m := range names {
					if _, ok := exposed[m]; ok || slices.ContainsFunc(onlyWithFeature, func(p string) bool { return strings.HasPrefix(m, p) }) {
						continue
					}
					t.Errorf("%s uses %s, which the node does not expose", r.Alert, m)
				}
			})
		}
	}
	// The brief's six signals, at least.
	for _, want := range []string{"PolicydNoLeader", "PolicydNodeNotReady", "PolicydNacksPending", "PolicydSidecarsDisconnected", "PolicydReloadErrors", "PolicydDriftDetected"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yml lacks %s", want)
		}
	}

	if promtool, err := exec.LookPath("promtool"); err == nil {
		out, err := exec.Command(promtool, "check", "config", filepath.Join(repoRoot, "deploy", "prometheus", "prometheus.yml")).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool check config: %v\n%s", err, out)
		}
	} else {
		t.Log("promtool not on PATH: rules checked by parsing only")
	}
}

// TestRaftMetricsPeerLabel runs a 2-node cluster of daemons and checks the
// leader's replication metrics: one metric per kind with the follower as
// the peer label, and no metric with a peer's ID in its name.
func TestRaftMetricsPeerLabel(t *testing.T) {
	start := func(id string, bootstrap bool) (http, raft string) {
		dir := t.TempDir()
		args := []string{"--data-dir", filepath.Join(dir, "data"), "--node-id", id,
			"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0", "--log-level", "info"}
		// serve's default is a single-node cluster: a node that joins must
		// say it does not bootstrap.
		args = append(args, "--bootstrap="+strconv.FormatBool(bootstrap))
		d := startDaemon(t, dir, args...)
		return daemonHTTPAddr(t, d), daemonAddr(t, d, "raft")
	}
	leader, _ := start("peerlabel-1", true)
	waitReady(t, "http://"+leader)
	follower, followerRaft := start("peerlabel-2", false)
	body := strings.NewReader(`{"id": "peerlabel-2", "raft_addr": "` + followerRaft + `"}`)
	resp, err := http.Post("http://"+leader+"/v1/cluster/join", "application/json", body) //nolint:noctx // a test against a local daemon
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("join: %d", resp.StatusCode)
	}
	waitReady(t, "http://"+follower)

	const heartbeat = "policyd_raft_replication_heartbeat"
	var exposed map[string][]map[string]string
	if poll.Until(context.Background(), 20*time.Second, poll.Holds(func() bool {
		exposed = scrape(t, "http://"+leader+"/metrics")
		return len(exposed[heartbeat]) > 0
	})) !=
		nil {
		var names []string
		for n := range exposed {
			if strings.Contains(n, "raft") {
				names = append(names, n)
			}
		}
		t.Fatalf("the leader exposes no %s; raft metrics: %v", heartbeat, names)
	}
	for _, name := range []string{heartbeat, "policyd_raft_replication_appendEntries_rpc", "policyd_raft_replication_appendEntries_logs"} {
		var peers []string
		for _, labels := range exposed[name] {
			peers = append(peers, labels["peer"])
		}
		if !slices.Contains(peers, "peerlabel-2") {
			t.Errorf("%s: peer labels %q, want peerlabel-2", name, peers)
		}
	}
	for name := range exposed {
		if strings.Contains(name, "peerlabel") {
			t.Errorf("metric %s carries a peer's ID in its name", name)
		}
	}
}

// daemonHTTPAddr waits for the daemon's "node started" line and returns
// its bound admin address.
func daemonHTTPAddr(t *testing.T, d *daemon) string {
	t.Helper()
	return daemonAddr(t, d, "http")
}

// daemonAddr returns the bound address of one listener (http, grpc, raft)
// from the daemon's "node started" line, waiting for it.
func daemonAddr(t *testing.T, d *daemon, listener string) string {
	t.Helper()
	re := regexp.MustCompile(`msg="node started".* ` + listener + `=(\S+)`)
	var addr string
	if poll.Until(context.Background(), 30*time.Second, poll.Holds(func() bool {
		if m := re.FindStringSubmatch(d.logs.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})) !=
		nil {
		t.Fatalf("no \"node started\" line:\n%s", d.logs)
	}
	return addr
}

// scrape returns the exposed metric families with the labels of their
// series.
func scrape(t *testing.T, url string) map[string][]map[string]string {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test against a local daemon
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string][]map[string]string{}
	for name, mf := range mfs {
		out[name] = nil
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[name] = append(out[name], labels)
		}
	}
	return out
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promNumbers  = regexp.MustCompile(`(^|[^a-zA-Z0-9_:])[0-9][0-9a-zA-Z_.]*`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true}
)

// exprMetrics returns the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges, grouping
// clauses and numbers (durations included) are removed, that are neither functions nor keywords.
func exprMetrics(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	e = promNumbers.ReplaceAllString(e, "$1 ")
	var out []string
	for _, m := range promIdent.FindAllStringSubmatch(e, -1) {
		if m[1] != "" || promKeywords[m[0]] {
			continue
		}
		out = append(out, m[0])
	}
	return out
}

func TestExprMetrics(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`max(policyd_raft_is_leader) < 1`, []string{"policyd_raft_is_leader"}},
		{`sum by (instance) (proxy_state{state="nacked"}) > 0`, []string{"proxy_state"}},
		{`sum(proxy_state) < 0.8 * sum(proxy_state offset 10m)`, []string{"proxy_state", "proxy_state"}},
		{`sum by (env) (increase(configmap_reload_errors_total[15m])) > 0`, []string{"configmap_reload_errors_total"}},
		{`a == 0 and on (job) b{x="and y"}`, []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, exprMetrics(tc.expr)); diff != "" {
				t.Errorf("exprMetrics (-want +got):\n%s", diff)
			}
		})
	}
}
