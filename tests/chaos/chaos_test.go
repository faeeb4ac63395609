//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/poll"
)

// keys are the policies the clients contend on; few, so that operations
// overlap, and scoped to one org that the sidecars watch.
var keys = []string{"k0", "k1", "k2", "k3", "k4"}

const (
	org = "chaos"
	// wsEmployee is the WebSocket sidecar's identity (auth.mode none).
	wsEmployee, wsTeam = "chaos-ws", "t1"
	// requestTimeout bounds one client request: longer than the nodes'
	// forward timeout, so most failures are the node's answer.
	requestTimeout = 8 * time.Second
	// recoverTimeout bounds the wait for the cluster to have a leader and
	// every voter again after a fault heals; missing it fails the run.
	recoverTimeout = 60 * time.Second
)

// TestChaos runs clients against a 3-node cluster while faults are injected,
// then heals everything and checks the history and the replicas (see docs/design.md,
// the chaos suite).
func TestChaos(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (replay the schedule with -chaos.seed=%d)", seed, seed)
	kinds, err := parseFaults(*flagFaults)
	if err != nil {
		t.Fatal(err)
	}
	run := newRunDir(t)
	c := startCluster(t, policydBin, run.dir, 3)
	run.logf("cluster up: %s", c.describe())

	ectx, ecancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = c.nodes[0].api.PutEmployee(ectx, wsEmployee,
		[]byte(fmt.Sprintf(`{"org":%q,"team":%q,"status":"active"}`, org, wsTeam)), adminclient.AnyRevision)
	ecancel()
	if err != nil {
		t.Fatalf("PUT employee: %v", err)
	}
	c.waitHealthy(30 * time.Second) // every node knows the employee before its sidecar connects
	cars := startSidecars(t, c, run)

	h := newHistory()
	ctx, cancel := context.WithTimeout(context.Background(), *flagDuration)
	defer cancel()
	var wg sync.WaitGroup
	workers := make([]*worker, *flagClients)
	for i := range workers {
		workers[i] = &worker{id: i, c: c, h: h, rng: rand.New(rand.NewPCG(uint64(seed), uint64(i+1))), known: map[string]observed{}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			workers[i].run(ctx)
		}()
	}
	f := &faulter{c: c, run: run, rng: rand.New(rand.NewPCG(uint64(seed), 0)), kinds: kinds, counts: map[string]int{}}
	f.loop(ctx)
	wg.Wait()

	// Heal everything and wait for a converged cluster: same leader, three
	// voters, same applied index and FSM digest everywhere.
	f.healAll()
	if err := poll.Until(context.Background(), 2*time.Minute, c.healthy); err != nil {
		t.Fatalf("cluster did not converge after healing: %v", err)
	}
	digests := c.digests(t)
	run.logf("healed and converged: %s", digests)

	// Close the history with a consistent read of every key on every node.
	for _, nd := range c.nodes {
		w := &worker{id: *flagClients + nd.idx, c: c, h: h, known: map[string]observed{}}
		for _, k := range keys {
			if r := w.do(nd, kvInput{Op: opGet, Key: k, Node: nd.idx}); r.Out.Result != resOK && r.Out.Result != resNotFound {
				t.Errorf("final read of %s on %s: %s %s", k, nd.id, r.Out.Result, r.Out.Err)
			}
		}
	}

	events, err := c.policyEvents()
	if err != nil {
		t.Fatalf("read the event log: %v", err)
	}
	log, err := newWriteLog(events)
	if err != nil {
		t.Fatalf("event log: %v", err)
	}
	recs := h.records()
	saveJSONL(t, run, "history.jsonl", recs)
	saveJSONL(t, run, "events.jsonl", events)

	totals := tally(recs, log)
	checkWrites(t, recs, log, totals)
	for _, s := range staleReads(recs, log) {
		t.Errorf("stale read: %s", s)
	}
	checkSidecars(t, c, run, cars, log)

	ops := operations(recs, log)
	start := time.Now()
	res, info := checkLinearizable(t, ops, *flagCheckTimeout)
	if res == porcupine.Illegal {
		// The bounded return times (see operations) can only narrow the
		// search; check the unbounded history before calling it a failure.
		run.logf("bounded history not linearizable; checking again with unbounded unknown writes")
		ops = buildOperations(recs, log, false)
		res, info = checkLinearizable(t, ops, *flagCheckTimeout)
	}
	checkTime := time.Since(start)
	switch res {
	case porcupine.Illegal:
		t.Errorf("history is NOT linearizable; %s", visualise(run.dir, info, len(ops)))
	case porcupine.Unknown:
		// No visualisation: an unfinished search has nothing to show, and
		// rendering a long history took over 20 GB of memory (seen on a
		// 4-minute run). history.jsonl holds the operations.
		t.Errorf("linearizability check inconclusive after %v (raise -chaos.check-timeout); history: %s",
			checkTime, filepath.Join(run.dir, "history.jsonl"))
	}
	if f.partitionsOfLeader > 0 && f.leaderDeposed == 0 {
		t.Errorf("%d partitions isolated the leader and none led to a new leader: the proxies cut nothing", f.partitionsOfLeader)
	}
	for _, e := range f.failures {
		t.Error(e)
	}
	if n := c.net.unidentified.Load(); n > 0 {
		t.Logf("%d raft connections could not be attributed to a sender (forwarded, never cut)", n)
	}

	t.Logf("TOTALS seed=%d duration=%v clients=%d", seed, *flagDuration, *flagClients)
	t.Logf("  operations: %d recorded, %d checked by porcupine; %s", len(recs), len(ops), totals.byKind())
	t.Logf("  faults: %s", f.summary())
	t.Logf("  writes: %d acknowledged, %d of unknown outcome (%d applied), lost %d, applied twice %d",
		totals.acked, totals.unknownWrites, totals.unknownApplied, totals.lost, totals.duplicated)
	t.Logf("  linearizability: %v (porcupine %v over %d keys)", resultName(res), checkTime.Round(time.Millisecond), len(keys))
	t.Logf("  replicas: %s", digests)
	for _, s := range cars {
		t.Logf("  sidecar %s: %d updates, %d reconnects, %d torn sets", s.name, len(s.snapshot()), s.cl.Stats().Connects, s.torn)
	}
}

