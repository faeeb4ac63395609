package client

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
)

// Decision log defaults, applied by New to zero fields of a DecisionLog.
const (
	// DefaultAllowSampleRate is the share of allowed decisions recorded.
	DefaultAllowSampleRate = 0.1
	// DefaultDecisionBufferBytes caps the encoded records held.
	DefaultDecisionBufferBytes = 16 << 20
	// DefaultDecisionRate is how many records per second are kept at most,
	// with a burst of as many.
	DefaultDecisionRate = 1000
	// DefaultDecisionFlushInterval is how often buffered records are
	// shipped to the connected node; MinDecisionFlushInterval the least
	// accepted, which keeps a fleet from flooding its nodes with batches.
	DefaultDecisionFlushInterval = time.Second
	MinDecisionFlushInterval     = 100 * time.Millisecond
)

// DecisionLog turns on the recording of Evaluate's decisions
// (Config.DecisionLog; nil: off). Records are masked, then kept in a
// bounded buffer in memory, which Run ships to the connected node every
// FlushInterval (ReportDecisions over gRPC, decision_log frames over the
// feed); records a node refuses stay buffered for the next try. A program
// may also take them itself (TakeDecisions). See docs/sidecars.md.
type DecisionLog struct {
	// AllowSampleRate is the share of allowed decisions recorded, in
	// [0, 1]; every denial is recorded. Nil: DefaultAllowSampleRate (0.1);
	// a pointer so that 0, recording denials only, can be said.
	AllowSampleRate *float64
	// MaxBufferBytes caps the encoded size of the records held. When a
	// record does not fit, the oldest are dropped (counted in
	// Dropped.BufferFull); a record larger than the cap is dropped itself.
	// 0: DefaultDecisionBufferBytes (16 MiB).
	MaxBufferBytes int
	// RatePerSecond and Burst are a token bucket over the records kept
	// (after sampling): one over it is dropped and counted in
	// Dropped.RateLimited. 0: DefaultDecisionRate (1000/s), and a burst of
	// one second's worth (at least 1). The bucket runs on Config.Clock.
	RatePerSecond float64
	Burst         int
	// Mask says what is left out of a recorded request; see DecisionMask.
	Mask DecisionMask
	// FlushInterval is how often Run sends the buffered records to the
	// node (and sooner once a full batch is buffered). 0:
	// DefaultDecisionFlushInterval (1s); at least MinDecisionFlushInterval.
	FlushInterval time.Duration
	// Source, when set, is where Run ships records from instead of the
	// buffer: a program that first moves records elsewhere (a disk spool
	// it fills with TakeDecisions) ships them from there, in its order.
	Source DecisionSource
}

// DecisionSource holds records for the shipper (DecisionLog.Source). Its
// methods are called from one goroutine at a time.
type DecisionSource interface {
	// Peek returns the oldest records not yet shipped, in order, without
	// removing them: at most maxRecords, of maxBytes together, each one a
	// JSON object of at most decisionsv1.MaxRecordBytes. Nil: none.
	Peek(maxRecords, maxBytes int) ([][]byte, error)
	// Shipped says that the first n records the last Peek returned are
	// done with (a node took or refused them for good): the next Peek
	// begins after them. Records not delivered are not reported, and the
	// next Peek returns them again.
	Shipped(n int) error
}

// DecisionRecord is one recorded decision, as TakeDecisions' records
// encode it (JSON, one object each). Org, Team and Employee are the claims
// of the client's token (not verified: the node checks them against the
// identity it authenticated), or else Config.Scope, or Config.Employee
// for the feed.
type DecisionRecord = decisionsv1.Record

// DecisionRequest is a recorded request: the tool call (Tool, Input)
// and the HTTP attributes (Request.Request), masked. Object, OldObject and
// Params are not recorded.
type DecisionRequest = decisionsv1.Request

