// Package impact replays a node's logged decisions under a change set
// (POST /v1/impact, the peer plane's LocalImpact): each record of an
// identity the changes affect is decided again, with the SDK's own
// Evaluator, under the identity's current set and under the candidate, and
// the flips are counted per org and team. A record is data: its request
// is evaluated, never compiled, and a record that does not decode is
// counted, not fatal. It does not read the store or the policy index
// itself; the caller hands it a scan and a SetsFunc. Semantics are in
// docs/decisions.md.
package impact

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/client"
)

// Examples kept per org and team and per direction of flip.
const (
	DefaultMaxExamples = 20
	// MaxExamplesLimit caps what a request may ask: records are up to
	// 64 KiB each and held until the answer is sent.
	MaxExamplesLimit = 100
	// DefaultMaxExampleBytes bounds the examples of one answer, whatever
	// the number of teams, well under the peer plane's 4 MiB messages.
	DefaultMaxExampleBytes = 1 << 20
)

// maxIdentities and maxSets bound the caches; past them a cache starts
// over, which costs compiles but not correctness.
const (
	maxIdentities = 1 << 16
	maxSets       = 4096
)

// Options says what to replay.
type Options struct {
	// NodeID is the answer's node_id.
	NodeID string
	// Org and Team, when set, keep only the records of that org and team.
	Org, Team string
	// Since skips the records decided before it (zero: none).
	Since time.Time
	// MaxExamples is how many example records to keep per org and team
	// and per direction; 0: DefaultMaxExamples, negative: none. At most
	// MaxExamplesLimit.
	MaxExamples int
	// MaxExampleBytes bounds the examples' bytes over all teams; past it
	// no more are kept (the counts go on). 0: DefaultMaxExampleBytes.
	MaxExampleBytes int
	// Deadline, when set, ends the replay (as ctx's end does) with the
	// counts so far and cut_off set.
	Deadline time.Time
}

// OptionsFrom is the options of a peer's request.
func OptionsFrom(nodeID string, req *clusterv1.LocalImpactRequest) Options {
	o := Options{NodeID: nodeID, Org: req.GetOrg(), Team: req.GetTeam(), MaxExamples: int(req.GetMaxExamples())}
	if n := req.GetSinceUnixNano(); n > 0 {
		o.Since = time.Unix(0, n)
	}
	return o
}

// SetsFunc is an identity's policy set now (baseline) and with the
// changes (candidate), and whether the changes touch it at all; records
// of an identity they do not touch are skipped. policyset.Impact.Sets is
// one.
type SetsFunc func(org, team, employee string) (baseline, candidate []client.Policy, affected bool)

// ScanFunc hands yield each stored record, as its JSON, until yield
// returns false. The bytes need to stay valid only until yield returns.
type ScanFunc func(yield func(rec []byte) bool) error

// Replay decides every record scan gives under the sets of its identity
// and counts, per org and team: evaluated records, allow_to_deny,
// deny_to_allow, unchanged and errors (evaluated is the sum of the other
// four). An error is a record that does not decode, a set that does not
// compile, or an evaluation error on either side (which the SDK would
// turn into a denial). When ctx or opts.Deadline ends the replay, the
// answer holds the counts so far with cut_off set, and no error. A scan
// error is returned with the counts so far.
func Replay(ctx context.Context, opts Options, scan ScanFunc, sets SetsFunc) (*clusterv1.LocalImpactResponse, error) {
	if !opts.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, opts.Deadline)
		defer cancel()
	}
	switch {
	case opts.MaxExamples == 0:
		opts.MaxExamples = DefaultMaxExamples
	case opts.MaxExamples < 0:
		opts.MaxExamples = 0
	}
	opts.MaxExamples = min(opts.MaxExamples, MaxExamplesLimit)
	if opts.MaxExampleBytes <= 0 {
		opts.MaxExampleBytes = DefaultMaxExampleBytes
	}
	r := &replay{
		ctx:   ctx,
		opts:  opts,
		sets:  sets,
		resp:  &clusterv1.LocalImpactResponse{NodeId: opts.NodeID},
		ids:   map[identity]*identitySets{},
		evals: map[[sha256.Size]byte]*compiled{},
		teams: map[teamKey]*clusterv1.ImpactCount{},
	}
	err := scan(r.record)
	r.resp.Teams = make([]*clusterv1.ImpactCount, 0, len(r.teams))
	for _, c := range r.teams {
		r.resp.Teams = append(r.resp.Teams, c)
	}
	slices.SortFunc(r.resp.Teams, func(a, b *clusterv1.ImpactCount) int {
		return cmp.Or(cmp.Compare(a.Org, b.Org), cmp.Compare(a.Team, b.Team))
	})
	if err != nil {
		return r.resp, fmt.Errorf("scan decisions: %w", err)
	}
	return r.resp, nil
}

type identity struct{ org, team, employee string }

type teamKey struct{ org, team string }

// identitySets is an identity's compiled sets; nil ones when unaffected.
type identitySets struct {
	affected        bool
	baseline, cand  *compiled
	sameCompiledSet bool // the changes touch the identity but not what decides
}

// compiled is one set's Evaluator or the error compiling it gave.
type compiled struct {
	ev  *client.Evaluator
	err error
}

type replay struct {
	ctx   context.Context
	opts  Options
	sets  SetsFunc
	resp  *clusterv1.LocalImpactResponse
	ids   map[identity]*identitySets
	evals map[[sha256.Size]byte]*compiled
	teams map[teamKey]*clusterv1.ImpactCount
	// exampleBytes is what the examples kept so far hold.
	exampleBytes int
}

// errBadRecord is the error of a record that decodes but is not one.
var errBadRecord = errors.New("bad decision record")