func resultName(r porcupine.CheckResult) string {
	switch r {
	case porcupine.Ok:
		return "linearizable"
	case porcupine.Illegal:
		return "NOT linearizable"
	}
	return "unknown (timed out)"
}

// observed is what a client last saw of a key: a revision and the write id
// it belonged to.
type observed struct {
	rev   uint64
	write string
}

// worker is one REST client issuing random operations until ctx ends.
type worker struct {
	id    int
	c     *cluster
	h     *history
	rng   *rand.Rand
	known map[string]observed
	seq   int
}

func (w *worker) run(ctx context.Context) {
	for ctx.Err() == nil {
		key := keys[w.rng.IntN(len(keys))]
		nd := w.c.nodes[w.rng.IntN(len(w.c.nodes))]
		in := kvInput{Key: key, Node: nd.idx}
		obs, have := w.known[key]
		switch p := w.rng.Float64(); {
		case p < 0.35:
			in.Op = opGet
		case p < 0.6, p < 0.85 && !have:
			in.Op = opPut
		case p < 0.85:
			in.Op, in.Expect, in.IfMatch = opCAS, obs.write, obs.rev
		default:
			// Conditional when a revision is known: the log then tells
			// whether a delete of unknown outcome applied, which keeps
			// porcupine's search small (plain ones stay unknown).
			in.Op = opDel
			if have && obs.rev != 0 && w.rng.IntN(4) != 0 {
				in.Expect, in.IfMatch = obs.write, obs.rev
			}
		}
		if in.Op == opPut || in.Op == opCAS {
			w.seq++
			in.Write = "c" + strconv.Itoa(w.id) + "-w" + strconv.Itoa(w.seq)
		}
		w.do(nd, in)
	}
}

// do performs one operation, records it and updates what the worker knows.
func (w *worker) do(nd *node, in kvInput) record {
	r := record{Client: w.id, In: in, Call: w.h.now()}
	r.Out = w.send(nd, in)
	r.Return = w.h.now()
	w.h.add(r)
	switch {
	case r.Out.Result == resOK && in.Op != opDel && r.Out.Value != "":
		w.known[in.Key] = observed{rev: r.Out.Revision, write: r.Out.Value}
	case r.Out.Result == resOK && in.Op == opDel, r.Out.Result == resNotFound:
		w.known[in.Key] = observed{}
	default:
		delete(w.known, in.Key)
	}
	return r
}