// DecisionLogStats are the decision log's counters since New. Every
// decision is Recorded or SampledOut; every recorded one is, in the end,
// buffered, taken (and not returned) or dropped for one of the reasons.
type DecisionLogStats struct {
	Recorded   uint64           `json:"recorded"`
	SampledOut uint64           `json:"sampled_out"`
	Taken      uint64           `json:"taken"`
	Dropped    DecisionLogDrops `json:"dropped"`
	// BufferedBytes and BufferedRecords are what the buffer holds now.
	BufferedBytes   int `json:"buffered_bytes"`
	BufferedRecords int `json:"buffered_records"`
	// Shipped counts the taken records a node accepted; Refused those it
	// refused for good (invalid, another identity's), which are not sent
	// again. Over the feed, which has no answer, a record written counts
	// as shipped.
	Shipped uint64 `json:"shipped"`
	Refused uint64 `json:"refused"`
	// ShipFailures counts batches that could not be delivered (a refusal
	// such as ResourceExhausted, a lost connection); their records went
	// back to the buffer.
	ShipFailures uint64 `json:"ship_failures"`
}

// DecisionLogDrops counts recorded decisions dropped, by reason.
type DecisionLogDrops struct {
	// BufferFull: dropped as the oldest when the buffer was full, or
	// larger than the whole buffer, or, when shipping, larger than a node
	// takes (decisionsv1.MaxRecordBytes).
	BufferFull uint64 `json:"buffer_full"`
	// RateLimited: over the rate cap.
	RateLimited uint64 `json:"rate_limited"`
	// MaskFailed: the request could not be masked or encoded (a value
	// nested too deeply, a NaN, a value JSON cannot hold).
	MaskFailed uint64 `json:"mask_failed"`
}

// decisionLog is the recorder of a client whose Config.DecisionLog is set.
type decisionLog struct {
	allowRate float64
	maxBytes  int
	rate      float64 // tokens per second
	burst     float64
	mask      *masker
	clock     Clock
	flush     time.Duration
	source    DecisionSource

	// kick wakes the shipper when a full batch is buffered (capacity 1).
	kick chan struct{}

	shipped, refused, shipFailures atomic.Uint64

	// identity is the record's org, team and employee.
	identity atomic.Pointer[decisionIdentity]

	recorded, sampledOut, rateLimited, maskFailed atomic.Uint64

	mu         sync.Mutex
	tokens     float64
	last       time.Time // of the last refill
	buf        [][]byte  // buf[head:] are held, oldest first
	head       int
	bytes      int
	bufferFull uint64
	taken      uint64
	// reported is the drop counts a node has taken, cumulative: a batch
	// carries what grew since.
	reported decisionsv1.Drops
}

// decisionIdentity names who a client decides for.
type decisionIdentity struct{ org, team, employee string }

// newDecisionLog validates dl and fills in its defaults.
func newDecisionLog(dl DecisionLog, clock Clock) (*decisionLog, error) {
	var errs []error
	d := &decisionLog{allowRate: DefaultAllowSampleRate, maxBytes: dl.MaxBufferBytes,
		rate: dl.RatePerSecond, burst: float64(dl.Burst), clock: clock,
		flush: dl.FlushInterval, source: dl.Source, kick: make(chan struct{}, 1)}
	if r := dl.AllowSampleRate; r != nil {
		if !(*r >= 0 && *r <= 1) {
			errs = append(errs, fmt.Errorf("allow sample rate: %v is not in [0, 1]", *r))
		}
		d.allowRate = *r
	}
	if d.maxBytes < 0 {
		errs = append(errs, fmt.Errorf("max buffer bytes: %d is negative", d.maxBytes))
	}
	if d.maxBytes <= 0 {
		d.maxBytes = DefaultDecisionBufferBytes
	}
	if !(d.rate >= 0) || math.IsInf(d.rate, 0) {
		errs = append(errs, fmt.Errorf("rate per second: %v is not a finite number >= 0", d.rate))
	}
	if d.rate <= 0 {
		d.rate = DefaultDecisionRate
	}
	if d.burst < 0 {
		errs = append(errs, fmt.Errorf("burst: %d is negative", dl.Burst))
	}
	if d.burst <= 0 {
		d.burst = max(1, math.Floor(d.rate))
	}
	switch {
	case d.flush < 0:
		errs = append(errs, fmt.Errorf("flush interval: %v is negative", d.flush))
	case d.flush == 0:
		d.flush = DefaultDecisionFlushInterval
	case d.flush < MinDecisionFlushInterval:
		errs = append(errs, fmt.Errorf("flush interval: %v is below %v", d.flush, MinDecisionFlushInterval))
	}
	mk, err := newMasker(dl.Mask)
	if err != nil {
		errs = append(errs, fmt.Errorf("mask: %w", err))
	}
	d.mask = mk
	d.tokens = d.burst
	d.last = clock.Now()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("decision log: %w", err)
	}
	return d, nil
}

