package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/third_party/raft"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/store"
)

// TestWriteThroughFollowerReadEverywhere: a write sent to a follower is
// forwarded, acknowledged with its revision, and readable at that revision
// on every node; each node registered its addresses; digests agree.
func TestWriteThroughFollowerReadEverywhere(t *testing.T) {
	c := newCluster(t, 3, nil)
	f := c.follower()
	p := apiFor(t, f).putPolicy("acme.deny-shell", "acme", "no shell")
	if p.Revision == 0 {
		t.Fatalf("revision = 0, want the commit index")
	}
	for _, n := range c.running() {
		if err := n.store.WaitApplied(t.Context(), p.Revision); err != nil {
			t.Fatal(err)
		}
		r := apiFor(t, n).do(http.MethodGet, "/v1/policies/acme.deny-shell", nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("%s: GET = %d %s", n.ID(), r.status, r.body)
		}
		var got policy.Policy
		r.decode(t, &got)
		if got.Revision != p.Revision {
			t.Errorf("%s: revision %d, want %d", n.ID(), got.Revision, p.Revision)
		}
		if etag, want := r.header.Get("ETag"), strconv.Quote(strconv.FormatUint(p.Revision, 10)); etag != want {
			t.Errorf("%s: ETag %s, want %s", n.ID(), etag, want)
		}
	}
	c.waitConverged()
	var st struct {
		Members []struct {
			ID       string `json:"id"`
			HTTPAddr string `json:"http_addr"`
			GRPCAddr string `json:"grpc_addr"`
		} `json:"members"`
	}
	st2 := apiFor(t, f).do(http.MethodGet, "/v1/cluster", nil, nil)
	if err := json.Unmarshal(st2.body, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 3 {
		t.Fatalf("members = %d, want 3: %s", len(st.Members), st2.body)
	}
	byID := map[string]*Node{}
	for _, n := range c.running() {
		byID[n.ID()] = n
	}
	for _, m := range st.Members {
		n := byID[m.ID]
		if n == nil || m.HTTPAddr != n.HTTPAddr() || m.GRPCAddr != n.GRPCAddr() {
			t.Errorf("member %+v does not match the node's bound addresses", m)
		}
	}
}

// TestFailoverCatchUpAndSnapshotInstall: stopping the leader elects a new one
// within seconds, writes continue, no acknowledged write is lost; the old
// leader catches up when restarted, including by a snapshot install when the
// log it needs has been compacted away; all digests end equal.
func TestFailoverCatchUpAndSnapshotInstall(t *testing.T) {
	c := newCluster(t, 3, func(cfg *config.Config) {
		cfg.Raft.SnapshotThreshold = 32
		cfg.Raft.TrailingLogs = 8
		cfg.Raft.SnapshotInterval = 50 * time.Millisecond
	})

	acked := map[string]uint64{}
	write := func(n *Node, i int) {
		name := fmt.Sprintf("p-%03d", i)
		acked[name] = apiFor(t, n).putPolicy(name, "acme", "r").Revision
	}
	for i := range 20 {
		write(c.nodes[i%3], i)
	}

	old := c.leader()
	oldIdx := indexOf(c, old)
	stoppedAt := old.store.AppliedIndex()
	c.crash(oldIdx)
	start := time.Now()
	// Writes during the election either wait for the new leader or fail
	// with 503 (retry later); never anything else, and none acknowledged
	// is lost (checked below).
	for i, n := range c.running() {
		name := fmt.Sprintf("during-election-%d", i)
		r := apiFor(t, n).do(http.MethodPut, "/v1/policies/"+name, toolPolicy(name, "acme", "r"), nil)
		switch r.status {
		case http.StatusOK:
			var p policy.Policy
			r.decode(t, &p)
			acked[name] = p.Revision
		case http.StatusServiceUnavailable:
			t.Logf("write during election: 503 %s", r.body)
		default:
			t.Fatalf("write during election: %d %s", r.status, r.body)
		}
	}
	newLeader := c.leader()
	t.Logf("new leader %s after %v", newLeader.ID(), time.Since(start))
	if newLeader == old {
		t.Fatal("the stopped node still leads")
	}

	// Writes continue, through both the new leader and the other survivor.
	for i := 20; i < 120; i++ {
		write(c.running()[i%2], i)
	}
	// Force compaction past what the stopped node has, so it must install a
	// snapshot.
	if err := newLeader.consensus.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	first, err := newLeader.consensus.LogStore().FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	if first <= stoppedAt+1 {
		t.Fatalf("log still starts at %d; the restarted node (at %d) could replay it", first, stoppedAt)
	}

	for _, n := range c.running() {
		assertAcked(t, n, acked)
	}
	restarted := c.restart(oldIdx)
	c.waitConverged()
	assertAcked(t, restarted, acked)
	if got := restarted.store.AppliedIndex(); got < first {
		t.Fatalf("restarted node applied %d, below the leader's first log index %d", got, first)
	}
}

func indexOf(c *cluster, n *Node) int {
	for i, m := range c.nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// assertAcked checks that node n has every acknowledged write, at a revision
// at least the acknowledged one.
func assertAcked(t *testing.T, n *Node, acked map[string]uint64) {
	t.Helper()
	maxRev := uint64(0)
	for _, r := range acked {
		maxRev = max(maxRev, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.store.WaitApplied(ctx, maxRev); err != nil {
		t.Fatalf("%s: %v", n.ID(), err)
	}
	for name, rev := range acked {
		p, err := n.store.GetPolicy(name)
		if err != nil {
			t.Fatalf("%s: acknowledged write %s (revision %d) lost: %v", n.ID(), name, rev, err)
		}
		if p.Revision < rev {
			t.Fatalf("%s: %s at revision %d, acknowledged %d", n.ID(), name, p.Revision, rev)
		}
	}
}

// TestCompareAndSet covers If-Match on PUT and DELETE.
func TestCompareAndSet(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.follower())
	body := toolPolicy("cas", "acme", "v1")
	first := a.do(http.MethodPut, "/v1/policies/cas", body, map[string]string{"If-Match": "0"})
	if first.status != http.StatusOK {
		t.Fatalf("create-only PUT = %d %s", first.status, first.body)
	}
	var p policy.Policy
	first.decode(t, &p)

	tests := []struct {
		name, method, ifMatch string
		want                  int
	}{
		{"create-only on existing", http.MethodPut, "0", http.StatusConflict},
		{"stale revision", http.MethodPut, strconv.FormatUint(p.Revision-1, 10), http.StatusConflict},
		{"future revision", http.MethodPut, strconv.FormatUint(p.Revision+100, 10), http.StatusConflict},
		{"malformed", http.MethodPut, "abc", http.StatusBadRequest},
		{"stale delete", http.MethodDelete, strconv.FormatUint(p.Revision+1, 10), http.StatusConflict},
		{"current revision, quoted", http.MethodPut, strconv.Quote(strconv.FormatUint(p.Revision, 10)), http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b []byte
			if tc.method == http.MethodPut {
				b = toolPolicy("cas", "acme", tc.name)
			}
			r := a.do(tc.method, "/v1/policies/cas", b, map[string]string{"If-Match": tc.ifMatch})
			if r.status != tc.want {
				t.Fatalf("status %d, want %d: %s", r.status, tc.want, r.body)
			}
			if tc.want != http.StatusOK {
				r.errCode(t)
			}
		})
	}
	// Only the last PUT changed anything.
	got, err := c.leader().store.GetPolicy("cas")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got.Spec), "current revision") {
		t.Errorf("spec = %s, want the only successful CAS write", got.Spec)
	}
}