func (w *worker) send(nd *node, in kvInput) kvOutput {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	path := "/v1/policies/" + in.Key
	var p storedPolicy
	var err error
	switch in.Op {
	case opGet:
		// Policy has no consistent read; Do decodes the same answer.
		err = nd.api.Do(ctx, http.MethodGet, path+"?consistent=true", nil, nil, &p)
	case opPut, opCAS:
		body := []byte(fmt.Sprintf(`{"kind":"ToolPolicy","scope":{"org":%q},"spec":{"tool_name":"Bash","action":"deny","reason":%q}}`, org, in.Write))
		var hdr http.Header
		if in.Op == opCAS {
			hdr = http.Header{"If-Match": {strconv.Quote(strconv.FormatUint(in.IfMatch, 10))}}
		}
		// Do, not PutPolicy: the answer is the replica's copy of the
		// policy, whose name and write id the history records.
		err = nd.api.Do(ctx, http.MethodPut, path, hdr, body, &p)
	case opDel:
		rev := adminclient.AnyRevision
		if in.IfMatch != 0 {
			rev = int64(in.IfMatch)
		}
		_, err = nd.api.DeletePolicy(ctx, in.Key, rev)
	}
	if err == nil {
		if in.Op == opDel {
			return kvOutput{Result: resOK}
		}
		if p.Name != in.Key {
			return kvOutput{Result: resUnknown, Err: fmt.Sprintf("200 answer names policy %q", p.Name)}
		}
		return kvOutput{Result: resOK, Value: p.Spec.Reason, Revision: p.Revision}
	}
	var ae *adminclient.Error
	if !errors.As(err, &ae) {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return kvOutput{Result: resNotSent, Err: err.Error()}
		}
		return kvOutput{Result: resUnknown, Err: err.Error()}
	}
	switch {
	case ae.Status == http.StatusNotFound && (in.Op == opGet || in.Op == opDel):
		return kvOutput{Result: resNotFound}
	case ae.Status == http.StatusNotFound:
		// The write committed, then a DELETE applied before the handler
		// read the policy back for its answer (adminapi answers a PUT with
		// the local replica's copy): the write happened.
		return kvOutput{Result: resOK, Gone: true}
	case ae.Status == http.StatusConflict && (in.Op == opCAS || in.Op == opDel && in.IfMatch != 0):
		return kvOutput{Result: resConflict}
	}
	return kvOutput{Result: resUnknown, Err: fmt.Sprintf("status %v", ae)}
}

// totals counts what a run did.
type totals struct {
	ops            map[string]int // "put/ok" → count
	acked          int
	unknownWrites  int
	unknownApplied int
	lost           int
	duplicated     int
}

func tally(recs []record, log *writeLog) *totals {
	t := &totals{ops: map[string]int{}}
	for _, r := range recs {
		k := r.In.Op.String() + "/" + r.Out.Result.String()
		if r.Out.Gone {
			k += "(answered 404)"
		}
		t.ops[k]++
		if r.In.Op != opPut && r.In.Op != opCAS {
			continue
		}
		switch r.Out.Result {
		case resOK:
			t.acked++
		case resUnknown:
			t.unknownWrites++
			if len(log.applied[r.In.Write]) > 0 {
				t.unknownApplied++
			}
		}
	}
	return t
}

