package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/store"
)

var restoredRE = regexp.MustCompile(`applied index (\d+) \(the backup's (\d+) \+ \d+, a new history\), digest ([0-9a-f]{64})`)

var savedRE = regexp.MustCompile(`saved snapshot at applied index (\d+) \(digest ([0-9a-f]{64}), \d+ bytes\)`)

// TestSnapshotSaveRestore: a backup saved from a follower holds the
// cluster's exact state; after the whole cluster is lost (killed, data
// wiped), restoring the backup on every node brings back that state with
// the same digest, and the restored cluster takes new writes whose Raft
// indexes follow the backup's. A single fresh node restored from the same
// file serves the same policies.
func TestSnapshotSaveRestore(t *testing.T) {
	c := newProcCluster(t, 3)
	leader := c.leader(0, 1, 2)
	follower := (leader + 1) % 3
	for i, name := range []string{"acme.one", "acme.two", "acme.three", "acme.gone"} {
		c.apply(i%3, name)
	}
	c.cli(0, "policy", "delete", "acme.gone")
	if out, err := cliInput(t, c.dir, `{"id": "alice", "org": "acme", "team": "red"}`, "--server", c.http[1], "employee", "apply", "-f", "-"); err != nil {
		t.Fatalf("employee apply: %v\n%s", err, out)
	}
	live := c.converged(0, 1, 2)
	wantPolicies, err := c.policyNames(0)
	if err != nil {
		t.Fatal(err)
	}

	backup := filepath.Join(c.dir, "backup.db")
	out := c.cli(follower, "snapshot", "save", backup)
	m := savedRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("save output %q", out)
	}
	if m[2] != live {
		t.Fatalf("backup digest %s, live cluster %s", m[2], live)
	}
	if fi, err := os.Stat(backup); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v %v (it holds every employee; want mode 0600)", fi, err)
	}
	if left, _ := filepath.Glob(filepath.Join(c.dir, ".backup.db.*.part")); len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}

	// A write the backup does not hold: a sidecar that saw it resumes
	// from its index, which the restored cluster has not reached.
	var lostIndex uint64
	if _, err := fmt.Sscanf(c.apply(0, "acme.lost"), "policy/acme.lost applied (revision %d)", &lostIndex); err != nil {
		t.Fatal(err)
	}

	// A running node's data directory is refused.
	if out, err := cliErr(t, c.dir, "snapshot", "restore", backup, "--config", c.configPath(0), "--force"); err == nil || !strings.Contains(out, "locked by a running process") {
		t.Fatalf("restore onto a running node: %v %s", err, out)
	}

	// Disaster: every node dies and its disk is lost.
	for i := range 3 {
		c.daemons[i].kill(t)
		if err := os.RemoveAll(c.dataDir(i)); err != nil {
			t.Fatal(err)
		}
	}
	backupIndex, _ := strconv.ParseUint(m[1], 10, 64)
	restoredIndex := backupIndex + raftnode.RestoreIndexGap
	var restored string
	for i := range 3 {
		args := []string{"snapshot", "restore", backup, "--config", c.configPath(i)}
		if i == 2 {
			args = append(args, "-o", "json") // the same, as JSON
		}
		out := cli(t, c.dir, args...)
		r := restoredRE.FindStringSubmatch(out)
		if i == 2 {
			var j struct {
				Applied uint64 `json:"applied_index"`
				Backup  uint64 `json:"backup_index"`
				Digest  string `json:"digest"`
			}
			// cli gives stdout and stderr together; raft logs to stderr.
			if err := json.Unmarshal([]byte(out[max(strings.Index(out, "{"), 0):]), &j); err != nil {
				t.Fatalf("restore -o json on %s: %v\n%s", c.ids[i], err, out)
			}
			r = []string{"", strconv.FormatUint(j.Applied, 10), strconv.FormatUint(j.Backup, 10), j.Digest}
		}
		if r == nil || r[1] != strconv.FormatUint(restoredIndex, 10) || r[2] != m[1] || (restored != "" && r[3] != restored) {
			t.Fatalf("restore on %s: %s; want applied index %d from the backup's %s, and one digest on every node", c.ids[i], out, restoredIndex, m[1])
		}
		restored = r[3]
	}
	for i := range 3 {
		c.start(i)
	}
	for i := range 3 {
		waitReady(t, c.http[i])
	}
	c.leader(0, 1, 2)
	if got := c.converged(0, 1, 2); got != restored {
		t.Fatalf("restored cluster digest %s, restore printed %s", got, restored)
	}
	got, err := c.policyNames(2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, wantPolicies) {
		t.Fatalf("restored policies %v, want %v", got, wantPolicies)
	}
	// A WebSocket sidecar resuming from the lost write's index gets the
	// restored set as init: its own set belongs to a history that is gone.
	// (A node merely behind it would refuse it instead.)
	if init := feedResume(t, c.http[0], "alice", lostIndex); init.Type != feedv1.TypeInit || slices.ContainsFunc(init.Policies, func(p feedv1.Policy) bool { return p.Name == "acme.lost" }) ||
		!slices.ContainsFunc(init.Policies, func(p feedv1.Policy) bool { return p.Name == "acme.one" }) {
		t.Fatalf("resume from %d after the restore: %+v, want init with the restored policies", lostIndex, init)
	}
	// New entries follow the restored index: were they numbered from 1, the
	// state would skip them as already applied.
	applied := c.apply(2, "acme.after-restore")
	var rev uint64
	if _, err := fmt.Sscanf(applied, "policy/acme.after-restore applied (revision %d)", &rev); err != nil || rev <= restoredIndex {
		t.Fatalf("write after restore: %q (%v); want a revision above the restored index %d", applied, err, restoredIndex)
	}
	poll.Eventually(t, "the new write on every node", func() error {
		for i := range 3 {
			if _, err := getRevision(c.http[i] + "/v1/policies/acme.after-restore"); err != nil {
				return err
			}
		}
		return nil
	}, poll.Within(20*time.Second), poll.Every(100*time.Millisecond))

	// Now that the new history has passed the lost write's index, the same
	// resume still gets init: a replay from there would add the new
	// history's changes to a set that holds acme.lost.
	if init := feedResume(t, c.http[1], "alice", lostIndex); init.Type != feedv1.TypeInit || slices.ContainsFunc(init.Policies, func(p feedv1.Policy) bool { return p.Name == "acme.lost" }) ||
		!slices.ContainsFunc(init.Policies, func(p feedv1.Policy) bool { return p.Name == "acme.after-restore" }) {
		t.Fatalf("resume from %d after new writes: %+v, want init with the restored policies and the new one", lostIndex, init)
	}
	for i := range 3 {
		c.daemons[i].interrupt(t)
	}

	// The other route: one fresh node restored alone (others would join it).
	ports := freePorts(t, 3)
	flags := []string{"--node-id", "solo", "--data-dir", "data/solo",
		"--http-addr", "127.0.0.1:" + strconv.Itoa(ports[0]), "--grpc-addr", "127.0.0.1:" + strconv.Itoa(ports[1]), "--raft-addr", "127.0.0.1:" + strconv.Itoa(ports[2])}
	if out := cli(t, c.dir, append([]string{"snapshot", "restore", backup}, flags...)...); !strings.Contains(out, "new cluster: solo=127.0.0.1:"+strconv.Itoa(ports[2])) {
		t.Fatalf("single-node restore: %s", out)
	}
	solo := startDaemon(t, c.dir, flags...)
	base := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	waitReady(t, base)
	soloCluster := &procCluster{t: t, dir: c.dir, http: []string{base}}
	got, err = soloCluster.policyNames(0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, wantPolicies) {
		t.Fatalf("single-node restore policies %v, want %v", got, wantPolicies)
	}
	solo.interrupt(t)
}

