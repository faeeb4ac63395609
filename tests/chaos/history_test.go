//go:build linux

package chaos

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// opKind is a client operation on one key.
type opKind uint8

const (
	opGet opKind = iota // GET ?consistent=true
	opPut               // PUT
	opCAS               // PUT with If-Match
	opDel               // DELETE
)

func (k opKind) String() string {
	return [...]string{"get", "put", "cas", "del"}[k]
}

// result is what an operation's response says happened.
type result uint8

const (
	resOK       result = iota
	resNotFound        // 404: the key did not exist
	resConflict        // 409: the If-Match revision was not the current one
	resUnknown         // failed or timed out: may or may not have happened
	resNotSent         // refused before the request was sent: did not happen
)

func (r result) String() string {
	return [...]string{"ok", "not-found", "conflict", "unknown", "not-sent"}[r]
}

// kvInput is an operation's request. Values are write ids ("" = absent).
type kvInput struct {
	Op  opKind `json:"op"`
	Key string `json:"key"`
	// Write is the write id a put or cas stores.
	Write string `json:"write,omitempty"`
	// Expect is, for a cas, the write id whose revision the If-Match named
	// ("" for If-Match: 0, must not exist). Revisions are Raft indexes,
	// unique per write, so "the revision matches" is "the key holds Expect".
	Expect  string `json:"expect,omitempty"`
	IfMatch uint64 `json:"if_match,omitempty"`
	Node    int    `json:"node"`
}

// kvOutput is an operation's response.
type kvOutput struct {
	Result result `json:"result"`
	// Value is the write id a get read.
	Value string `json:"value,omitempty"`
	// Revision is the revision a get read or a put was answered with.
	Revision uint64 `json:"revision,omitempty"`
	// Gone marks a write answered 404: committed, then deleted before the
	// answer read it back.
	Gone bool   `json:"gone,omitempty"`
	Err  string `json:"err,omitempty"`
}

// record is one operation with its invocation and response times (since
// the history began).
type record struct {
	Client int           `json:"client"`
	In     kvInput       `json:"in"`
	Out    kvOutput      `json:"out"`
	Call   time.Duration `json:"call"`
	Return time.Duration `json:"return"`
}

// history collects records from every client.
type history struct {
	start time.Time
	mu    sync.Mutex
	recs  []record
}

func newHistory() *history { return &history{start: time.Now()} }

func (h *history) now() time.Duration { return time.Since(h.start) }

func (h *history) add(r record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
}

func (h *history) records() []record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.recs)
}

// kvModel is a register per key holding a write id; porcupine checks each
// key on its own (partition by key). An operation of unknown outcome gets
// an infinite return time, so the checker may place it anywhere after its
// call, including after every other operation, which is the same as never.
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(kvInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(string), input.(kvInput), output.(kvOutput)
		switch in.Op {
		case opGet:
			if out.Result == resNotFound {
				return s == "", s
			}
			return s == out.Value, s
		case opPut:
			return true, in.Write
		case opCAS:
			switch out.Result {
			case resOK:
				return s == in.Expect, in.Write
			case resConflict:
				return s != in.Expect, s
			default: // unknown: it took effect iff the precondition held
				if s == in.Expect {
					return true, in.Write
				}
				return true, s
			}
		case opDel:
			cond := in.IfMatch != 0 // conditional: only if the key holds Expect
			switch out.Result {
			case resOK:
				return s != "" && (!cond || s == in.Expect), ""
			case resNotFound:
				return s == "", s
			case resConflict:
				return cond && s != "" && s != in.Expect, s
			default:
				if cond && s != in.Expect {
					return true, s
				}
				return true, ""
			}
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvInput), output.(kvOutput)
		switch in.Op {
		case opGet:
			if out.Result == resNotFound {
				return fmt.Sprintf("get(%s)@n%d → absent", in.Key, in.Node+1)
			}
			return fmt.Sprintf("get(%s)@n%d → %s (rev %d)", in.Key, in.Node+1, out.Value, out.Revision)
		case opPut:
			return fmt.Sprintf("put(%s, %s)@n%d → %s", in.Key, in.Write, in.Node+1, out.Result)
		case opCAS:
			return fmt.Sprintf("cas(%s, %s if %q/rev %d)@n%d → %s", in.Key, in.Write, in.Expect, in.IfMatch, in.Node+1, out.Result)
		default:
			return fmt.Sprintf("del(%s)@n%d → %s", in.Key, in.Node+1, out.Result)
		}
	},
	DescribeState: func(state any) string {
		if state.(string) == "" {
			return "absent"
		}
		return state.(string)
	},
}