func (t *totals) byKind() string {
	var parts []string
	for k, n := range t.ops {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// checkWrites checks every write against the event log: an acknowledged
// write was applied exactly once, at the revision its answers showed; no
// write is applied twice or applied after the cluster said it was not
// (conflict); every revision a client read belongs to the write it read.
// The final state on every node is what porcupine checks, through the
// closing reads.
func checkWrites(t *testing.T, recs []record, log *writeLog, tot *totals) {
	t.Helper()
	issued := map[string]bool{}
	for _, r := range recs {
		if r.In.Write != "" {
			issued[r.In.Write] = true
		}
		if r.Out.Result == resUnknown && strings.HasPrefix(r.Out.Err, "status 4") {
			t.Errorf("%s %s: unexpected answer %s", r.In.Op, r.In.Key, r.Out.Err)
		}
		applied := log.applied[r.In.Write]
		switch {
		case r.In.Write == "":
		case len(applied) > 1:
			tot.duplicated++
			t.Errorf("write %s applied %d times, at %v", r.In.Write, len(applied), applied)
		case r.Out.Result == resOK && len(applied) == 0:
			tot.lost++
			t.Errorf("acknowledged write %s (%s %s on node%d) is not in the event log: lost", r.In.Write, r.In.Op, r.In.Key, r.In.Node+1)
		case r.Out.Result == resConflict && len(applied) > 0:
			t.Errorf("write %s was refused with 409 but applied at %d", r.In.Write, applied[0])
		}
		if r.Out.Value != "" {
			if at := log.applied[r.Out.Value]; len(at) == 0 || at[0] != r.Out.Revision {
				t.Errorf("%s %s on node%d read %s at revision %d; the log applied it at %v", r.In.Op, r.In.Key, r.In.Node+1, r.Out.Value, r.Out.Revision, at)
			}
		}
	}
	for w := range log.applied {
		if !issued[w] {
			t.Errorf("the log holds write %q, which no client issued", w)
		}
	}
}

// policyEvents reads every policy event of the test's org, with a
// consistent read, from the first node.
func (c *cluster) policyEvents() ([]policyEvent, error) {
	var all []policyEvent
	after := uint64(0)
	for range 100000 {
		var page struct {
			Events        []policyEvent `json:"events"`
			PrunedThrough uint64        `json:"pruned_through"`
			LastID        uint64        `json:"last_id"`
		}
		// Do, not Events: EventFilter has no consistent read.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.nodes[0].api.Do(ctx, http.MethodGet,
			fmt.Sprintf("/v1/events?type=policy&org=%s&after=%d&limit=1000&consistent=true", org, after), nil, nil, &page)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("GET /v1/events: %w", err)
		}
		if page.PrunedThrough != 0 {
			return nil, fmt.Errorf("events pruned through %d: the history cannot be resolved", page.PrunedThrough)
		}
		all = append(all, page.Events...)
		if page.LastID == after {
			return all, nil
		}
		after = page.LastID
	}
	return nil, errors.New("event log did not end")
}

// digests reads every node's applied index and digest (equal: the caller
// waited for c.healthy).
func (c *cluster) digests(t *testing.T) string {
	t.Helper()
	var parts []string
	for _, nd := range c.nodes {
		st, err := c.status(nd)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, fmt.Sprintf("%s applied %d digest %.12s", nd.id, st.AppliedIndex, st.Digest))
	}
	return strings.Join(parts, "; ")
}

func (c *cluster) describe() string {
	var parts []string
	for _, nd := range c.nodes {
		parts = append(parts, fmt.Sprintf("%s http %s grpc %s raft %s via proxy %s", nd.id, nd.httpAddr, nd.grpcAddr, nd.raftAddr, nd.proxy.addr()))
	}
	return strings.Join(parts, "; ")
}

// runDir is where a run keeps its logs and history; kept when the test
// fails (or with -chaos.keep), removed otherwise.
type runDir struct {
	t   *testing.T
	dir string
	mu  sync.Mutex
	log *os.File
}