// TestSnapshotRestoreRefuses: a file that is not a policyd state database,
// or a data directory that already holds state, is refused and left as it
// was.
func TestSnapshotRestoreRefuses(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, []byte(rand.Text()+rand.Text()), 0o600); err != nil {
		t.Fatal(err)
	}
	existing := filepath.Join(dir, "existing")
	if err := os.MkdirAll(existing, 0o700); err != nil {
		t.Fatal(err)
	}
	stateBytes := []byte("not touched")
	if err := os.WriteFile(filepath.Join(existing, "state.db"), stateBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	// A valid backup: a state database at applied index 1.
	valid := filepath.Join(dir, "valid.db")
	st, err := store.Open(valid, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ApplyBatch(1, func(*store.Batch) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "fresh")
	tests := []struct {
		name    string
		args    []string
		mention string
	}{
		{"not a state db", []string{"snapshot", "restore", junk, "--node-id", "n1", "--data-dir", fresh}, "junk.db"},
		{"missing file", []string{"snapshot", "restore", filepath.Join(dir, "nope.db"), "--node-id", "n1", "--data-dir", fresh}, "nope.db"},
		{"no node id", []string{"snapshot", "restore", valid, "--data-dir", fresh}, "node_id"},
		{"no file", []string{"snapshot", "restore"}, "arg"},
		{"existing state", []string{"snapshot", "restore", valid, "--node-id", "n1", "--data-dir", existing}, "--force"},
		{"save without server", []string{"--server", "http://127.0.0.1:1", "snapshot", "save", filepath.Join(dir, "b.db")}, "127.0.0.1:1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := cliErr(t, dir, tc.args...)
			if err == nil || !strings.Contains(out, tc.mention) || strings.Contains(out, "panic") {
				t.Fatalf("err=%v, output %q should mention %q", err, out, tc.mention)
			}
			if _, err := os.Stat(fresh); err == nil {
				t.Fatal("a refused restore created the data directory")
			}
			if b, err := os.ReadFile(filepath.Join(existing, "state.db")); err != nil || string(b) != string(stateBytes) {
				t.Fatalf("existing state changed: %q %v", b, err)
			}
		})
	}

	// --force moves the old state aside rather than deleting it.
	out := cli(t, dir, "snapshot", "restore", valid, "--node-id", "n1", "--data-dir", existing, "--force")
	aside, _ := filepath.Glob(filepath.Join(existing, "pre-restore-*", "state.db"))
	if len(aside) != 1 || !strings.Contains(out, "previous state moved to") {
		t.Fatalf("--force: %s; moved files %v", out, aside)
	}
	if b, err := os.ReadFile(aside[0]); err != nil || string(b) != string(stateBytes) {
		t.Fatalf("moved state: %q %v", b, err)
	}
	if info, err := store.Inspect(filepath.Join(existing, "state.db")); err != nil || info.AppliedIndex != 1+raftnode.RestoreIndexGap {
		t.Fatalf("restored state: %+v %v", info, err)
	}
}

// feedResume opens the WebSocket feed of the node at base as employee
// (auth.mode none) with ?since=since and returns the first message.
func feedResume(t *testing.T, base, employee string, since uint64) feedv1.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(base, "http") + feedv1.Path + "?" + url.Values{
		feedv1.QueryEmployee: {employee}, feedv1.QuerySince: {strconv.FormatUint(since, 10)},
	}.Encode()
	c, _, err := websocket.Dial(ctx, u, nil) //nolint:bodyclose // Dial owns the body
	if err != nil {
		t.Fatalf("feed %s: %v", u, err)
	}
	defer c.CloseNow() //nolint:errcheck // the test is done with it
	var m feedv1.Message
	if err := wsjson.Read(ctx, c, &m); err != nil {
		t.Fatalf("feed %s: first message: %v", u, err)
	}
	return m
}