// record takes one stored record; false stops the scan.
func (r *replay) record(data []byte) bool {
	if r.ctx.Err() != nil {
		r.resp.CutOff = true
		return false
	}
	r.resp.Scanned++
	rec, err := decode(data)
	if t := rec.Time; !t.IsZero() {
		if n := t.UnixNano(); r.resp.OldestUnixNano == 0 || n < r.resp.OldestUnixNano {
			r.resp.OldestUnixNano = n
		}
	}
	if err != nil {
		// Counted where it claims to be from, when it says so and that
		// passes the org and team filters (its time may be what is
		// wrong); else with no org and team, so that a filtered replay
		// still shows that records could not be read.
		if rec.Org == "" {
			rec.Team = ""
		}
		if rec.Org == "" || r.inScope(&rec) {
			c := r.team(rec.Org, rec.Team)
			c.Evaluated++
			c.Errors++
		}
		return true
	}
	if !r.keep(&rec) {
		return true
	}
	ids := r.identity(rec.Org, rec.Team, rec.Employee)
	if !ids.affected {
		return true
	}
	if d := rec.Unrecorded; d != nil {
		r.resp.Unrecorded += d.SampledOut + d.BufferFull + d.RateLimited + d.MaskFailed
		return true
	}
	return r.evaluate(&rec, data, ids)
}

// keep applies the filters.
func (r *replay) keep(rec *decisionsv1.Record) bool {
	return r.inScope(rec) && !rec.Time.Before(r.opts.Since)
}

// inScope applies the org and team filters.
func (r *replay) inScope(rec *decisionsv1.Record) bool {
	return (r.opts.Org == "" || rec.Org == r.opts.Org) && (r.opts.Team == "" || rec.Team == r.opts.Team)
}

// decode reads one record; what it could read is returned with an error
// too, so that a bad record can be counted against its team.
func decode(data []byte) (decisionsv1.Record, error) {
	var rec decisionsv1.Record
	if len(data) > decisionsv1.MaxRecordBytes {
		return rec, fmt.Errorf("%w: %d bytes", errBadRecord, len(data))
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, err
	}
	switch {
	case rec.Org == "":
		return rec, fmt.Errorf("%w: no org", errBadRecord)
	case rec.Time.IsZero():
		return rec, fmt.Errorf("%w: no time", errBadRecord)
	}
	return rec, nil
}

func (r *replay) team(org, team string) *clusterv1.ImpactCount {
	k := teamKey{org, team}
	c := r.teams[k]
	if c == nil {
		c = &clusterv1.ImpactCount{Org: org, Team: team}
		r.teams[k] = c
	}
	return c
}

// identity is the compiled sets of an identity, from the cache.
func (r *replay) identity(org, team, employee string) *identitySets {
	k := identity{org, team, employee}
	if ids := r.ids[k]; ids != nil {
		return ids
	}
	base, cand, affected := r.sets(org, team, employee)
	ids := &identitySets{affected: affected}
	if affected {
		bh, ch := setHash(base), setHash(cand)
		ids.baseline, ids.cand = r.compile(bh, base), r.compile(ch, cand)
		ids.sameCompiledSet = bh == ch
	}
	if len(r.ids) >= maxIdentities {
		clear(r.ids)
	}
	r.ids[k] = ids
	return ids
}

// compile is the Evaluator of a set, from the cache by the set's hash.
func (r *replay) compile(h [sha256.Size]byte, set []client.Policy) *compiled {
	if c := r.evals[h]; c != nil {
		return c
	}
	ev, err := client.NewEvaluator(set)
	c := &compiled{ev: ev, err: err}
	if len(r.evals) >= maxSets {
		clear(r.evals)
	}
	r.evals[h] = c
	return c
}

// setHash identifies what in a set decides: each policy's name, kind,
// enforcement and spec (scope, labels and revision do not change a
// decision), in the set's order, which is by name.
func setHash(set []client.Policy) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	for _, p := range set {
		field([]byte(p.Name))
		field([]byte(p.Kind))
		field([]byte(p.Enforcement))
		field(p.Spec)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// evaluate decides rec under both sets and counts it; false stops the
// scan when the replay's time is up mid-record.
func (r *replay) evaluate(rec *decisionsv1.Record, data []byte, ids *identitySets) bool {
	c := r.team(rec.Org, rec.Team)
	if ids.baseline.err != nil || ids.cand.err != nil {
		c.Evaluated++
		c.Errors++
		return true
	}
	req := client.Request{Tool: rec.Request.Tool, Input: rec.Request.Input, Request: rec.Request.HTTP}
	base := ids.baseline.ev.Evaluate(r.ctx, req)
	cand := base
	if !ids.sameCompiledSet {
		cand = ids.cand.ev.Evaluate(r.ctx, req)
	}
	if r.ctx.Err() != nil {
		// Its denial may be the end of ctx, not a policy's.
		r.resp.CutOff = true
		return false
	}
	c.Evaluated++
	if rec.Masked {
		r.resp.Masked++
	}
	switch {
	case base.Err != nil || cand.Err != nil:
		c.Errors++
	case base.Allowed && !cand.Allowed:
		c.AllowToDeny++
		c.AllowToDenyExamples = r.example(c.AllowToDenyExamples, data)
	case !base.Allowed && cand.Allowed:
		c.DenyToAllow++
		c.DenyToAllowExamples = r.example(c.DenyToAllowExamples, data)
	default:
		c.Unchanged++
	}
	return true
}

// example appends a copy of data to list if it and the answer have room.
func (r *replay) example(list [][]byte, data []byte) [][]byte {
	if len(list) >= r.opts.MaxExamples || r.exampleBytes+len(data) > r.opts.MaxExampleBytes {
		return list
	}
	r.exampleBytes += len(data)
	return append(list, bytes.Clone(data))
}