func newRunDir(t *testing.T) *runDir {
	t.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	dir, err := os.MkdirTemp("", "policyd-chaos-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "faults.log"))
	if err != nil {
		t.Fatal(err)
	}
	r := &runDir{t: t, dir: dir, log: f}
	t.Logf("run directory: %s", dir)
	t.Cleanup(func() {
		r.mu.Lock()
		_ = r.log.Close()
		r.mu.Unlock()
		if t.Failed() || *flagKeep {
			t.Logf("run directory kept: %s (node*/node.log, faults.log, history.jsonl, sidecars.log, porcupine.html on a failed check)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return r
}

// logf records a line in faults.log (and the test log with -v).
func (r *runDir) logf(format string, args ...any) {
	line := time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintln(r.log, line)
	if testing.Verbose() {
		r.t.Log(line)
	}
}

// saveJSONL writes one JSON document per element of vs to name.
func saveJSONL[T any](t *testing.T, r *runDir, name string, vs []T) {
	t.Helper()
	f, err := os.Create(filepath.Join(r.dir, name))
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, v := range vs {
		if err := enc.Encode(v); err != nil {
			t.Error(err)
			return
		}
	}
}

// sidecar is an SDK client watching the test's org, recording every set it
// puts in force.
type sidecar struct {
	name     string
	grpc     bool
	identity adminclient.PolicyFilter // the /v1/policies query naming its identity
	cl       *client.Client
	mu       sync.Mutex
	updates  []sidecarUpdate
	done     chan error
	runErr   error // what Run returned
	torn     int   // whole sets that never existed as of one index
	stop     context.CancelFunc
}

func (s *sidecar) snapshot() []sidecarUpdate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.updates)
}

// startSidecars runs two gRPC sidecars and one WebSocket sidecar, each
// preferring a different node, with fast failover.
func startSidecars(t *testing.T, c *cluster, run *runDir) []*sidecar {
	t.Helper()
	logFile, err := os.Create(filepath.Join(run.dir, "sidecars.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logFile.Close() })
	rotate := func(first int, addr func(*node) string) []string {
		var out []string
		for i := range c.nodes {
			out = append(out, addr(c.nodes[(first+i)%len(c.nodes)]))
		}
		return out
	}
	grpcAddr := func(nd *node) string { return nd.grpcAddr }
	httpAddr := func(nd *node) string { return nd.httpAddr }
	specs := []struct {
		name     string
		identity adminclient.PolicyFilter
		cfg      client.Config
	}{
		{"grpc-1", adminclient.PolicyFilter{Org: org}, client.Config{Servers: rotate(0, grpcAddr), Scope: client.Scope{Org: org}}},
		{"grpc-2", adminclient.PolicyFilter{Org: org}, client.Config{Servers: rotate(1, grpcAddr), Scope: client.Scope{Org: org}}},
		{"ws-1", adminclient.PolicyFilter{Org: org, Team: wsTeam, Employee: wsEmployee},
			client.Config{Servers: rotate(2, httpAddr), Transport: client.TransportWS, Employee: wsEmployee}},
	}
	var cars []*sidecar
	for _, sp := range specs {
		s := &sidecar{name: sp.name, grpc: sp.cfg.Transport != client.TransportWS, identity: sp.identity, done: make(chan error, 1)}
		cfg := sp.cfg
		cfg.ClientAddress = "chaos-" + sp.name
		cfg.Grace = time.Hour
		cfg.HealthInterval = 2 * time.Second
		cfg.BackoffMin, cfg.BackoffMax = 50*time.Millisecond, time.Second
		cfg.OnUpdate = func(u client.Update) {
			set := state{}
			for _, p := range u.Policies {
				set[p.Name] = p.Revision
			}
			s.mu.Lock()
			s.updates = append(s.updates, sidecarUpdate{Version: u.Version, Index: u.Index, Full: u.Full, Set: set})
			s.mu.Unlock()
		}
		logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})).With("sidecar", sp.name)
		cl, err := client.New(cfg, logger)
		if err != nil {
			t.Fatal(err)
		}
		s.cl = cl
		ctx, cancel := context.WithCancel(context.Background())
		s.stop = cancel
		go func() { s.done <- cl.Run(ctx) }()
		t.Cleanup(s.close)
		cars = append(cars, s)
	}
	for _, s := range cars {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.cl.WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatalf("sidecar %s never ready: %v", s.name, err)
		}
	}
	return cars
}

// close stops the sidecar and waits for it (once).
func (s *sidecar) close() {
	if s.stop == nil {
		return
	}
	s.stop()
	s.stop = nil
	select {
	case s.runErr = <-s.done:
	case <-time.After(30 * time.Second):
		s.runErr = errors.New("Run did not return within 30s of its context's end")
	}
}

// checkSidecars waits for every sidecar to hold the final set and version,
// stops them, and checks that each only ever held sets that existed, in
// commit order.
func checkSidecars(t *testing.T, c *cluster, run *runDir, cars []*sidecar, log *writeLog) {
	t.Helper()
	final := log.final().String()
	for _, s := range cars {
		f := s.identity
		f.Consistent = true
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		list, err := c.nodes[0].api.Policies(ctx, f)
		cancel()
		if err != nil || list.Version == "" {
			t.Errorf("sidecar %s: read its final version: %v (version %q)", s.name, err, list.Version)
			continue
		}
		err = poll.Until(context.Background(), 60*time.Second, func() error {
			ups := s.snapshot()
			if len(ups) == 0 {
				return errors.New("no update yet")
			}
			last := ups[len(ups)-1]
			if last.Set.String() != final || s.cl.Version() != list.Version {
				return fmt.Errorf("holds {%s} version %.12s (state %s), want {%s} version %.12s", last.Set, s.cl.Version(), s.cl.State(), final, list.Version)
			}
			return nil
		})

		if err != nil {
			t.Errorf("sidecar %s did not end on the final set: %v", s.name, err)
		}
		s.close()
		if s.runErr != nil {
			t.Errorf("sidecar %s: Run = %v", s.name, s.runErr)
		}
		saveJSONL(t, run, "sidecar-"+s.name+".jsonl", s.snapshot())
		torn, err := checkSidecar(s.snapshot(), log, s.grpc)
		if err != nil {
			t.Errorf("sidecar %s: %v", s.name, err)
		}
		if torn > 0 {
			// A gRPC response is a whole set built from the policy index,
			// which holds the state as of one index.
			t.Errorf("sidecar %s received %d whole sets that never existed at one index", s.name, torn)
		}
		s.torn = torn
	}
}

// faulter injects one fault at a time until ctx ends.
type faulter struct {
	c      *cluster
	run    *runDir
	rng    *rand.Rand
	kinds  []string
	counts map[string]int
	// partitionsOfLeader counts partitions that isolated the leader;
	// leaderDeposed those after which the majority elected another.
	partitionsOfLeader, leaderDeposed int
	transfersSeen                     int
	rejoinRestarts                    int
	failures                          []string
}

var allFaults = []string{"kill", "pause", "partition", "transfer", "membership"}

func parseFaults(s string) ([]string, error) {
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if !slices.Contains(allFaults, k) {
			return nil, fmt.Errorf("-chaos.faults: unknown fault %q (known: %s)", k, strings.Join(allFaults, ","))
		}
		out = append(out, k)
	}
	return out, nil
}