// policyEvent is the part of an event log entry the checks read.
type policyEvent struct {
	ID          uint64          `json:"id"`
	Action      string          `json:"action"`
	EntityID    string          `json:"entity_id"`
	Data        json.RawMessage `json:"data"`
	ProcessedAt time.Time       `json:"processed_at"`
}

// storedPolicy is the part of a policy the suite reads: the write id is the
// spec's reason.
type storedPolicy struct {
	Name     string `json:"name"`
	Revision uint64 `json:"revision"`
	Spec     struct {
		Reason string `json:"reason"`
	} `json:"spec"`
}

// writeLog is the event log of the test's policies, indexed.
type writeLog struct {
	events []policyEvent
	// applied maps a write id to the event ids that applied it (one, unless
	// a write was applied twice).
	applied map[string][]uint64
	// lastChange is the id of each key's last event.
	lastChange map[string]uint64
	// deletedRev maps a revision that a DELETE removed to that DELETE's
	// event id.
	deletedRev map[uint64]uint64
}

func newWriteLog(events []policyEvent) (*writeLog, error) {
	w := &writeLog{events: events, applied: map[string][]uint64{}, lastChange: map[string]uint64{}, deletedRev: map[uint64]uint64{}}
	for _, ev := range events {
		w.lastChange[ev.EntityID] = ev.ID
		var p storedPolicy
		if err := json.Unmarshal(ev.Data, &p); err != nil {
			return nil, fmt.Errorf("event %d: decode policy: %w", ev.ID, err)
		}
		if ev.Action == "DELETE" {
			w.deletedRev[p.Revision] = ev.ID // the event's data is the deleted policy
			continue
		}
		if p.Revision != ev.ID {
			return nil, fmt.Errorf("event %d: policy %s stored at revision %d, not the event's index", ev.ID, p.Name, p.Revision)
		}
		w.applied[p.Spec.Reason] = append(w.applied[p.Spec.Reason], ev.ID)
	}
	return w, nil
}

// state is a policy set as name → revision, in a canonical string form.
type state map[string]uint64

func (s state) String() string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n + "@" + strconv.FormatUint(s[n], 10) + " ")
	}
	return b.String()
}

// states replays the log: the set after each event, starting from the
// empty set (index 0).
func (w *writeLog) states() (idx []uint64, sets []string) {
	cur := state{}
	idx, sets = []uint64{0}, []string{cur.String()}
	for _, ev := range w.events {
		if ev.Action == "DELETE" {
			delete(cur, ev.EntityID)
		} else {
			cur[ev.EntityID] = ev.ID
		}
		idx, sets = append(idx, ev.ID), append(sets, cur.String())
	}
	return idx, sets
}

// final is the set after the last event.
func (w *writeLog) final() state {
	cur := state{}
	for _, ev := range w.events {
		if ev.Action == "DELETE" {
			delete(cur, ev.EntityID)
		} else {
			cur[ev.EntityID] = ev.ID
		}
	}
	return cur
}

// operations turns the records into porcupine's history, resolving unknown
// writes with the event log: a put or cas whose write id the log does not
// hold was not applied and is dropped; one it holds succeeded. Unknown reads
// and unsent requests are dropped.
//
// A resolved write's return time is the earliest return of an operation on
// its key that answered with a revision at or after the write's own (a read
// of that state or later, a later acknowledged write): that operation could
// not have seen that revision unless the write had taken effect. Without
// such an operation it is infinite. Without this bound every resolved write
// stays concurrent with everything after it, and on a long run a few
// hundred of them make porcupine's search explode (a 4-minute run's 94,000
// operations did not finish in 4 minutes). The bound only narrows where a
// write may be placed, so a history it finds linearizable is linearizable
// without it; a verdict of not linearizable is checked again unbounded.
func operations(recs []record, w *writeLog) []porcupine.Operation {
	return buildOperations(recs, w, true)
}