// TestConsistentReadAfterWriteElsewhere: a write acknowledged by one node is
// visible to a ?consistent=true read on another node immediately after.
func TestConsistentReadAfterWriteElsewhere(t *testing.T) {
	c := newCluster(t, 3, nil)
	nodes := c.running()
	for i := range 30 {
		w, r := apiFor(t, nodes[i%3]), apiFor(t, nodes[(i+1)%3])
		name := fmt.Sprintf("lin-%d", i)
		p := w.putPolicy(name, "acme", "x")
		got := r.do(http.MethodGet, "/v1/policies/"+name+"?consistent=true", nil, nil)
		if got.status != http.StatusOK {
			t.Fatalf("consistent GET on %s after write on %s: %d %s", nodes[(i+1)%3].ID(), nodes[i%3].ID(), got.status, got.body)
		}
		var gp policy.Policy
		got.decode(t, &gp)
		if gp.Revision != p.Revision {
			t.Fatalf("read revision %d, wrote %d", gp.Revision, p.Revision)
		}
	}
	bad := apiFor(t, nodes[0]).do(http.MethodGet, "/v1/policies?consistent=maybe", nil, nil)
	if bad.status != http.StatusBadRequest {
		t.Fatalf("consistent=maybe: %d", bad.status)
	}
}