func (f *faulter) summary() string {
	var parts []string
	for _, k := range allFaults {
		if n := f.counts[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, n))
		}
	}
	return fmt.Sprintf("%s (leader isolated %d, deposed %d; transfers to another leader %d; restarts after re-add %d)",
		strings.Join(parts, " "), f.partitionsOfLeader, f.leaderDeposed, f.transfersSeen, f.rejoinRestarts)
}

// wait waits d, or less if ctx ends first (a fault in progress is then
// healed early).
func wait(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}

func (f *faulter) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(f.rng.Int64N(int64(hi-lo)))
}

func (f *faulter) loop(ctx context.Context) {
	if len(f.kinds) == 0 {
		<-ctx.Done()
		return
	}
	for {
		wait(ctx, f.between(time.Second, 4*time.Second))
		if ctx.Err() != nil {
			return
		}
		kind := f.kinds[f.rng.IntN(len(f.kinds))]
		f.counts[kind]++
		switch kind {
		case "kill":
			f.kill(ctx)
		case "pause":
			f.pause(ctx)
		case "partition":
			f.partition(ctx)
		case "transfer":
			f.transfer(ctx)
		case "membership":
			f.membership(ctx)
		}
		if err := poll.Until(context.Background(), recoverTimeout, f.c.stable); err != nil {
			f.fail("no leader with three voters %v after a %s fault healed: %v", recoverTimeout, kind, err)
			f.healAll()
			if err := poll.Until(context.Background(), recoverTimeout, f.c.stable); err != nil {
				f.fail("cluster did not recover: %v", err)
				return
			}
		}
	}
}

func (f *faulter) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	f.run.logf("FAILURE: %s", msg)
	f.failures = append(f.failures, msg)
}

// target picks the leader with probability pLeader, else another node.
func (f *faulter) target(pLeader float64) (nd *node, isLeader bool) {
	leader := f.c.leader()
	if leader != nil && f.rng.Float64() < pLeader {
		return leader, true
	}
	var others []*node
	for _, n := range f.c.nodes {
		if n != leader {
			others = append(others, n)
		}
	}
	return others[f.rng.IntN(len(others))], false
}

func role(isLeader bool) string {
	if isLeader {
		return "leader"
	}
	return "follower"
}

func (f *faulter) kill(ctx context.Context) {
	nd, l := f.target(0.5)
	f.run.logf("kill -9 %s (%s)", nd.id, role(l))
	f.c.kill(nd)
	wait(ctx, f.between(500*time.Millisecond, 4*time.Second))
	f.run.logf("restart %s", nd.id)
	f.c.restart(nd)
}

// maxPause is the longest SIGSTOP: a request a paused node holds is handled
// at most this much later than its client expected (see deleteSlack).
const maxPause = 10 * electionTimeout

func (f *faulter) pause(ctx context.Context) {
	nd, l := f.target(0.6)
	d := f.between(3*electionTimeout, maxPause)
	f.run.logf("SIGSTOP %s (%s) for %v", nd.id, role(l), d)
	if err := nd.signal(syscall.SIGSTOP); err != nil {
		f.fail("pause: %v", err)
		return
	}
	wait(ctx, d)
	if err := nd.signal(syscall.SIGCONT); err != nil {
		f.fail("resume: %v", err)
	}
	f.run.logf("SIGCONT %s", nd.id)
}

