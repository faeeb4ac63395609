package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// Event is one recorded change. ID is the Raft index of the
// command, so events are totally ordered and identical on every node.
type Event struct {
	ID           uint64          `json:"id"`
	EntityType   EntityType      `json:"entity_type"`
	Org          string          `json:"org"`
	Action       Action          `json:"action"`
	EntityID     string          `json:"entity_id"`
	Data         json.RawMessage `json:"data"`
	OriginatedAt time.Time       `json:"originated_at"`
	ProcessedAt  time.Time       `json:"processed_at"`
	// Actor is who made the change (commandv1.Command.actor): "token:NAME",
	// "cert:SUBJECT", "task:NAME" or "anonymous"; empty in events written
	// before command version 3.
	Actor     string `json:"actor,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// RevertedTo is the revision a revert wrote back; 0 for other writes.
	RevertedTo uint64 `json:"reverted_to,omitempty"`
}

// EntityState is the version of one entity type in one org: the Raft index of
// its last change.
type EntityState struct {
	EntityType EntityType `json:"entity_type"`
	Org        string     `json:"org"`
	Version    uint64     `json:"version"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// GetPolicy returns the named policy or ErrNotFound.
func (s *Store) GetPolicy(name string) (*policy.Policy, error) {
	var p *policy.Policy
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketPolicies).Get([]byte(name))
		if v == nil {
			return fmt.Errorf("policy %q: %w", name, ErrNotFound)
		}
		var err error
		p, _, err = decodePolicy([]byte(name), v)
		return err
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// PolicyFilter selects policies. Zero values select everything.
type PolicyFilter struct {
	// Identity, when set, keeps only the policies that apply to it.
	Identity *policy.Identity
	Kind     string
}

// ListPolicies returns the policies matching f, sorted by name.
func (s *Store) ListPolicies(f PolicyFilter) ([]*policy.Policy, error) {
	var out []*policy.Policy
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPolicies).ForEach(func(k, v []byte) error {
			p, _, err := decodePolicy(k, v)
			if err != nil {
				return err
			}
			if f.Kind != "" && p.Kind != f.Kind {
				return nil
			}
			if f.Identity != nil && !p.Scope.AppliesTo(*f.Identity) {
				return nil
			}
			out = append(out, p)
			return nil
		})
	})
	return out, err
}

// PolicySet is the set of policies that apply to one identity, with its
// version.
type PolicySet struct {
	Identity policy.Identity
	// Version is the lowercase hex SHA-256 over the applicable policies
	// sorted by name, feeding each name and then its stored bytes. It
	// depends only on content, so every replica computes the same one.
	Version string
	// Index is the applied index the set was read at.
	Index    uint64
	Policies []*policy.Policy
}

// PolicySet reads the policies that apply to id and their version, in one
// transaction.
func (s *Store) PolicySet(id policy.Identity) (*PolicySet, error) {
	set := &PolicySet{Identity: id}
	err := s.view(func(tx *bolt.Tx) error {
		set.Index = getUint(tx.Bucket(bucketMeta), keyAppliedIndex)
		h := NewSetHash()
		// ForEach visits keys in byte order, which is name order.
		err := tx.Bucket(bucketPolicies).ForEach(func(k, v []byte) error {
			p, _, err := decodePolicy(k, v)
			if err != nil {
				return err
			}
			if !p.Scope.AppliesTo(id) {
				return nil
			}
			h.Add(string(k), v)
			set.Policies = append(set.Policies, p)
			return nil
		})
		set.Version = h.Sum()
		return err
	})
	if err != nil {
		return nil, err
	}
	return set, nil
}

// SetHash computes a policy-set version. Feed it the
// applicable policies in name order: each name, then its stored bytes. It is
// the one implementation of the version, used by PolicySet and by the
// in-memory indexes that serve sidecars, so they always agree.
type SetHash struct{ h hash.Hash }

// NewSetHash starts an empty set's version.
func NewSetHash() *SetHash { return &SetHash{h: sha256.New()} }

// Add feeds one policy.
func (s *SetHash) Add(name string, stored []byte) {
	s.h.Write([]byte(name))
	s.h.Write(stored)
}

// Sum is the lowercase hex version.
func (s *SetHash) Sum() string { return hex.EncodeToString(s.h.Sum(nil)) }

// RawPolicy is a policy as stored: its canonical bytes and the decoded value.
type RawPolicy struct {
	Policy *policy.Policy
	Stored []byte
}

