package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/decisions"
	"github.com/policyd/policyd/internal/loopback"
	"github.com/policyd/policyd/internal/poll"
)

// TestAuthzDecisionLogKill: `policyd authz --decision-log-dir` killed
// with SIGKILL loses at most the decisions of its last spill interval
// (one second): every decision answered before that is in the disk ring,
// once, in order. Started again, it ships the rest of the ring; and the
// node, killed with SIGKILL and its newest segment torn, still serves
// every record after a restart.
func TestAuthzDecisionLogKill(t *testing.T) {
	dir := t.TempDir()
	ports, err := loopback.FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	admin := "http://" + loopback.Addr(ports[0])
	env := []string{
		"POLICYD_HTTP_ADDR=" + loopback.Addr(ports[0]), "POLICYD_GRPC_ADDR=" + loopback.Addr(ports[1]),
		"POLICYD_RAFT_ADDR=" + loopback.Addr(ports[2]), "POLICYD_DATA_DIR=state", "POLICYD_NODE_ID=dlnode",
	}
	node := startDaemonEnv(t, dir, env)
	waitReady(t, admin)

	spool := filepath.Join(dir, "spool")
	httpAddr := loopback.Addr(ports[4])
	authzArgs := []string{"--servers", loopback.Addr(ports[1]), "--org", "acme",
		"--grpc-addr", loopback.Addr(ports[3]), "--http-addr", httpAddr,
		"--decision-log", "--decision-log-allow-rate", "1", "--decision-log-dir", spool}
	cmd, _, done := startAuthzProcess(t, authzArgs...)

	hc := &http.Client{Timeout: 5 * time.Second}
	base := "http://" + httpAddr
	if poll.Until(context.Background(), 20*time.Second, poll.Holds(func() bool {
		resp, err := hc.Get(base + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})) != nil {
		t.Fatal("authz /readyz never answered 200")
	}

	// Checks at about 250/s, within the SDK's rate cap (1,000/s), so that
	// a record missing is one the kill lost, for three spill intervals.
	const run, interval, slack = 3 * time.Second, time.Second, 500 * time.Millisecond
	tick := time.NewTicker(4 * time.Millisecond)
	defer tick.Stop()
	var answered []time.Time // by check
	for start := time.Now(); time.Since(start) < run; {
		<-tick.C
		body := fmt.Sprintf(`{"tool":"t%d","input":{"command":"ls"}}`, len(answered))
		resp, err := hc.Post(base+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"allowed":true`) {
			t.Fatalf("check %d: %d %s", len(answered), resp.StatusCode, b)
		}
		answered = append(answered, time.Now())
	}
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("a killed authz exited cleanly")
	}
	done <- nil // for the cleanup

	st, err := decisions.Open(filepath.Join(spool, "ring"), decisions.Config{FlushInterval: -1}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var got []string
	if err := st.Scan(time.Time{}, time.Time{}, func(r decisions.Record) bool {
		var rec client.DecisionRecord
		if err := json.Unmarshal(r.Data, &rec); err != nil {
			t.Errorf("record %q: %v", r.Data, err)
			return false
		}
		got = append(got, rec.Request.Tool)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	// The ring holds a prefix of the checks, in order.
	for i, tool := range got {
		if want := fmt.Sprintf("t%d", i); tool != want {
			t.Fatalf("record %d is %s, want %s: the ring is not the checks in order", i, tool, want)
		}
	}
	lost := answered[len(got):]
	t.Logf("%d checks, %d records on disk, %d lost to the kill", len(answered), len(got), len(lost))
	if len(lost) > 0 && killed.Sub(lost[0]) > interval+slack {
		t.Errorf("check %d, answered %v before the kill, is lost: more than the last interval (%v)", len(got), killed.Sub(lost[0]), interval)
	}
	if len(got) == 0 {
		t.Fatal("nothing on disk")
	}
	st.Close()

	// Started again on its ring, authz ships what the node did not take
	// before the kill: the node holds every record on disk, at least once
	// (a batch taken just before the kill, whose cursor was not yet
	// written, goes again).
	again, _, _ := startAuthzProcess(t, authzArgs...)
	var held map[string]int
	holdsRing := func() error {
		resp, err := hc.Get(admin + "/v1/decisions?limit=1000")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var page decisionsv1.Page
		if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
			return err
		}
		held = map[string]int{}
		for _, r := range page.Records {
			held[r.Request.Tool]++
		}
		for i := range got {
			if held[fmt.Sprintf("t%d", i)] == 0 {
				return fmt.Errorf("the node lacks t%d of %d records on disk", i, len(got))
			}
		}
		return nil
	}
	if err := poll.Until(context.Background(), 30*time.Second, holdsRing); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	dups := 0
	for _, n := range held {
		dups += n - 1
	}
	t.Logf("the node holds every record of the ring; %d sent twice", dups)

	// The node killed with SIGKILL, and its newest segment torn (half a
	// record written at the end, as a crash mid-write leaves it): it starts
	// again, cuts the torn tail off and still holds every record.
	if err := again.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	node.kill(t)
	segs, err := filepath.Glob(filepath.Join(dir, "state", "decisions", "*"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no decision segments under the node's data dir (%v)", err)
	}
	slices.Sort(segs)
	f, err := os.OpenFile(segs[len(segs)-1], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0, 0, 1, 0, 0xde, 0xad, 0xbe, 0xef, '{', '"'}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	startDaemonEnv(t, dir, env)
	waitReady(t, admin)
	if err := holdsRing(); err != nil {
		t.Fatalf("after the node's kill -9 and a torn tail: %v", err)
	}

	// The CLI reads them, and replays a draft denying tool t0 over them.
	out := cli(t, dir, "--server", admin, "decisions", "list", "--org", "acme", "--limit", "3")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) < 4 || !strings.Contains(lines[0], "RESULT") {
		t.Errorf("decisions list:\n%s", out)
	}
	draft := `{"name":"acme.deny-t0","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"t0","action":"deny"}}`
	out, err = cliInput(t, dir, draft, "--server", admin, "-o", "json", "policy", "impact", "-f", "-", "--since", "1h")
	if err != nil {
		t.Fatalf("policy impact: %v\n%s", err, out)
	}
	var rep decisionsv1.ImpactReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("policy impact -o json: %v\n%s", err, out)
	}
	if rep.Totals.AllowToDeny != uint64(held["t0"]) || rep.Totals.Evaluated < uint64(len(got)) {
		t.Errorf("impact of denying t0: %+v, want %d allow→deny among at least %d", rep.Totals, held["t0"], len(got))
	}
}
