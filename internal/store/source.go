package store

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// Policy sources (docs/sources.md). Bucket sources holds one record per
// source, by name: what its last committed sync read, and the last request
// for a sync. The policies a source owns carry its name in their source
// field; a sync applies whole or not at all.
var bucketSources = []byte("sources")

// EntitySource is a source's record; its changes are notified, not logged
// as events (the policies a sync writes are).
const EntitySource EntityType = "source"

// SourceRecord is a source's replicated state.
type SourceRecord struct {
	Source string `json:"source"`
	// Revision is what the last complete sync read (a resourceVersion or a
	// commit), SyncedAt and SyncIndex when and at which index it applied.
	Revision  string    `json:"revision,omitempty"`
	SyncedAt  time.Time `json:"synced_at,omitzero"`
	SyncIndex uint64    `json:"sync_index,omitempty"`
	// Policies is how many policies the source owns.
	Policies int `json:"policies"`
	// RequestIndex is the index of the last sync request; AllowPrune is
	// its grant, until a sync answering it uses it up.
	RequestIndex uint64 `json:"request_index,omitempty"`
	AllowPrune   bool   `json:"allow_prune,omitempty"`
}

// SourceSync is one part of a source's sync, as the FSM hands it over.
type SourceSync struct {
	Source   string
	Revision string
	Puts     []*policy.Policy
	Deletes  []string
	// Adopt names the puts that may take a policy from another owner.
	Adopt map[string]bool
	// Last is true for a sync's last part, which records its revision.
	Last bool
	// Request is the sync request this sync answers.
	Request uint64
}

// ManagedError refuses a write through the API (or by another source) of a
// policy a source owns.
func ManagedError(name, kind, source string) error {
	return fmt.Errorf("managed by %s (%s %s); change it there: %w", source, kind, name, ErrConflict)
}

// checkOwner refuses a write of name by writer ("" for the API) when the
// policy exists and another owns it.
func checkOwner(tx *bolt.Tx, name, writer string, adopt bool) error {
	h, err := getHead(tx, name)
	if err != nil || h == nil || h.Source == writer || adopt {
		return err
	}
	if h.Source == "" {
		return fmt.Errorf("policy %q is owned by the API, not %s (set adopt to take it over): %w", name, writer, ErrConflict)
	}
	if writer == "" {
		return ManagedError(name, h.Kind, h.Source)
	}
	return fmt.Errorf("policy %q is owned by %s, not %s (set adopt to take it over): %w", name, h.Source, writer, ErrConflict)
}

// CheckAPIWrite refuses a write through the API of a policy a source owns.
func (b *Batch) CheckAPIWrite(name string) error { return checkOwner(b.tx, name, "", false) }

// CheckWriter refuses a write by writer (a source, or "" for the API) of
// a policy another owns: a staged rollout's changes, for instance.
func (b *Batch) CheckWriter(name, writer string) error { return checkOwner(b.tx, name, writer, false) }

// SyncSource applies one part of a sync: every put and delete, each with
// its event, or (ErrConflict) none when any would take a policy the source
// does not own or that a rollout stages. Deletes of policies that are gone
// already are skipped.
func (b *Batch) SyncSource(m Meta, s SourceSync, locked func(name string) error) error {
	rec, err := b.sourceRecord(s.Source)
	if err != nil {
		return err
	}
	gained := map[string]int{}
	for _, p := range s.Puts {
		if err := checkOwner(b.tx, p.Name, s.Source, s.Adopt[p.Name]); err != nil {
			return err
		}
		if err := locked(p.Name); err != nil {
			return err
		}
		h, err := getHead(b.tx, p.Name)
		if err != nil {
			return err
		}
		if h == nil || h.Source != s.Source {
			gained[s.Source]++
			if h != nil {
				gained[h.Source]--
			}
		}
	}
	var deletes []string
	for _, name := range s.Deletes {
		h, err := getHead(b.tx, name)
		if err != nil {
			return err
		}
		if h == nil {
			continue
		}
		if h.Source != s.Source {
			return fmt.Errorf("sync %s deletes policy %q, owned by %q: %w", s.Source, name, h.Source, ErrConflict)
		}
		if err := locked(name); err != nil {
			return err
		}
		deletes = append(deletes, name)
		gained[s.Source]--
	}
	// Every check passed: nothing below refuses, so the entry applies whole.
	b.seqEvents, b.evIndex = true, 0
	defer func() { b.seqEvents = false }()
	for _, p := range s.Puts {
		cp := *p
		cp.Source = s.Source
		if _, _, err := b.PutPolicy(m, &cp, nil); err != nil {
			return fmt.Errorf("sync %s: %w", s.Source, err)
		}
	}
	for _, name := range deletes {
		if err := b.DeletePolicy(m, name, nil); err != nil {
			return fmt.Errorf("sync %s: %w", s.Source, err)
		}
	}
	for src, n := range gained {
		if src == "" || src == s.Source || n == 0 {
			continue
		}
		other, err := b.sourceRecord(src)
		if err != nil {
			return err
		}
		other.Policies += n
		if err := b.putSourceRecord(m, other); err != nil {
			return err
		}
	}
	rec.Policies += gained[s.Source]
	if s.Last {
		rec.Revision, rec.SyncedAt, rec.SyncIndex = s.Revision, m.ProcessedAt, m.Index
	}
	if s.Request != 0 && s.Request == rec.RequestIndex {
		rec.AllowPrune = false
	}
	return b.putSourceRecord(m, rec)
}

// RequestSourceSync records a request that source sync now; a grant to
// prune stays until a sync uses it.
func (b *Batch) RequestSourceSync(m Meta, source string, allowPrune bool) error {
	rec, err := b.sourceRecord(source)
	if err != nil {
		return err
	}
	rec.RequestIndex = m.Index
	rec.AllowPrune = rec.AllowPrune || allowPrune
	return b.putSourceRecord(m, rec)
}

func (b *Batch) sourceRecord(source string) (SourceRecord, error) {
	rec := SourceRecord{Source: source}
	raw := b.tx.Bucket(bucketSources).Get([]byte(source))
	if raw == nil {
		return rec, nil
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return rec, fmt.Errorf("decode source %q: %w", source, err)
	}
	return rec, nil
}

func (b *Batch) putSourceRecord(m Meta, rec SourceRecord) error {
	raw, err := json.Marshal(&rec)
	if err != nil {
		return fmt.Errorf("encode source %q: %w", rec.Source, err)
	}
	if err := b.tx.Bucket(bucketSources).Put([]byte(rec.Source), raw); err != nil {
		return err
	}
	b.changes = append(b.changes, EntityChange{Type: EntitySource, ID: rec.Source, Action: ActionUpdate, Index: m.Index})
	return nil
}

// Sources returns every source's record, by name.
func (s *Store) Sources() ([]SourceRecord, error) {
	var out []SourceRecord
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSources).ForEach(func(k, v []byte) error {
			var rec SourceRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode source %q: %w", k, err)
			}
			out = append(out, rec)
			return nil
		})
	})
	return out, err
}

// Source returns source's record; a zero record (but its name) if it has
// none yet.
func (s *Store) Source(source string) (SourceRecord, error) {
	rec := SourceRecord{Source: source}
	err := s.view(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketSources).Get([]byte(source))
		if raw == nil {
			return nil
		}
		return json.Unmarshal(raw, &rec)
	})
	if err != nil {
		return rec, fmt.Errorf("read source %q: %w", source, err)
	}
	return rec, nil
}