func buildOperations(recs []record, w *writeLog, bound bool) []porcupine.Operation {
	seen := newSeenBy(recs)
	plainDeletes := newDeleteWindows(recs, w)
	ops := make([]porcupine.Operation, 0, len(recs))
	for _, r := range recs {
		out, ret := r.Out, r.Return.Nanoseconds()
		var at uint64 // the event id of an unknown write that applied
		switch {
		case out.Result == resNotSent:
			continue
		case out.Result != resUnknown:
		case r.In.Op == opGet:
			continue
		case r.In.Op == opPut || r.In.Op == opCAS:
			applied := w.applied[r.In.Write]
			if len(applied) == 0 {
				continue
			}
			out.Result, at = resOK, applied[0]
		case r.In.Op == opDel && r.In.IfMatch != 0:
			id, ok := w.deletedRev[r.In.IfMatch]
			if !ok {
				continue // nothing deleted that revision: this delete did not apply
			}
			at = id
		default:
			// A plain delete: the log does not say which DELETE was this
			// one, but the leader stamped it while the request was open.
			id, ok := plainDeletes.last(r)
			if !ok {
				continue // no DELETE of the key while it was open: not applied
			}
			at = id
		}
		if at != 0 {
			ret = math.MaxInt64
			b, ok := seen.earliest(r.In.Key, at)
			switch {
			case ok && b < r.Call.Nanoseconds() && r.In.Op == opDel:
				// The DELETE it could have been (the last candidate, for
				// a plain one) was seen before this request began: it
				// was another request's, and this one did not apply.
				continue
			case bound && ok && b >= r.Call.Nanoseconds():
				ret = b
			}
		}
		ops = append(ops, porcupine.Operation{
			ClientId: r.Client, Input: r.In, Output: out, Call: r.Call.Nanoseconds(), Return: ret,
		})
	}
	return ops
}

// deleteWindows finds the DELETE events a plain delete of unknown outcome
// could have been. Every event carries the leader's processed_at, stamped
// while the request was being handled, on the same host's clock as the
// history's times; the history's start on that clock is bracketed by the
// acknowledged writes (each event's processed_at falls inside its request's
// call and return). A request may still be handled a little after its
// client gave up (a paused node resumes), hence deleteSlack.
type deleteWindows struct {
	ok     bool
	lo, hi time.Time // the history's start lies in [lo, hi]
	byKey  map[string][]policyEvent
}

// deleteSlack is how long after its client gave up a request may still be
// stamped. Only a pause delays a request that a node holds (a killed node
// never stamps it; a partition cuts Raft links, not the client or the
// forward), so: the longest pause, plus scheduling on a loaded machine. A
// wider slack stays sound but leaves deletes open longer, which is what
// makes porcupine's search grow (15 s made a 10-minute run's key explode).
const deleteSlack = maxPause + 2*time.Second

func newDeleteWindows(recs []record, w *writeLog) *deleteWindows {
	d := &deleteWindows{byKey: map[string][]policyEvent{}}
	at := map[uint64]time.Time{}
	for _, ev := range w.events {
		at[ev.ID] = ev.ProcessedAt
		if ev.Action == "DELETE" {
			d.byKey[ev.EntityID] = append(d.byKey[ev.EntityID], ev)
		}
	}
	first := true
	for _, r := range recs {
		if r.Out.Result != resOK || (r.In.Op != opPut && r.In.Op != opCAS) || len(w.applied[r.In.Write]) != 1 {
			continue
		}
		p, ok := at[w.applied[r.In.Write][0]]
		if !ok || p.IsZero() {
			continue
		}
		lo, hi := p.Add(-r.Return), p.Add(-r.Call)
		if first || lo.After(d.lo) {
			d.lo = lo
		}
		if first || hi.Before(d.hi) {
			d.hi = hi
		}
		first = false
	}
	d.ok = !first && !d.lo.After(d.hi)
	return d
}

// last returns the id of the last DELETE of r's key stamped while r could
// have been handled; false if there is none, or the clocks cannot be
// related (then nothing may be dropped: the caller keeps the delete with no
// known return).
func (d *deleteWindows) last(r record) (uint64, bool) {
	if !d.ok {
		return math.MaxUint64, true
	}
	from, to := d.lo.Add(r.Call), d.hi.Add(r.Return+deleteSlack)
	var id uint64
	for _, ev := range d.byKey[r.In.Key] {
		if !ev.ProcessedAt.Before(from) && !ev.ProcessedAt.After(to) {
			id = ev.ID
		}
	}
	return id, id != 0
}

// seenBy indexes, per key, the operations that answered with a revision:
// by revision, with the earliest return among all at that revision or later.
type seenBy map[string][]revReturn