// TestEventsListAndWatch: the event log lists and streams events in Raft
// order with filters; a watch started on a follower sees later writes.
func TestEventsListAndWatch(t *testing.T) {
	c := newCluster(t, 3, nil)
	f := c.follower()
	a := apiFor(t, f)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := a.client.Stream(ctx, "/v1/events/watch?after=0") //nolint:bodyclose // closed by the deferred Close below; the linter misses it across the goroutine
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events := make(chan store.Event, 100)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var ev store.Event
				if json.Unmarshal([]byte(data), &ev) == nil {
					events <- ev
				}
			}
		}
	}()

	a.putPolicy("a", "acme", "1")
	emp := a.do(http.MethodPut, "/v1/employees/alice", []byte(`{"org":"acme","team":"red","status":"active"}`), nil)
	if emp.status != http.StatusOK {
		t.Fatalf("PUT employee: %d %s", emp.status, emp.body)
	}
	a.putPolicy("a", "globex", "2") // moves org
	if r := a.do(http.MethodDelete, "/v1/policies/a", nil, nil); r.status != http.StatusOK {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}

	type ev struct {
		Type   store.EntityType
		Org    string
		Action store.Action
		ID     string
	}
	want := []ev{
		{store.EntityPolicy, "acme", store.ActionCreate, "a"},
		{store.EntityEmployee, "acme", store.ActionCreate, "alice"},
		{store.EntityPolicy, "globex", store.ActionUpdate, "a"},
		{store.EntityPolicy, "globex", store.ActionDelete, "a"},
	}
	var last uint64
	for i, w := range want {
		select {
		case got := <-events:
			if g := (ev{got.EntityType, got.Org, got.Action, got.EntityID}); g != w {
				t.Fatalf("watch event %d = %+v, want %+v", i, g, w)
			}
			if got.ID <= last {
				t.Fatalf("event ids not increasing: %d after %d", got.ID, last)
			}
			last = got.ID
		case <-time.After(10 * time.Second):
			t.Fatalf("watch: event %d never arrived", i)
		}
	}

	tests := []struct {
		query string
		want  int
	}{
		{"", 4},
		{"?type=policy", 3},
		{"?type=employee", 1},
		{"?org=acme", 2},
		{"?org=globex&type=policy", 2},
		{"?limit=1", 1},
		{fmt.Sprintf("?after=%d", last-1), 1},
	}
	for _, tc := range tests {
		t.Run("list"+tc.query, func(t *testing.T) {
			r := a.do(http.MethodGet, "/v1/events"+tc.query, nil, nil)
			var page store.EventPage
			r.decode(t, &page)
			if len(page.Events) != tc.want {
				t.Fatalf("%d events, want %d: %s", len(page.Events), tc.want, r.body)
			}
		})
	}
	for _, q := range []string{"?type=nope", "?after=-1", "?limit=abc", "?limit=5000"} {
		if r := a.do(http.MethodGet, "/v1/events"+q, nil, nil); r.status != http.StatusBadRequest {
			t.Errorf("GET /v1/events%s = %d, want 400", q, r.status)
		}
	}
}

