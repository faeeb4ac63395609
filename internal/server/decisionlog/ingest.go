package decisionlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/decisions"
	"github.com/policyd/policyd/internal/policy"
)

// ErrInvalid is a batch with drop counts no sidecar could have, refused
// whole.
var ErrInvalid = errors.New("invalid decision batch")

// maxDropCount bounds one batch's drop counts: a sidecar reports a
// second's worth, so anything near it is hostile or broken.
const maxDropCount = 1 << 32

// maxClockSkew is how far ahead of the node's clock a record may be
// stamped; later ones are stamped with the time they arrived.
const maxClockSkew = 5 * time.Minute

// Batch is what a sidecar reported, with who the node says it is.
type Batch struct {
	// Identity is the scope the node serves the sidecar under.
	Identity      policy.Identity
	ClientAddress string
	Transport     string // "grpc" or "ws"
	Records       [][]byte
	Dropped       decisionsv1.Drops
	// Resent is true when a refused batch stays with the sidecar, which
	// sends it again (gRPC's answer); otherwise refused records are lost
	// and counted as dropped.
	Resent bool
}

// Result counts what Ingest kept and refused of a batch's records.
type Result struct {
	Accepted, Refused int
}

// Ingest keeps a batch's records: each must decode as a decisionsv1.Record
// and name no identity other than b.Identity; the node then sets the
// identity, its own ID and the transport, and stores the record
// re-encoded, so what is kept is valid UTF-8 JSON whatever came in. The
// batch's drop counts are kept as one Unrecorded entry. ErrTooLarge,
// ErrInvalid and ErrRateLimited refuse the whole batch.
func (l *Log) Ingest(b Batch) (Result, error) {
	n := len(b.Records)
	size := 0
	for _, r := range b.Records {
		size += len(r)
	}
	if n > decisionsv1.MaxBatchRecords || size > decisionsv1.MaxBatchBytes {
		l.dropped.WithLabelValues("too_large").Add(float64(n))
		return Result{Refused: n}, fmt.Errorf("%w: %d records, %d bytes (at most %d, %d)", ErrTooLarge, n, size, decisionsv1.MaxBatchRecords, decisionsv1.MaxBatchBytes)
	}
	d := b.Dropped
	if d.SampledOut > maxDropCount || d.BufferFull > maxDropCount || d.RateLimited > maxDropCount || d.MaskFailed > maxDropCount {
		l.dropped.WithLabelValues("invalid").Add(float64(n))
		return Result{Refused: n}, fmt.Errorf("%w: drop counts %+v", ErrInvalid, d)
	}
	now := l.now()
	if !l.admit(b, now, n) {
		if !b.Resent {
			l.dropped.WithLabelValues("rate_limited").Add(float64(n))
		}
		return Result{Refused: n}, fmt.Errorf("%w: over %d records a second for %s", ErrRateLimited, l.cfg.MaxRecordsPerSecond, b.ClientAddress)
	}

	recs := make([]decisions.Record, 0, n+1)
	var res Result
	for _, raw := range b.Records {
		rec, reason := l.check(b, raw, now)
		if reason != "" {
			l.dropped.WithLabelValues(reason).Inc()
			res.Refused++
			continue
		}
		recs = append(recs, rec)
	}
	kept := len(recs)
	if d != (decisionsv1.Drops{}) {
		recs = append(recs, l.unrecorded(b, now))
	}
	if err := l.store.Append(recs); err != nil {
		l.dropped.WithLabelValues("store").Add(float64(kept))
		return Result{Refused: n}, fmt.Errorf("keep %d decision records: %w", kept, err)
	}
	if l.export != nil {
		if err := l.export.write(recs); err != nil {
			l.logger.Warn("decision log: export failed", "file", l.cfg.ExportFile, "err", err)
		}
	}
	res.Accepted = kept
	l.received.WithLabelValues(b.Transport).Add(float64(kept))
	for _, sdk := range [...]struct {
		reason string
		n      uint64
	}{{"sdk_buffer_full", d.BufferFull}, {"sdk_rate_limited", d.RateLimited}, {"sdk_mask_failed", d.MaskFailed}} {
		if sdk.n > 0 {
			l.dropped.WithLabelValues(sdk.reason).Add(float64(sdk.n))
		}
	}
	return res, nil
}

// admit takes n records from the sidecar's bucket.
func (l *Log) admit(b Batch, now time.Time, n int) bool {
	if n == 0 {
		return true
	}
	key := b.Transport + "\x00" + b.ClientAddress + "\x00" + b.Identity.Employee
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.limiters[key]
	if lim == nil {
		r := l.cfg.MaxRecordsPerSecond
		lim = &limiter{bucket: rate.NewLimiter(rate.Limit(r), 2*r)}
		l.limiters[key] = lim
	}
	lim.used = now
	return lim.bucket.AllowN(now, n)
}

// check decodes one record and stamps it, or says why it is refused
// (a dropped_total reason).
func (l *Log) check(b Batch, raw []byte, now time.Time) (decisions.Record, string) {
	if len(raw) > decisionsv1.MaxRecordBytes {
		return decisions.Record{}, "too_large"
	}
	var r decisionsv1.Record
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers in inputs are kept as written
	if err := dec.Decode(&r); err != nil || dec.More() {
		return decisions.Record{}, "invalid"
	}
	id := b.Identity
	if (r.Org != "" && r.Org != id.Org) || (r.Team != "" && r.Team != id.Team) || (r.Employee != "" && r.Employee != id.Employee) {
		return decisions.Record{}, "identity"
	}
	switch {
	case r.Time.IsZero() || r.Time.Before(time.Unix(0, 0)):
		return decisions.Record{}, "invalid"
	case r.Time.After(now.Add(maxClockSkew)):
		r.Time = now
	}
	r.Org, r.Team, r.Employee, r.ClientAddress = id.Org, id.Team, id.Employee, b.ClientAddress
	r.Node, r.Transport, r.Unrecorded = l.nodeID, b.Transport, nil
	data, err := json.Marshal(r)
	if err != nil || len(data) > decisions.MaxRecordBytes {
		return decisions.Record{}, "invalid"
	}
	return decisions.Record{Time: r.Time.UTC(), Data: data}, ""
}

// unrecorded is the entry that keeps a batch's drop counts.
func (l *Log) unrecorded(b Batch, now time.Time) decisions.Record {
	d := b.Dropped
	r := decisionsv1.Record{
		Time: now.UTC(), Org: b.Identity.Org, Team: b.Identity.Team, Employee: b.Identity.Employee,
		ClientAddress: b.ClientAddress, Node: l.nodeID, Transport: b.Transport, Unrecorded: &d,
	}
	data, _ := json.Marshal(r) // only strings and counts: cannot fail
	return decisions.Record{Time: r.Time, Data: data}
}
