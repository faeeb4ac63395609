package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// EntityReload is a restart by the ConfigMap reload controller.
const EntityReload EntityType = "reload"

// The reload controller's replicated state (docs/operations.md): the data-hash
// cache and the pending-restart queue, both keyed by (scope value, ConfigMap
// name), and bounded logs of the last restarts and failed attempts.
var (
	bucketReloadHashes   = []byte("reload_hashes")
	bucketReloadPending  = []byte("reload_pending")
	bucketReloadRestarts = []byte("reload_restarts")
	bucketReloadErrors   = []byte("reload_errors")
)

// MaxReloadLog bounds the restart and error logs: the oldest entries are
// dropped first. Restarts are also events of type reload, which retention
// prunes by age instead.
const MaxReloadLog = 100

// ReloadKey names one ConfigMap within one scope (the value of its scope
// label).
type ReloadKey struct {
	Scope     string `json:"scope"`
	ConfigMap string `json:"configmap"`
}

func (k ReloadKey) bytes() []byte { return []byte(k.Scope + "\x00" + k.ConfigMap) }

// String is scope/configmap, the event's entity ID.
func (k ReloadKey) String() string { return k.Scope + "/" + k.ConfigMap }

// ReloadHash is one hash-cache entry.
type ReloadHash struct {
	ReloadKey
	Hash string `json:"hash"`
	// Index is the Raft index that last changed the entry.
	Index     uint64    `json:"index"`
	UpdatedAt time.Time `json:"updated_at"`
}