// TestEventRetention: the leader prunes events older than the retention on
// every node, and a later event is kept.
func TestEventRetention(t *testing.T) {
	c := newCluster(t, 3, func(cfg *config.Config) {
		cfg.Events.Retention = 500 * time.Millisecond
		cfg.Events.CleanupInterval = 50 * time.Millisecond
	})
	a := apiFor(t, c.leader())
	for i := range 5 {
		a.putPolicy(fmt.Sprintf("old-%d", i), "acme", "x")
	}
	poll.Eventually(t, "old events pruned on every node", func() error {
		for _, n := range c.running() {
			page, err := n.store.ListEvents(store.EventFilter{})
			if err != nil {
				return err
			}
			if len(page.Events) != 0 || page.PrunedThrough == 0 {
				return fmt.Errorf("%s: %d events left, pruned through %d", n.ID(), len(page.Events), page.PrunedThrough)
			}
		}
		return nil
	}, poll.Within(15*time.Second))

	p := a.putPolicy("fresh", "acme", "x")
	page, err := c.leader().store.ListEvents(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) == 0 || page.Events[len(page.Events)-1].ID != p.Revision {
		t.Fatalf("fresh event missing: %+v", page.Events)
	}
	// Policies themselves are not subject to retention.
	if _, err := c.leader().store.GetPolicy("old-0"); err != nil {
		t.Fatal(err)
	}
	c.waitConverged()
}

// TestNoLeaderIs503: with quorum lost, a write fails fast with 503 and
// Retry-After, and nothing is stored.
func TestNoLeaderIs503(t *testing.T) {
	c := newCluster(t, 3, nil)
	survivor := c.follower()
	for i, n := range c.nodes {
		if n != survivor {
			c.stop(i)
		}
	}
	poll.Eventually(t, "the survivor to lose its leader", func() error {
		if _, id := survivor.consensus.Raft().LeaderWithID(); id != "" {
			return fmt.Errorf("still sees leader %s", id)
		}
		return nil
	}, poll.Within(10*time.Second))

	a := apiFor(t, survivor)
	r := a.do(http.MethodPut, "/v1/policies/lost", toolPolicy("lost", "acme", "x"), nil)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("PUT without quorum = %d %s, want 503", r.status, r.body)
	}
	if r.errCode(t) != "unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("want code unavailable and Retry-After, got %s %v", r.body, r.header)
	}
	if r := a.do(http.MethodGet, "/readyz", nil, nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("readyz without leader = %d", r.status)
	}
	if r := a.do(http.MethodGet, "/healthz", nil, nil); r.status != http.StatusOK {
		t.Fatalf("healthz = %d", r.status)
	}
	if _, err := survivor.store.GetPolicy("lost"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("policy stored without quorum: %v", err)
	}
}