// RawPolicies reads the named policies (all of them when names is empty) in
// one transaction, with the applied index they were read at. A name that does
// not exist is absent from the map.
func (s *Store) RawPolicies(names ...string) (map[string]RawPolicy, uint64, error) {
	out := map[string]RawPolicy{}
	var index uint64
	err := s.view(func(tx *bolt.Tx) error {
		index = getUint(tx.Bucket(bucketMeta), keyAppliedIndex)
		bk := tx.Bucket(bucketPolicies)
		add := func(k, v []byte) error {
			p, stored, err := decodePolicy(k, v)
			if err != nil {
				return err
			}
			out[string(k)] = RawPolicy{Policy: p, Stored: stored}
			return nil
		}
		if len(names) == 0 {
			return bk.ForEach(add)
		}
		for _, n := range names {
			if v := bk.Get([]byte(n)); v != nil {
				if err := add([]byte(n), v); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return out, index, nil
}

// GetEmployee returns the employee or ErrNotFound.
func (s *Store) GetEmployee(id string) (*policy.Employee, error) {
	var e policy.Employee
	err := s.view(func(tx *bolt.Tx) error {
		found, err := getJSON(tx.Bucket(bucketEmploy), id, &e)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("employee %q: %w", id, ErrNotFound)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// FindEmployee returns the employee, or (nil, nil) when there is none: the
// lookup auth.Identify takes, where an unknown employee is not a storage
// error.
func (s *Store) FindEmployee(id string) (*policy.Employee, error) {
	e, err := s.GetEmployee(id)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	return e, err
}

// ListEmployees returns employees, optionally only those of org (and team),
// sorted by ID.
func (s *Store) ListEmployees(org, team string) ([]*policy.Employee, error) {
	var out []*policy.Employee
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketEmploy).ForEach(func(k, v []byte) error {
			var e policy.Employee
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("decode stored employee %q: %w", k, err)
			}
			if (org != "" && e.Org != org) || (team != "" && e.Team != team) {
				return nil
			}
			out = append(out, &e)
			return nil
		})
	})
	return out, err
}

// EventFilter selects events. Zero values select everything; Limit 0 means no
// limit.
type EventFilter struct {
	Type  EntityType
	Org   string
	After uint64
	Limit int
	// OrgSet distinguishes "org = global (empty)" from "any org".
	OrgSet bool
	// Actor selects the events of one actor (Event.Actor) when set.
	Actor string
}

// EventPage is a page of events in ID order.
type EventPage struct {
	Events []Event `json:"events"`
	// PrunedThrough is the highest event ID removed by retention. A reader
	// whose After is below it has missed events and must resynchronise.
	PrunedThrough uint64 `json:"pruned_through"`
	// LastID is the highest event ID examined; pass it as After to continue.
	LastID uint64 `json:"last_id"`
}

// ListEvents returns events after f.After, in ID order.
func (s *Store) ListEvents(f EventFilter) (*EventPage, error) {
	page := &EventPage{Events: []Event{}, LastID: f.After}
	err := s.view(func(tx *bolt.Tx) error {
		page.PrunedThrough = getUint(tx.Bucket(bucketMeta), keyPrunedThrough)
		if f.After == math.MaxUint64 {
			return nil // nothing comes after; f.After+1 would wrap to 0
		}
		c := tx.Bucket(bucketEvents).Cursor()
		for k, v := c.Seek(u64(f.After + 1)); k != nil; k, v = c.Next() {
			id := binary.BigEndian.Uint64(k)
			// A page ends between entries, never inside one (a rollout's
			// completion records several events at its index): the next
			// page starts after LastID.
			if f.Limit > 0 && len(page.Events) >= f.Limit && id != page.LastID {
				break
			}
			page.LastID = id
			var ev Event
			if len(v) < 8 {
				return fmt.Errorf("stored event %d is truncated", id)
			}
			if err := json.Unmarshal(v[8:], &ev); err != nil {
				return fmt.Errorf("decode stored event %d: %w", id, err)
			}
			if f.Type != "" && ev.EntityType != f.Type {
				continue
			}
			if (f.OrgSet || f.Org != "") && ev.Org != f.Org {
				continue
			}
			if f.Actor != "" && ev.Actor != f.Actor {
				continue
			}
			page.Events = append(page.Events, ev)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// ErrPruned marks a revision the event log no longer holds: retention
// removed it. It wraps ErrNotFound.
var ErrPruned = fmt.Errorf("past retention: %w", ErrNotFound)

// Revision returns the event that wrote revision rev of one policy or
// employee: a revision is the Raft index of its write, which is also its
// event's ID. ErrPruned when retention removed it, ErrNotFound when the
// entity never had that revision or it was a delete.
func (s *Store) Revision(typ EntityType, id string, rev uint64) (*Event, error) {
	var ev *Event
	err := s.view(func(tx *bolt.Tx) error {
		prefix := u64(rev)
		c := tx.Bucket(bucketEvents).Cursor()
		k, v := c.Seek(prefix)
		if k == nil || !bytes.HasPrefix(k, prefix) {
			if pruned := getUint(tx.Bucket(bucketMeta), keyPrunedThrough); rev <= pruned {
				return fmt.Errorf("revision %d of %s %q: events through %d were removed: %w", rev, typ, id, pruned, ErrPruned)
			}
			return fmt.Errorf("%s %q has no revision %d: %w", typ, id, rev, ErrNotFound)
		}
		// One entry may have recorded several events (putEvent).
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if len(v) < 8 {
				return fmt.Errorf("stored event %d is truncated", rev)
			}
			var e Event
			if err := json.Unmarshal(v[8:], &e); err != nil {
				return fmt.Errorf("decode stored event %d: %w", rev, err)
			}
			if e.EntityType == typ && e.EntityID == id && e.Action != ActionDelete {
				ev = &e
				return nil
			}
		}
		return fmt.Errorf("%s %q has no revision %d: %w", typ, id, rev, ErrNotFound)
	})
	return ev, err
}

// EntityStates returns every entity-state version.
func (s *Store) EntityStates() ([]EntityState, error) {
	var out []EntityState
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketStates).ForEach(func(k, v []byte) error {
			var st EntityState
			if err := json.Unmarshal(v, &st); err != nil {
				return fmt.Errorf("decode entity state %q: %w", k, err)
			}
			out = append(out, st)
			return nil
		})
	})
	return out, err
}

// Members returns every registered member, sorted by ID.
func (s *Store) Members() ([]Member, error) {
	var out []Member
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMembers).ForEach(func(k, v []byte) error {
			var m Member
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("decode member %q: %w", k, err)
			}
			out = append(out, m)
			return nil
		})
	})
	return out, err
}