func (f *faulter) partition(ctx context.Context) {
	d := f.between(2*time.Second, 6*time.Second)
	nd, l := f.target(0.5)
	var others []int
	for _, n := range f.c.nodes {
		if n != nd {
			others = append(others, n.idx)
		}
	}
	if f.rng.Float64() < 0.35 {
		// One link: the third node still reaches both sides.
		peer := others[f.rng.IntN(len(others))]
		f.run.logf("cut link %s ↔ node%d (%s) for %v", nd.id, peer+1, role(l), d)
		f.c.net.partition([]int{nd.idx}, []int{peer})
		wait(ctx, d)
	} else {
		f.run.logf("isolate %s (%s) for %v", nd.id, role(l), d)
		f.c.net.partition([]int{nd.idx}, others)
		if l {
			f.partitionsOfLeader++
			deadline := time.Now().Add(d)
			err := poll.Until(context.Background(), d+10*time.Second, func() error { return f.c.ledBy(others, nd.id) })
			if err == nil {
				f.leaderDeposed++
				f.run.logf("majority elected a new leader")
			} else {
				f.run.logf("majority did not elect a new leader: %v", err)
			}
			wait(ctx, time.Until(deadline))
		} else {
			wait(ctx, d)
		}
	}
	f.c.net.heal()
	f.run.logf("healed")
}

// ledBy is nil when every node of idxs names the same leader, other than
// not.
func (c *cluster) ledBy(idxs []int, not string) error {
	leader := ""
	for _, i := range idxs {
		st, err := c.status(c.nodes[i])
		if err != nil {
			return err
		}
		if st.LeaderID == "" || st.LeaderID == not || leader != "" && st.LeaderID != leader {
			return fmt.Errorf("%s sees leader %q", st.NodeID, st.LeaderID)
		}
		leader = st.LeaderID
	}
	return nil
}

// transfer stops the leader gracefully, which transfers leadership before
// it exits, and restarts it.
func (f *faulter) transfer(ctx context.Context) {
	leader := f.c.leader()
	if leader == nil {
		f.run.logf("transfer: no agreed leader, skipped")
		return
	}
	f.run.logf("SIGTERM leader %s (graceful: leadership transfer)", leader.id)
	if err := f.c.terminate(leader); err != nil {
		f.fail("graceful stop of leader: %v", err)
	}
	var others []int
	for _, n := range f.c.nodes {
		if n != leader {
			others = append(others, n.idx)
		}
	}
	if err := poll.Until(context.Background(), 10*time.Second, func() error { return f.c.ledBy(others, leader.id) }); err == nil {
		f.transfersSeen++
	} else {
		f.run.logf("no new leader while %s was down: %v", leader.id, err)
	}
	wait(ctx, f.between(200*time.Millisecond, 2*time.Second))
	f.run.logf("restart %s", leader.id)
	f.c.restart(leader)
}

// membership removes a node and adds it back with the same ID and address.
func (f *faulter) membership(ctx context.Context) {
	nd, l := f.target(0.3)
	var via *node
	for _, n := range f.c.nodes {
		if n != nd && (via == nil || f.rng.IntN(2) == 0) {
			via = n
		}
	}
	f.run.logf("remove %s (%s) through %s", nd.id, role(l), via.id)
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	_, err := via.api.Remove(rctx, nd.id)
	rcancel()
	f.run.logf("remove answered %s", answer(err))
	if err == nil {
		if err := poll.Until(context.Background(), 20*time.Second, func() error { return f.c.memberCount(via, 2) }); err != nil {
			f.fail("removed %s but the configuration still shows it: %v", nd.id, err)
		}
		wait(ctx, f.between(500*time.Millisecond, 3*time.Second))
	}
	join := adminclient.JoinRequest{ID: nd.id, RaftAddr: nd.proxy.addr()}
	restarted := false
	err = poll.Until(context.Background(), 30*time.Second, func() error {
		jctx, jcancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := via.api.Join(jctx, join)
		jcancel()
		if err != nil {

			var ae *adminclient.Error
			if errors.As(err, &ae) && ae.Status == http.StatusBadRequest && strings.Contains(ae.Message, "does not answer") && !restarted {
				restarted = true
				f.rejoinRestarts++
				f.run.logf("%s does not answer the join's probe: restarting it", nd.id)
				f.c.kill(nd)
				f.c.restart(nd)
			}
			return fmt.Errorf("join: %s", answer(err))
		}
		return nil
	})

	if err != nil {
		f.fail("re-add %s: %v", nd.id, err)
		return
	}
	f.run.logf("re-added %s", nd.id)
	// A server that applied its own removal shut its raft down
	// (ShutdownOnRemove); it needs a restart to take part again.
	if err := poll.Until(context.Background(), 15*time.Second, f.c.stable); err != nil {
		f.rejoinRestarts++
		f.run.logf("%s did not catch up after the re-add (%v): restarting it", nd.id, err)
		f.c.kill(nd)
		f.c.restart(nd)
	}
}