// ReloadPending is one queued restart: due at DueAt, after Attempts failed
// attempts.
type ReloadPending struct {
	ReloadKey
	// Hash is the ConfigMap data hash the restart rolls out.
	Hash  string    `json:"hash"`
	DueAt time.Time `json:"due_at"`
	// Attempts counts failed attempts since the last (re)scheduling.
	Attempts  uint32 `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
	Reason    string `json:"reason"`
	// Index is the Raft index that (re)scheduled it; completing or failing
	// an attempt names it, so a stale attempt cannot clear a newer change.
	Index       uint64    `json:"index"`
	ScheduledAt time.Time `json:"scheduled_at"`
}

// ReloadRestart is one completed restart: the Deployments patched with the
// hash, and those skipped because they already carried it.
type ReloadRestart struct {
	ReloadKey
	Hash        string    `json:"hash"`
	Patched     []string  `json:"patched"`
	Skipped     []string  `json:"skipped,omitempty"`
	Attempts    uint32    `json:"attempts"`
	Reason      string    `json:"reason"`
	RestartedAt time.Time `json:"restarted_at"`
	Index       uint64    `json:"index"`
}

// ReloadError is one failed restart attempt.
type ReloadError struct {
	ReloadKey
	Hash     string    `json:"hash"`
	Attempts uint32    `json:"attempts"`
	Error    string    `json:"error"`
	RetryAt  time.Time `json:"retry_at"`
	FailedAt time.Time `json:"failed_at"`
	Index    uint64    `json:"index"`
}

// ReloadObservation is what ObserveReload records for one ConfigMap.
type ReloadObservation struct {
	ReloadKey
	Hash string
	// Schedule (re)queues a restart due at DueAt with no attempts,
	// replacing any pending one for the key: a fresh change supersedes a
	// stale retry and pushes the due time (debounce coalescing).
	Schedule bool
	DueAt    time.Time
	Reason   string
}

// ReloadState is the whole replicated reload state, read in one
// transaction. Hashes and Pending are in key order; Restarts and Errors
// newest first.
type ReloadState struct {
	Index    uint64          `json:"applied_index"`
	Hashes   []ReloadHash    `json:"hashes"`
	Pending  []ReloadPending `json:"pending"`
	Restarts []ReloadRestart `json:"restarts"`
	Errors   []ReloadError   `json:"errors"`
}

// ObserveReload updates the hash cache and, for observations with Schedule,
// the pending queue, in the same transaction.
func (b *Batch) ObserveReload(m Meta, obs []ReloadObservation) error {
	hashes, pending := b.tx.Bucket(bucketReloadHashes), b.tx.Bucket(bucketReloadPending)
	for _, o := range obs {
		h := ReloadHash{ReloadKey: o.ReloadKey, Hash: o.Hash, Index: m.Index, UpdatedAt: m.ProcessedAt}
		if err := putJSON(hashes, o.bytes(), &h); err != nil {
			return err
		}
		if !o.Schedule {
			continue
		}
		p := ReloadPending{
			ReloadKey: o.ReloadKey, Hash: o.Hash, DueAt: o.DueAt.UTC(), Reason: o.Reason,
			Index: m.Index, ScheduledAt: m.ProcessedAt,
		}
		if err := putJSON(pending, o.bytes(), &p); err != nil {
			return err
		}
	}
	return nil
}

// RecordReloadRestart logs a completed restart, also as an event of type
// reload, and removes the pending entry scheduled at pendingIndex; a newer
// change's entry (another index) stays. r.Index is set from m.
func (b *Batch) RecordReloadRestart(m Meta, pendingIndex uint64, r ReloadRestart) error {
	r.Index = m.Index
	if err := b.clearPending(r.ReloadKey, pendingIndex); err != nil {
		return err
	}
	raw, err := json.Marshal(&r)
	if err != nil {
		return fmt.Errorf("encode reload restart %s: %w", r.ReloadKey, err)
	}
	if err := appendBounded(b.tx.Bucket(bucketReloadRestarts), m.Index, raw); err != nil {
		return err
	}
	// Reload state is cluster-wide, not an org's: the event is global.
	return b.record(m, EntityReload, r.String(), ActionUpdate, raw, []policy.Scope{{}})
}

// RecordReloadError logs a failed attempt and, if the pending entry is still
// the one scheduled at pendingIndex, stores its attempt count, error and
// retry time. e.Index is set from m.
func (b *Batch) RecordReloadError(m Meta, pendingIndex uint64, e ReloadError) error {
	e.Index = m.Index
	raw, err := json.Marshal(&e)
	if err != nil {
		return fmt.Errorf("encode reload error %s: %w", e.ReloadKey, err)
	}
	if err := appendBounded(b.tx.Bucket(bucketReloadErrors), m.Index, raw); err != nil {
		return err
	}
	bk := b.tx.Bucket(bucketReloadPending)
	var p ReloadPending
	found, err := getJSON(bk, string(e.bytes()), &p)
	if err != nil || !found || p.Index != pendingIndex {
		return err
	}
	p.Attempts, p.LastError, p.DueAt = e.Attempts, e.Error, e.RetryAt.UTC()
	return putJSON(bk, e.bytes(), &p)
}

func (b *Batch) clearPending(k ReloadKey, pendingIndex uint64) error {
	bk := b.tx.Bucket(bucketReloadPending)
	var p ReloadPending
	found, err := getJSON(bk, string(k.bytes()), &p)
	if err != nil || !found || p.Index != pendingIndex {
		return err
	}
	return bk.Delete(k.bytes())
}

// appendBounded stores raw under the big-endian index and drops the oldest
// entries beyond MaxReloadLog.
func appendBounded(bk *bolt.Bucket, index uint64, raw []byte) error {
	if err := bk.Put(u64(index), raw); err != nil {
		return err
	}
	// Count with a cursor: Bucket.Stats does not see this transaction's
	// uncommitted writes. The log is small, so this stays cheap.
	n := 0
	c := bk.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	for k, _ := c.First(); k != nil && n > MaxReloadLog; k, _ = c.First() {
		if err := c.Delete(); err != nil {
			return err
		}
		n--
	}
	return nil
}

func putJSON(bk *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %q: %w", strings.ReplaceAll(string(key), "\x00", "/"), err)
	}
	return bk.Put(key, raw)
}

// ReloadState reads the reload controller's replicated state.
func (s *Store) ReloadState() (*ReloadState, error) {
	st := &ReloadState{Hashes: []ReloadHash{}, Pending: []ReloadPending{}, Restarts: []ReloadRestart{}, Errors: []ReloadError{}}
	err := s.view(func(tx *bolt.Tx) error {
		st.Index = getUint(tx.Bucket(bucketMeta), keyAppliedIndex)
		if err := forEachJSON(tx, bucketReloadHashes, false, &st.Hashes); err != nil {
			return err
		}
		if err := forEachJSON(tx, bucketReloadPending, false, &st.Pending); err != nil {
			return err
		}
		if err := forEachJSON(tx, bucketReloadRestarts, true, &st.Restarts); err != nil {
			return err
		}
		return forEachJSON(tx, bucketReloadErrors, true, &st.Errors)
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// forEachJSON decodes every value of a bucket into *out, in key order or,
// with reverse, newest (highest key) first.
func forEachJSON[T any](tx *bolt.Tx, bucket []byte, reverse bool, out *[]T) error {
	c := tx.Bucket(bucket).Cursor()
	first, next := c.First, c.Next
	if reverse {
		first, next = c.Last, c.Prev
	}
	for k, v := first(); k != nil; k, v = next() {
		var x T
		if err := json.Unmarshal(v, &x); err != nil {
			return fmt.Errorf("decode stored %s entry %q: %w", bucket, k, err)
		}
		*out = append(*out, x)
	}
	return nil
}