// Member returns one member or ErrNotFound.
func (s *Store) Member(id string) (Member, error) {
	var m Member
	err := s.view(func(tx *bolt.Tx) error {
		found, err := getJSON(tx.Bucket(bucketMembers), id, &m)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("member %q: %w", id, ErrNotFound)
		}
		return nil
	})
	return m, err
}

// Digest returns a SHA-256 over every replicated bucket (not the applied
// index) and the applied index it was taken at, from one transaction. The
// buckets of sparseBuckets count only once they hold something, so that a
// replica of a release without them and an upgraded one agree until the
// first such entry.
// Replicas at the same index must have equal digests; tests and operators
// compare them.
func (s *Store) Digest() (digest string, index uint64, err error) {
	s.digestMu.Lock()
	defer s.digestMu.Unlock()
	if s.digest != "" && s.digestIndex == s.AppliedIndex() {
		return s.digest, s.digestIndex, nil
	}
	err = s.view(func(tx *bolt.Tx) error {
		index = getUint(tx.Bucket(bucketMeta), keyAppliedIndex)
		h := sha256.New()
		var n [8]byte
		writeLen := func(b []byte) {
			binary.BigEndian.PutUint64(n[:], uint64(len(b)))
			h.Write(n[:])
			h.Write(b)
		}
		writeLen(tx.Bucket(bucketMeta).Get(keyPrunedThrough))
		for _, name := range dataBuckets {
			b := tx.Bucket(name)
			if sparseBuckets[string(name)] && (b == nil || isEmpty(b)) {
				continue
			}
			writeLen(name)
			if b == nil {
				// A file from a version without this bucket, read by
				// Inspect (Open creates it): the same as an empty bucket.
				continue
			}
			if err := b.ForEach(func(k, v []byte) error {
				writeLen(k)
				writeLen(v)
				return nil
			}); err != nil {
				return err
			}
		}
		digest = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("digest %q: %w", s.path, err)
	}
	s.digest, s.digestIndex = digest, index
	return digest, index, nil
}

// sparseBuckets are the replicated buckets added after the digest's
// format was set (the rollouts', the sources'): left out of the digest
// while empty.
var sparseBuckets = map[string]bool{string(bucketRollouts): true, string(bucketRolloutLocks): true, string(bucketSources): true}

func isEmpty(b *bolt.Bucket) bool {
	k, _ := b.Cursor().First()
	return k == nil
}