// keep reports whether a decision is sampled in, and counts it.
func (d *decisionLog) keep(allowed bool) bool {
	if allowed && d.allowRate < 1 && (d.allowRate == 0 || rand.Float64() >= d.allowRate) {
		d.sampledOut.Add(1)
		return false
	}
	d.recorded.Add(1)
	return true
}

// admit takes a token from the bucket at now; false (counted) when empty.
func (d *decisionLog) admit(now time.Time) bool {
	d.mu.Lock()
	if el := now.Sub(d.last); el > 0 {
		d.tokens = min(d.burst, d.tokens+el.Seconds()*d.rate)
		d.last = now
	}
	ok := d.tokens >= 1
	if ok {
		d.tokens--
	}
	d.mu.Unlock()
	if !ok {
		d.rateLimited.Add(1)
	}
	return ok
}

// record builds, masks, encodes and buffers the record of a decision that
// keep sampled in. It never blocks but on d.mu, held briefly.
func (d *decisionLog) record(c *Client, v *view, req *Request, dec *Decision, now time.Time, latency time.Duration, disagree []string) {
	input, http, changed, err := d.mask.mask(req)
	if err != nil {
		d.maskFailed.Add(1)
		return
	}
	id := d.identity.Load()
	rec := DecisionRecord{
		Time:                now,
		Org:                 id.org,
		Team:                id.team,
		Employee:            id.employee,
		ClientAddress:       c.cfg.ClientAddress,
		Request:             DecisionRequest{Tool: req.Tool, Input: input, HTTP: http},
		Allowed:             dec.Allowed,
		Policy:              dec.Policy,
		Reason:              dec.Reason,
		Message:             dec.Message,
		Version:             v.version,
		LatencyUS:           latency.Microseconds(),
		ShadowDisagreements: disagree,
		Masked:              changed,
	}
	b, err := json.Marshal(&rec)
	if err != nil {
		d.maskFailed.Add(1)
		return
	}
	d.push(b)
}