// memberCount is nil when nd's configuration has n servers.
func (c *cluster) memberCount(nd *node, n int) error {
	st, err := c.status(nd)
	if err != nil {
		return err
	}
	if len(st.Members) != n {
		return fmt.Errorf("%s lists %d members, want %d", nd.id, len(st.Members), n)
	}
	return nil
}

// stable is nil when every node runs, names the same leader and sees every
// node as a voter.
func (c *cluster) stable() error {
	leader := ""
	for _, nd := range c.nodes {
		if !nd.running() || nd.isPaused() {
			return fmt.Errorf("%s is down", nd.id)
		}
		st, err := c.status(nd)
		if err != nil {
			return err
		}
		if st.LeaderID == "" || leader != "" && st.LeaderID != leader {
			return fmt.Errorf("%s sees leader %q", nd.id, st.LeaderID)
		}
		leader = st.LeaderID
		voters := 0
		for _, m := range st.Members {
			if m.Suffrage == "Voter" {
				voters++
			}
		}
		if voters != len(c.nodes) {
			return fmt.Errorf("%s sees %d voters", nd.id, voters)
		}
		if st.State != "Leader" && st.State != "Follower" {
			return fmt.Errorf("%s is %s", nd.id, st.State)
		}
	}
	return nil
}

// healAll undoes every fault: links restored, paused nodes resumed, dead
// nodes restarted, removed nodes joined again.
func (f *faulter) healAll() {
	f.c.net.heal()
	for _, nd := range f.c.nodes {
		if nd.isPaused() {
			_ = nd.signal(syscall.SIGCONT)
		}
		f.c.restart(nd)
	}
	rejoined := map[*node]bool{}
	err := poll.Until(context.Background(), recoverTimeout, func() error {
		var errs []error
		for _, nd := range f.c.nodes {
			via := f.c.nodes[(nd.idx+1)%len(f.c.nodes)]
			st, err := f.c.status(via)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if slices.ContainsFunc(st.Members, func(m adminclient.Member) bool { return m.ID == nd.id }) {
				continue
			}
			rejoined[nd] = true
			jctx, jcancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = via.api.Join(jctx, adminclient.JoinRequest{ID: nd.id, RaftAddr: nd.proxy.addr()})
			jcancel()
			errs = append(errs, fmt.Errorf("%s was not a member; join: %s", nd.id, answer(err)))
		}
		return errors.Join(errs...)
	})

	if err != nil {
		f.fail("heal: membership: %v", err)
	}
	for nd := range rejoined {
		f.run.logf("heal: re-added %s", nd.id)
		if err := poll.Until(context.Background(), 15*time.Second, f.c.stable); err != nil {
			f.rejoinRestarts++
			f.c.kill(nd)
			f.c.restart(nd)
		}
	}
}

// answer describes a response (or the error instead of one) for logs.
func answer(err error) string {
	if err != nil {
		return err.Error()
	}
	return "200 OK"
}

// maxVisualisedOps bounds the history porcupine renders: its HTML for a
// history of tens of thousands of operations needs tens of GB of memory.
const maxVisualisedOps = 20000

// visualise writes porcupine's visualisation of a failed check and says
// where, or says why it did not.
func visualise(dir string, info porcupine.LinearizationInfo, ops int) string {
	if ops > maxVisualisedOps {
		return fmt.Sprintf("%d operations is too many to visualise (limit %d); history: %s",
			ops, maxVisualisedOps, filepath.Join(dir, "history.jsonl"))
	}
	path := filepath.Join(dir, "porcupine.html")
	if err := porcupine.VisualizePath(kvModel, info, path); err != nil {
		return fmt.Sprintf("visualisation failed: %v; history: %s", err, filepath.Join(dir, "history.jsonl"))
	}
	return "visualisation: " + path
}