// TestMembershipRemoveAndJoin: removing a node takes it out of the Raft
// configuration and the member records; the cluster keeps serving writes;
// joining is idempotent and rejects a conflicting address.
func TestMembershipRemoveAndJoin(t *testing.T) {
	c := newCluster(t, 3, nil)
	victim := c.follower()
	a := apiFor(t, c.follower())
	if victim.HTTPAddr() == strings.TrimPrefix(a.base, "http://") {
		a = apiFor(t, c.leader())
	}
	r := a.do(http.MethodDelete, "/v1/cluster/members/"+victim.ID(), nil, nil)
	if r.status != http.StatusOK {
		t.Fatalf("remove: %d %s", r.status, r.body)
	}
	leader := c.leader()
	poll.Eventually(t, "member record removed", func() error {
		if _, err := leader.store.Member(victim.ID()); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("member %s still recorded (%w)", victim.ID(), err)
		}
		return nil
	}, poll.Within(10*time.Second))

	if leader.inConfiguration(victim.ID()) {
		t.Fatal("removed node still in the raft configuration")
	}
	apiFor(t, leader).putPolicy("after-remove", "acme", "x")

	again := a.do(http.MethodDelete, "/v1/cluster/members/"+victim.ID(), nil, nil)
	if again.status != http.StatusNotFound {
		t.Fatalf("second remove = %d %s, want 404", again.status, again.body)
	}

	joins := []struct {
		name, body string
		want       int
	}{
		{"same id and address again", fmt.Sprintf(`{"id":%q,"raft_addr":%q}`, leader.ID(), leader.RaftAddr()), http.StatusOK},
		{"address taken by another id", fmt.Sprintf(`{"id":"intruder","raft_addr":%q}`, leader.RaftAddr()), http.StatusConflict},
		{"bad id", `{"id":"../x","raft_addr":"127.0.0.1:1"}`, http.StatusBadRequest},
		{"bad address", `{"id":"n9","raft_addr":"nope"}`, http.StatusBadRequest},
		{"unknown field", `{"id":"n9","raft_addr":"127.0.0.1:1","x":1}`, http.StatusBadRequest},
		{"missing fields", `{}`, http.StatusBadRequest},
	}
	for _, tc := range joins {
		t.Run(tc.name, func(t *testing.T) {
			r := a.do(http.MethodPost, "/v1/cluster/join", []byte(tc.body), nil)
			if r.status != tc.want {
				t.Fatalf("join = %d %s, want %d", r.status, r.body, tc.want)
			}
		})
	}
}

