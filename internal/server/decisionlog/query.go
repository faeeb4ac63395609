package decisionlog

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/decisions"
)

// Limits of one page of GET /v1/decisions.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// maxAnswerBytes is the records one LocalDecisions answer carries at most,
// well inside the peer connection's 4 MiB message limit.
const maxAnswerBytes = 2 << 20

// CompareKeys orders records newest first: by time, then node, then
// position in the node's store, each descending.
func CompareKeys(a, b *clusterv1.DecisionKey) int {
	return cmp.Or(
		cmp.Compare(b.GetTimeUnixNano(), a.GetTimeUnixNano()),
		cmp.Compare(b.GetNodeId(), a.GetNodeId()),
		cmp.Compare(b.GetPosition(), a.GetPosition()),
	)
}

// filter is the fields a query selects on.
type filter struct {
	Org        string    `json:"org"`
	Team       string    `json:"team"`
	Employee   string    `json:"employee"`
	Policy     string    `json:"policy"`
	Allowed    bool      `json:"allowed"`
	Unrecorded *struct{} `json:"unrecorded"`
}

// LocalDecisions answers this node's part of GET /v1/decisions: the newest
// req.Limit records kept here that match, before req.Before, with their
// keys, newest first, and whether older ones may match too (More, also
// when the byte budget cut the answer short).
func (l *Log) LocalDecisions(ctx context.Context, req *clusterv1.LocalDecisionsRequest) (*clusterv1.LocalDecisionsResponse, error) {
	limit := int(req.GetLimit())
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	var since, until time.Time
	if t := req.GetSinceUnixNano(); t > 0 {
		since = time.Unix(0, t)
	}
	if t := req.GetUntilUnixNano(); t > 0 {
		until = time.Unix(0, t)
	}
	before := req.GetBefore()
	type hit struct {
		key  *clusterv1.DecisionKey
		data []byte
	}
	var hits []hit
	trim := func() {
		slices.SortFunc(hits, func(a, b hit) int { return CompareKeys(a.key, b.key) })
		hits = hits[:min(len(hits), limit)]
	}
	var err error
	n := 0
	_, serr := l.store.ScanFrom(l.store.Seek(since), until, func(r decisions.Record, next decisions.Cursor) bool {
		if n++; n%4096 == 0 && ctx.Err() != nil {
			err = ctx.Err()
			return false
		}
		if !since.IsZero() && r.Time.Before(since) {
			return true
		}
		key := &clusterv1.DecisionKey{TimeUnixNano: r.Time.UnixNano(), NodeId: l.nodeID, Position: next.Position()}
		if before != nil && CompareKeys(key, before) <= 0 {
			return true
		}
		if !matches(req, r.Data) {
			return true
		}
		hits = append(hits, hit{key, bytes.Clone(r.Data)})
		if len(hits) >= 2*limit {
			trim()
		}
		return true
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return nil, err
	}
	trim()
	// A full page may have older matches behind it.
	resp := &clusterv1.LocalDecisionsResponse{NodeId: l.nodeID, More: len(hits) == limit}
	size := 0
	for _, h := range hits {
		if size += len(h.data); size > maxAnswerBytes && len(resp.Records) > 0 {
			resp.More = true
			break
		}
		resp.Records = append(resp.Records, h.data)
		resp.Keys = append(resp.Keys, h.key)
	}
	return resp, nil
}

// matches reports whether a stored record is a decision that req selects.
func matches(req *clusterv1.LocalDecisionsRequest, data []byte) bool {
	var f filter
	if json.Unmarshal(data, &f) != nil || f.Unrecorded != nil {
		return false
	}
	switch {
	case req.GetOrg() != "" && f.Org != req.GetOrg(),
		req.GetTeam() != "" && f.Team != req.GetTeam(),
		req.GetEmployee() != "" && f.Employee != req.GetEmployee(),
		req.GetPolicy() != "" && f.Policy != req.GetPolicy(),
		req.GetResult() == decisionsv1.ResultAllow && !f.Allowed,
		req.GetResult() == decisionsv1.ResultDeny && f.Allowed:
		return false
	}
	return true
}

// Scan hands fn every record kept here at or after since (decisions and
// Unrecorded entries alike), in arrival order, until fn returns false or
// ctx ends. Data is valid only during the call.
func (l *Log) Scan(ctx context.Context, since time.Time, fn func(data []byte) bool) error {
	var err error
	n := 0
	serr := l.store.Scan(since, time.Time{}, func(r decisions.Record) bool {
		if n++; n%4096 == 0 && ctx.Err() != nil {
			err = ctx.Err()
			return false
		}
		return fn(r.Data)
	})
	if err != nil {
		return err
	}
	return serr
}

// Sync flushes what was kept to disk (tests and shutdown).
func (l *Log) Sync() error { return l.store.Sync() }

// Merge takes the newest limit records of the members' answers, newest
// first. A member with More has older matches it did not send, so nothing
// older than its last key is taken: that member's next page may hold
// records in between. next is where the next page begins (nil: none).
func Merge(limit int, answers []*clusterv1.LocalDecisionsResponse) (records [][]byte, next *clusterv1.DecisionKey) {
	type hit struct {
		key  *clusterv1.DecisionKey
		data []byte
	}
	var hits []hit
	var horizon *clusterv1.DecisionKey
	for _, a := range answers {
		keys := a.GetKeys()
		for i, d := range a.GetRecords() {
			if i < len(keys) {
				hits = append(hits, hit{keys[i], d})
			}
		}
		if a.GetMore() && len(keys) > 0 {
			if last := keys[len(keys)-1]; horizon == nil || CompareKeys(last, horizon) < 0 {
				horizon = last
			}
		}
	}
	slices.SortFunc(hits, func(a, b hit) int { return CompareKeys(a.key, b.key) })
	n := 0
	for n < len(hits) && n < limit && (horizon == nil || CompareKeys(hits[n].key, horizon) <= 0) {
		records = append(records, hits[n].data)
		n++
	}
	if n > 0 && (n < len(hits) || horizon != nil) {
		next = hits[n-1].key
	}
	return records, next
}

// EncodeCursor makes a page's next key an opaque URL-safe cursor.
func EncodeCursor(k *clusterv1.DecisionKey) string {
	b, _ := proto.Marshal(k) // a message of scalars: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor reads what EncodeCursor made; "" is the first page.
func ParseCursor(s string) (*clusterv1.DecisionKey, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	k := &clusterv1.DecisionKey{}
	if err != nil || len(b) > 512 || proto.Unmarshal(b, k) != nil || k.GetTimeUnixNano() <= 0 {
		return nil, fmt.Errorf("cursor %.64q is not one a decision page gave", s)
	}
	return k, nil
}