type revReturn struct {
	rev uint64
	ret int64 // the earliest return of an answer with revision >= rev
}

func newSeenBy(recs []record) seenBy {
	s := seenBy{}
	for _, r := range recs {
		if r.Out.Result == resOK && r.Out.Revision != 0 {
			s[r.In.Key] = append(s[r.In.Key], revReturn{r.Out.Revision, r.Return.Nanoseconds()})
		}
	}
	for _, l := range s {
		sort.Slice(l, func(i, j int) bool { return l[i].rev < l[j].rev })
		for i := len(l) - 2; i >= 0; i-- {
			l[i].ret = min(l[i].ret, l[i+1].ret)
		}
	}
	return s
}

// earliest is the earliest return of an answer on key with a revision at
// or after rev.
func (s seenBy) earliest(key string, rev uint64) (int64, bool) {
	l := s[key]
	i := sort.Search(len(l), func(i int) bool { return l[i].rev >= rev })
	if i == len(l) {
		return 0, false
	}
	return l[i].ret, true
}

// sidecarUpdate is one set a sidecar put in force.
type sidecarUpdate struct {
	Version string `json:"version"`
	Index   uint64 `json:"index,omitempty"`
	// Full is a whole set received at once (a discovery response, a feed
	// init); otherwise a feed delta applied to the previous set.
	Full bool  `json:"full"`
	Set  state `json:"set"`
}

// keyTimeline is one key's history in the log: the event ids that changed
// it and whether it existed after each (position 0 is "never written").
type keyTimeline struct {
	ids     []uint64
	present []bool
}

func (w *writeLog) timelines() map[string]*keyTimeline {
	out := map[string]*keyTimeline{}
	for _, k := range keys {
		out[k] = &keyTimeline{ids: []uint64{0}, present: []bool{false}}
	}
	for _, ev := range w.events {
		tl := out[ev.EntityID]
		if tl == nil {
			tl = &keyTimeline{ids: []uint64{0}, present: []bool{false}}
			out[ev.EntityID] = tl
		}
		tl.ids = append(tl.ids, ev.ID)
		tl.present = append(tl.present, ev.Action != "DELETE")
	}
	return out
}

// advance returns the first position at or after pos where the key is in
// the state held (present at revision rev, or absent), or -1.
func (tl *keyTimeline) advance(pos int, rev uint64, held bool) int {
	for j := pos; j < len(tl.ids); j++ {
		if held && tl.present[j] && tl.ids[j] == rev || !held && !tl.present[j] {
			return j
		}
	}
	return -1
}

// checkSidecar checks a sidecar's updates against the log: every policy
// revision it held was written, each key only ever moves forward in its
// own history (greedy earliest match, which finds an order whenever one
// exists), WebSocket raft indexes never decrease, and every whole set
// received over gRPC is a set that existed after some commit. (A feed
// delta need not give one: the feed sends a policy changed twice in one
// Raft batch once, in its latest state, so the set between two messages of
// a batch may be a mix; see internal/server/feed policiesChangedLocked.)
func checkSidecar(ups []sidecarUpdate, w *writeLog, grpc bool) (torn int, err error) {
	tls := w.timelines()
	pos := map[string]int{}
	_, sets := w.states()
	existed := map[string]bool{}
	for _, s := range sets {
		existed[s] = true
	}
	var lastIndex uint64
	for i, u := range ups {
		for k, tl := range tls {
			rev, held := u.Set[k]
			j := tl.advance(pos[k], rev, held)
			if j < 0 {
				if tl.advance(0, rev, held) >= 0 {
					return torn, fmt.Errorf("update %d (version %.12s): %s went back to revision %d (held %v) after revision %d", i, u.Version, k, rev, held, tl.ids[pos[k]])
				}
				return torn, fmt.Errorf("update %d (version %.12s): %s at revision %d was never written", i, u.Version, k, rev)
			}
			pos[k] = j
		}
		for k := range u.Set {
			if tls[k] == nil {
				return torn, fmt.Errorf("update %d: unknown policy %s", i, k)
			}
		}
		if grpc && !existed[u.Set.String()] {
			torn++
		}
		if u.Index != 0 {
			if u.Index < lastIndex {
				return torn, fmt.Errorf("update %d has raft index %d after %d", i, u.Index, lastIndex)
			}
			lastIndex = u.Index
		}
	}
	return torn, nil
}