// TestConcurrentWritesAllAcknowledgedPresent: many concurrent writers through
// every node; each acknowledged revision is unique and present everywhere.
func TestConcurrentWritesAllAcknowledgedPresent(t *testing.T) {
	c := newCluster(t, 3, nil)
	var mu sync.Mutex
	acked := map[string]uint64{}
	revs := map[uint64]bool{}
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := apiFor(t, c.nodes[w%3])
			for i := range 10 {
				name := fmt.Sprintf("w%d-%d", w, i)
				r := a.do(http.MethodPut, "/v1/policies/"+name, toolPolicy(name, "acme", "x"), nil)
				if r.status != http.StatusOK {
					t.Errorf("PUT %s: %d %s", name, r.status, r.body)
					return
				}
				var p policy.Policy
				if err := json.Unmarshal(r.body, &p); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked[name] = p.Revision
				if revs[p.Revision] {
					t.Errorf("revision %d acknowledged twice", p.Revision)
				}
				revs[p.Revision] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, n := range c.running() {
		assertAcked(t, n, acked)
	}
	c.waitConverged()
}

// TestLeaderTasksFollowLeadership: a leader task runs on the leader only, is
// stopped when leadership moves, and never runs twice at once on one node.
func TestLeaderTasksFollowLeadership(t *testing.T) {
	var mu sync.Mutex
	running := map[string]int{}
	overlap := false
	probe := func(n *Node) {
		n.AddLeaderTask(raftnode.LeaderTask{Name: "probe", Run: func(ctx context.Context) {
			mu.Lock()
			running[n.ID()]++
			overlap = overlap || running[n.ID()] > 1
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			running[n.ID()]--
			mu.Unlock()
		}})
	}
	c := newCluster(t, 3, nil, probe)
	onlyOnLeader := func() error {
		l := c.leader()
		mu.Lock()
		defer mu.Unlock()
		for id, k := range running {
			if want := map[bool]int{true: 1, false: 0}[id == l.ID()]; k != want {
				return fmt.Errorf("probe running %d times on %s (leader %s)", k, id, l.ID())
			}
		}
		return nil
	}
	poll.Eventually(t, "probe on the first leader only", onlyOnLeader, poll.Within(10*time.Second))
	for range 2 {
		old := c.leader()
		if err := old.consensus.Raft().LeadershipTransfer().Error(); err != nil {
			t.Fatalf("transfer: %v", err)
		}
		poll.Eventually(t, "leadership to move", func() error {
			if c.leader() == old {
				return fmt.Errorf("%s still leads", old.ID())
			}
			return nil
		}, poll.Within(10*time.Second))

		poll.Eventually(t, "probe on the new leader only", onlyOnLeader, poll.Within(10*time.Second))
	}
	mu.Lock()
	defer mu.Unlock()
	if overlap {
		t.Fatal("a node ran two terms' tasks at once")
	}
}

// TestApplicabilityAndPolicySetVersion: GET /v1/policies for an identity
// returns global + org + team + own policies, with a policy-set version that
// is the same on every replica and changes only when an applicable policy
// changes.
func TestApplicabilityAndPolicySetVersion(t *testing.T) {
	c := newCluster(t, 3, nil)
	a := apiFor(t, c.leader())
	put := func(name string, scope policy.Scope) uint64 {
		b, _ := json.Marshal(map[string]any{"name": name, "kind": "ToolPolicy", "scope": scope,
			"spec": map[string]any{"tool_name": "Bash", "action": "deny"}})
		r := a.do(http.MethodPut, "/v1/policies/"+name, b, nil)
		if r.status != http.StatusOK {
			t.Fatalf("PUT %s: %d %s", name, r.status, r.body)
		}
		var p policy.Policy
		r.decode(t, &p)
		return p.Revision
	}
	put("global", policy.Scope{})
	put("acme", policy.Scope{Org: "acme"})
	put("acme.red", policy.Scope{Org: "acme", Team: "red"})
	put("acme.blue", policy.Scope{Org: "acme", Team: "blue"})
	put("acme.alice", policy.Scope{Org: "acme", Employee: "alice"})
	last := put("globex", policy.Scope{Org: "globex"})

	const query = "/v1/policies?org=acme&team=red&employee=alice"
	list := func(n *Node) (names []string, version string) {
		if err := n.store.WaitApplied(t.Context(), last); err != nil {
			t.Fatal(err)
		}
		var pl struct {
			Policies []policy.Policy `json:"policies"`
			Version  string          `json:"version"`
		}
		apiFor(t, n).do(http.MethodGet, query, nil, nil).decode(t, &pl)
		for _, p := range pl.Policies {
			names = append(names, p.Name)
		}
		return names, pl.Version
	}
	want := []string{"acme", "acme.alice", "acme.red", "global"}
	var version string
	for _, n := range c.running() {
		names, v := list(n)
		if fmt.Sprint(names) != fmt.Sprint(want) {
			t.Fatalf("%s: applicable %v, want %v", n.ID(), names, want)
		}
		if len(v) != 64 || (version != "" && v != version) {
			t.Fatalf("%s: version %q, another replica has %q", n.ID(), v, version)
		}
		version = v
	}
	last = put("globex", policy.Scope{Org: "globex"}) // not applicable
	if _, v := list(c.leader()); v != version {
		t.Fatal("version changed when a policy of another org changed")
	}
	last = put("acme.red", policy.Scope{Org: "acme", Team: "red"}) // applicable: new revision
	if _, v := list(c.follower()); v == version {
		t.Fatal("version unchanged after an applicable policy changed")
	}
}

// TestRemoveTheLeader: removing the current leader through a follower elects
// a new leader among the rest, forgets the old one's addresses, and writes
// continue.
func TestRemoveTheLeader(t *testing.T) {
	c := newCluster(t, 3, nil)
	old := c.leader()
	f := c.follower()
	r := apiFor(t, f).do(http.MethodDelete, "/v1/cluster/members/"+old.ID(), nil, nil)
	if r.status != http.StatusOK {
		t.Fatalf("remove leader: %d %s", r.status, r.body)
	}
	var leader *Node
	poll.Eventually(t, "a new leader without the old one", func() error {
		for _, n := range c.running() {
			if n != old && n.IsLeader() {
				leader = n
				return nil
			}
		}
		return errors.New("no new leader")
	}, poll.Within(10*time.Second))

	poll.Eventually(t, "old leader's record forgotten", func() error {
		if _, err := leader.store.Member(old.ID()); err == nil {
			return errors.New("still recorded")
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if leader.inConfiguration(old.ID()) {
			return errors.New("still in the configuration")
		}
		return nil
	}, poll.Within(10*time.Second))

	apiFor(t, f).putPolicy("after-leader-removed", "acme", "x")
}

// TestNewLeaderForgetsRemovedMembers: a member record left behind by a node
// that is no longer in the Raft configuration (here removed from Raft
// directly, as when a leader removes itself and re-registers in between) is
// deleted by the next leader.
func TestNewLeaderForgetsRemovedMembers(t *testing.T) {
	c := newCluster(t, 3, nil)
	old := c.leader()
	gone := c.follower()
	if err := old.consensus.Raft().RemoveServer(raft.ServerID(gone.ID()), 0, 5*time.Second).Error(); err != nil {
		t.Fatalf("remove %s from raft: %v", gone.ID(), err)
	}
	if _, err := old.store.Member(gone.ID()); err != nil {
		t.Fatalf("the record should still be there before a new term: %v", err)
	}
	if err := old.consensus.Raft().LeadershipTransfer().Error(); err != nil {
		t.Fatalf("transfer leadership: %v", err)
	}
	poll.Eventually(t, "the removed node's record forgotten by the new leader", func() error {
		for _, n := range c.running() {

			if n == gone || !n.IsLeader() {
				continue
			}
			if _, err := n.store.Member(gone.ID()); err == nil {
				return fmt.Errorf("still recorded on leader %s", n.ID())
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			return nil
		}
		return errors.New("no new leader")
	}, poll.Within(10*time.Second))

}

// TestFollowerReadsItsOwnWrites: a follower answers a PUT with the stored
// policy from the leader's result, before it applies the entry itself; a
// local read right after must still see the write. A long commit timeout
// makes the follower learn of each commit late, so a read that did not
// wait would see the previous revision.
func TestFollowerReadsItsOwnWrites(t *testing.T) {
	c := newCluster(t, 3, func(cfg *config.Config) { cfg.Raft.CommitTimeout = 300 * time.Millisecond })
	f := apiFor(t, c.follower())
	for i := range 5 {
		put := f.do(http.MethodPut, "/v1/policies/acme.p", toolPolicy("acme.p", "acme", fmt.Sprintf("reason %d", i)), nil)
		if put.status != http.StatusOK {
			t.Fatalf("PUT %d: %d %s", i, put.status, put.body)
		}
		var p policy.Policy
		put.decode(t, &p)
		for _, path := range []string{"/v1/policies/acme.p", "/v1/policies?org=acme"} {
			get := f.do(http.MethodGet, path, nil, nil)
			if get.status != http.StatusOK {
				t.Fatalf("GET %s after PUT %d: %d %s", path, i, get.status, get.body)
			}
			if !bytes.Contains(get.body, []byte(fmt.Sprintf(`"revision":%d`, p.Revision))) {
				t.Errorf("GET %s right after PUT %d (revision %d) on the same follower: %s", path, i, p.Revision, get.body)
			}
		}
		if etag, want := put.header.Get("ETag"), strconv.Quote(strconv.FormatUint(p.Revision, 10)); etag != want {
			t.Errorf("PUT %d: ETag %s, want %s", i, etag, want)
		}
		get := f.do(http.MethodGet, "/v1/policies/acme.p", nil, nil)
		if !bytes.Equal(bytes.TrimSpace(get.body), bytes.TrimSpace(put.body)) {
			t.Errorf("PUT answer differs from the stored policy:\nPUT %s\nGET %s", put.body, get.body)
		}
	}
}
