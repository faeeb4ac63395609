package adminapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/third_party/raft"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	commandv1 "github.com/policyd/policyd/api/command/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/sources"
	"github.com/policyd/policyd/internal/store"
)

// fakeBackend is a Backend over a real store in a temporary directory.
// Propose applies each command through the real FSM at the next index, as a
// one-node leader would, so that compare-and-set conflicts, missing
// entities and read-backs are the store's own; every other method answers
// from its fields. Any method can be made to fail (errs) or panic (panics),
// by name, to walk the API's error paths.
type fakeBackend struct {
	st  *store.Store
	fsm *raftfsm.FSM

	mu sync.Mutex
	// errs is what a method returns, by name ("Propose", "Status", ...).
	errs map[string]error
	// panics makes a method panic, by name; "*" makes every one panic.
	panics map[string]bool
	// proposed records every command Propose was given, in order.
	proposed []*command.Command
	// result, when set, is Propose's answer instead of applying.
	result *commandv1.Result
	// noValue drops the stored value from Propose's answer, as a leader
	// of an older release sends it.
	noValue bool

	status      *ClusterStatus
	joinIndex   uint64
	removeIndex uint64
	clients     []*clusterv1.ClientInfo
	unreachable []string
	shadow      []*clusterv1.ShadowScopeCount
	// decisionReqs records each Decisions call and whether it was masked.
	decisionReqs []decisionCall
	masked       bool
	impactReqs   []*clusterv1.LocalImpactRequest
	impact       *decisionsv1.ImpactReport // nil: an empty report
	reload       reload.Status
	leader       string
}

// newFake returns a fake over an empty store, closed when the test (or
// benchmark) ends.
func newFake(t testing.TB) *fakeBackend {
	t.Helper()
	// NoSync: the test owns the only copy and never reopens it.
	st, err := store.OpenWithOptions(filepath.Join(t.TempDir(), "state.db"), discard(), store.Options{NoSync: true})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return &fakeBackend{
		st: st, fsm: raftfsm.New(st, discard()),
		errs: map[string]error{}, panics: map[string]bool{},
		status: &ClusterStatus{NodeID: "n1", State: "Leader", LeaderID: "n1", Members: []MemberStatus{{ID: "n1", Suffrage: "Voter", Leader: true}}},
		leader: "n1",
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// fail makes method return err.
func (f *fakeBackend) fail(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[method] = err
}

// panicIn makes method panic ("*": every method).
func (f *fakeBackend) panicIn(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.panics[method] = true
}

// call is the start of every method: it panics or returns the configured
// error.
func (f *fakeBackend) call(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panics[method] || f.panics["*"] {
		panic("fake backend: " + method + " panics")
	}
	return f.errs[method]
}

// commands returns what Propose was given.
func (f *fakeBackend) commands() []*command.Command {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*command.Command(nil), f.proposed...)
}

func (f *fakeBackend) Store() *store.Store {
	_ = f.call("Store")
	return f.st
}

func (f *fakeBackend) Validator() *policy.Validator {
	_ = f.call("Validator")
	return nil // the built-in kinds
}

func (f *fakeBackend) Propose(_ context.Context, cmd *command.Command) (*commandv1.Result, error) {
	if err := f.call("Propose"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.proposed = append(f.proposed, cmd.Clone())
	res, noValue := f.result, f.noValue
	f.mu.Unlock()
	if res != nil {
		return res, nil
	}
	res, err := f.apply(cmd)
	if noValue && res != nil {
		res.Value = nil
	}
	return res, err
}

// apply commits cmd at the next index through the FSM, stamped as a leader
// stamps it.
func (f *fakeBackend) apply(cmd *command.Command) (*commandv1.Result, error) {
	if err := command.CheckEnvelope(cmd); err != nil {
		return nil, fmt.Errorf("propose: %w", err)
	}
	idx := f.st.AppliedIndex() + 1
	cp := cmd.Clone()
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(idx) * time.Second)
	cp.ProcessedAtUnixNano, cp.OriginatedAtUnixNano = at.UnixNano(), at.UnixNano()
	data, err := command.Marshal(cp)
	if err != nil {
		return nil, fmt.Errorf("encode command: %w", err)
	}
	res, _ := f.fsm.Apply(&raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: data}).(*commandv1.Result)
	return res, nil
}

// seed returns a function that commits a built command, failing the test
// if it cannot be built or is refused: f.seed(t)(command.PutPolicy(p, nil)).
func (f *fakeBackend) seed(t *testing.T) func(*command.Command, error) *commandv1.Result {
	return func(cmd *command.Command, err error) *commandv1.Result {
		t.Helper()
		if err != nil {
			t.Fatalf("build seed command: %v", err)
		}
		res, err := f.apply(command.WithAudit(cmd, "token:seed", "seed"))
		if err == nil {
			err = command.ResultErr(res)
		}
		if err != nil {
			t.Fatalf("seed: %v", err)
		}
		return res
	}
}