// push appends b, dropping the oldest records until it fits.
func (d *decisionLog) push(b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(b) > d.maxBytes {
		d.bufferFull++
		return
	}
	for d.bytes+len(b) > d.maxBytes {
		d.bytes -= len(d.buf[d.head])
		d.buf[d.head] = nil
		d.head++
		d.bufferFull++
	}
	if d.head > 0 && d.head >= len(d.buf)/2 {
		n := copy(d.buf, d.buf[d.head:])
		clear(d.buf[n:])
		d.buf, d.head = d.buf[:n], 0
	}
	d.buf = append(d.buf, b)
	d.bytes += len(b)
	if len(d.buf)-d.head >= decisionsv1.MaxBatchRecords || d.bytes >= decisionsv1.MaxBatchBytes {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// setIdentity records who the client decides for: the token's claims
// where it has them, else what cfg names.
func (d *decisionLog) setIdentity(cfg *Config, token string) {
	id := decisionIdentity{org: cfg.Scope.Org, team: cfg.Scope.Team, employee: cfg.Scope.Employee}
	if cfg.Transport == TransportWS {
		id = decisionIdentity{employee: cfg.Employee}
	}
	if cl, ok := tokenClaims(token); ok {
		id = decisionIdentity{org: cl.Org, team: cl.Team, employee: cl.Sub}
	}
	if cur := d.identity.Load(); cur == nil || *cur != id {
		d.identity.Store(&id)
	}
}

// tokenClaims reads a JWT's org, team and sub claims without verifying
// it: they only label records.
func tokenClaims(token string) (cl struct{ Org, Team, Sub string }, ok bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return cl, false
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return cl, false
	}
	var raw struct {
		Org  string `json:"org"`
		Team string `json:"team"`
		Sub  string `json:"sub"`
	}
	if json.Unmarshal(b, &raw) != nil || (raw.Org == "" && raw.Sub == "") {
		return cl, false
	}
	cl.Org, cl.Team, cl.Sub = raw.Org, raw.Team, raw.Sub
	return cl, true
}

// DecisionLogStats returns the decision log's counters (zero when
// Config.DecisionLog is nil).
func (c *Client) DecisionLogStats() DecisionLogStats {
	d := c.dlog
	if d == nil {
		return DecisionLogStats{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return DecisionLogStats{
		Recorded:   d.recorded.Load(),
		SampledOut: d.sampledOut.Load(),
		Taken:      d.taken,
		Dropped: DecisionLogDrops{
			BufferFull:  d.bufferFull,
			RateLimited: d.rateLimited.Load(),
			MaskFailed:  d.maskFailed.Load(),
		},
		BufferedBytes:   d.bytes,
		BufferedRecords: len(d.buf) - d.head,
		Shipped:         d.shipped.Load(),
		Refused:         d.refused.Load(),
		ShipFailures:    d.shipFailures.Load(),
	}
}

// TakeDecisions removes the oldest records from the buffer, oldest first,
// up to maxBytes of them (at least one, if any is held, so a record
// larger than maxBytes still goes), and returns them: each a
// DecisionRecord encoded as a JSON object. A shipper that fails to deliver
// them gives them back with ReturnDecisions. Nil: none held, or the
// decision log is off.
func (c *Client) TakeDecisions(maxBytes int) [][]byte {
	d := c.dlog
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out [][]byte
	n := 0
	for d.head < len(d.buf) {
		b := d.buf[d.head]
		if len(out) > 0 && n+len(b) > maxBytes {
			break
		}
		out = append(out, b)
		n += len(b)
		d.buf[d.head] = nil
		d.head++
	}
	if d.head == len(d.buf) {
		d.buf, d.head = d.buf[:0], 0
	}
	d.bytes -= n
	d.taken += uint64(len(out))
	return out
}

// ReturnDecisions puts back a batch TakeDecisions gave that could not be
// delivered, ahead of the records buffered since, so that order is kept
// (with one shipper). If the buffer cannot hold them all with what it
// took meanwhile, the oldest are dropped and counted, as for a full
// buffer.
func (c *Client) ReturnDecisions(batch [][]byte) {
	d := c.dlog
	if d == nil || len(batch) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.taken -= min(d.taken, uint64(len(batch)))
	held := d.buf[d.head:]
	room := d.maxBytes - d.bytes
	keep := len(batch) // batch[len(batch)-keep:] go back: the newest that fit
	n := 0
	for i := len(batch) - 1; i >= 0; i-- {
		if n+len(batch[i]) > room {
			keep = len(batch) - 1 - i
			break
		}
		n += len(batch[i])
	}
	d.bufferFull += uint64(len(batch) - keep)
	buf := make([][]byte, 0, keep+len(held))
	buf = append(buf, batch[len(batch)-keep:]...)
	buf = append(buf, held...)
	d.buf, d.head = buf, 0
	d.bytes += n
}