func (f *fakeBackend) ConsistentRead(context.Context) error { return f.call("ConsistentRead") }
func (f *fakeBackend) ReadOwnWrites(context.Context) error  { return f.call("ReadOwnWrites") }
func (f *fakeBackend) Ready(context.Context) error          { return f.call("Ready") }

func (f *fakeBackend) Join(context.Context, string, string) (uint64, error) {
	return f.joinIndex, f.call("Join")
}

func (f *fakeBackend) Remove(context.Context, string) (uint64, error) {
	return f.removeIndex, f.call("Remove")
}

func (f *fakeBackend) Status(context.Context) (*ClusterStatus, error) {
	if err := f.call("Status"); err != nil {
		return nil, err
	}
	return f.status, nil
}

func (f *fakeBackend) Clients(context.Context) ([]*clusterv1.ClientInfo, []string, error) {
	if err := f.call("Clients"); err != nil {
		return nil, nil, err
	}
	return f.clients, f.unreachable, nil
}

func (f *fakeBackend) ReloadStatus() reload.Status {
	_ = f.call("ReloadStatus")
	return f.reload
}

func (f *fakeBackend) ShadowCounts(_ context.Context, names []string) ([]*clusterv1.ShadowScopeCount, []string, error) {
	if err := f.call("ShadowCounts"); err != nil {
		return nil, nil, err
	}
	var out []*clusterv1.ShadowScopeCount
	for _, c := range f.shadow {
		for _, n := range names {
			if c.GetPolicy() == n {
				out = append(out, c)
			}
		}
	}
	return out, f.unreachable, nil
}

type decisionCall struct {
	req  *clusterv1.LocalDecisionsRequest
	mask bool
}

func (f *fakeBackend) Decisions(_ context.Context, req *clusterv1.LocalDecisionsRequest, mask bool) (*decisionsv1.Page, error) {
	if err := f.call("Decisions"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.decisionReqs = append(f.decisionReqs, decisionCall{req, mask})
	f.mu.Unlock()
	return &decisionsv1.Page{Records: []decisionsv1.Record{}, Unavailable: f.unreachable}, nil
}

func (f *fakeBackend) DecisionsMasked() bool { return f.masked }

func (f *fakeBackend) Impact(_ context.Context, req *clusterv1.LocalImpactRequest, _ time.Time, mask bool) (*decisionsv1.ImpactReport, error) {
	if err := f.call("Impact"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.impactReqs = append(f.impactReqs, req)
	f.mu.Unlock()
	if f.impact != nil {
		return f.impact, nil
	}
	return &decisionsv1.ImpactReport{Teams: []decisionsv1.ImpactTeam{}, Unavailable: f.unreachable}, nil
}

// TransferLeadership is the optional leaderTransferer: it hands the lead
// to id, or to "n2" when id is "".
func (f *fakeBackend) TransferLeadership(_ context.Context, id string) (string, string, error) {
	if err := f.call("TransferLeadership"); err != nil {
		return "", "", err
	}
	if id == "" {
		id = "n2"
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	from := f.leader
	f.leader = id
	return from, id, nil
}

// The fake configures one source, git:policies, whose webhook secret is
// "s3cret" (a GitLab token, for brevity).
const fakeSource = "git:policies"

func (f *fakeBackend) SourceNames() []string { return []string{fakeSource} }

func (f *fakeBackend) SourceStatus(name string) (sources.Status, bool) {
	return sources.Status{Name: name}, name == fakeSource
}

func (f *fakeBackend) VerifySourceHook(name string, h http.Header, _ []byte) error {
	switch {
	case name != fakeSource:
		return sources.ErrNotConfigured
	case h.Get("X-Gitlab-Token") != "s3cret":
		return sources.ErrHookRefused
	}
	return f.call("VerifySourceHook")
}

func (f *fakeBackend) LeaderHTTPAddr() string { return "" }

var (
	_ Backend          = (*fakeBackend)(nil)
	_ leaderTransferer = (*fakeBackend)(nil)
)

// serve sends one request to a through a recorder: no network.
func serve(a *API, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	return w
}

// newRequest is httptest.NewRequest with a string body ("" for none) and
// headers.
func newRequest(method, target, body string, header map[string]string) *http.Request {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, target, rd)
	for k, v := range header {
		r.Header.Set(k, v)
	}
	return r
}
