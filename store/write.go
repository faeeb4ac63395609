package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// EntityType names what an event is about.
type EntityType string

// Entity types. Member changes are notified but not logged as events: they
// are cluster plumbing, not tenant state.
const (
	EntityPolicy   EntityType = "policy"
	EntityEmployee EntityType = "employee"
	EntityDrift    EntityType = "drift"
	EntityReload   EntityType = "reload"
	EntityMember   EntityType = "member"
)

// Action is what happened to an entity.
type Action string

// Actions, as in seed 004.
const (
	ActionCreate Action = "CREATE"
	ActionUpdate Action = "UPDATE"
	ActionDelete Action = "DELETE"
)

// Meta is what the proposer decided for one command: its Raft index (which
// becomes the entity's revision and the event's ID) and its timestamps. Apply
// takes time from here, never from the clock, so every replica writes the
// same bytes.
type Meta struct {
	Index        uint64
	ProcessedAt  time.Time
	OriginatedAt time.Time
}

// Member is a node's advertised addresses, registered through Raft so every
// node can reach every other.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
	GRPCAddr string `json:"grpc_addr"`
}

// Batch is one write transaction over a batch of Raft entries. It is only
// valid inside the function passed to ApplyBatch.
type Batch struct {
	tx      *bolt.Tx
	changes []EntityChange
}

// ApplyBatch runs fn in one write transaction and records lastIndex as the
// applied index in the same transaction. An error from fn (a storage failure,
// not a business error) rolls everything back. After the commit, subscribers
// are told what changed.
func (s *Store) ApplyBatch(lastIndex uint64, fn func(b *Batch) error) error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	b := &Batch{}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b.tx = tx
		if err := fn(b); err != nil {
			return err
		}
		return putUint(tx.Bucket(bucketMeta), keyAppliedIndex, lastIndex)
	})
	s.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("apply batch ending at %d: %w", lastIndex, err)
	}
	s.advance(lastIndex)
	s.publish(Change{Index: lastIndex, Entities: b.changes})
	return nil
}

// checkRevision enforces an If-Match precondition: want 0 means "must not
// exist".
func checkRevision(what, id string, exists bool, cur uint64, ifMatch *uint64) error {
	if ifMatch == nil {
		return nil
	}
	switch {
	case *ifMatch == 0 && exists:
		return fmt.Errorf("%s %q already exists at revision %d: %w", what, id, cur, ErrConflict)
	case *ifMatch != 0 && !exists:
		return fmt.Errorf("%s %q does not exist (expected revision %d): %w", what, id, *ifMatch, ErrConflict)
	case *ifMatch != 0 && cur != *ifMatch:
		return fmt.Errorf("%s %q is at revision %d, not %d: %w", what, id, cur, *ifMatch, ErrConflict)
	}
	return nil
}

// PutPolicy creates or replaces p. Name, kind, scope, labels and spec come
// from p; revision and timestamps from m.
func (b *Batch) PutPolicy(m Meta, p *policy.Policy, ifMatch *uint64) (*policy.Policy, error) {
	bk := b.tx.Bucket(bucketPolicies)
	var old policy.Policy
	exists, err := getJSON(bk, p.Name, &old)
	if err != nil {
		return nil, err
	}
	if err := checkRevision("policy", p.Name, exists, old.Revision, ifMatch); err != nil {
		return nil, err
	}
	stored := *p
	stored.Revision = m.Index
	stored.UpdatedAt = m.ProcessedAt
	stored.CreatedAt = m.ProcessedAt
	action := ActionCreate
	if exists {
		stored.CreatedAt = old.CreatedAt
		action = ActionUpdate
	}
	raw, err := stored.Canonical()
	if err != nil {
		return nil, err
	}
	if err := bk.Put([]byte(p.Name), raw); err != nil {
		return nil, err
	}
	scopes := []policy.Scope{stored.Scope}
	if exists && old.Scope != stored.Scope {
		scopes = append(scopes, old.Scope)
	}
	if err := b.record(m, EntityPolicy, stored.Name, action, raw, scopes); err != nil {
		return nil, err
	}
	return &stored, nil
}

// DeletePolicy deletes the named policy; ErrNotFound if it does not exist.
func (b *Batch) DeletePolicy(m Meta, name string, ifMatch *uint64) error {
	bk := b.tx.Bucket(bucketPolicies)
	var old policy.Policy
	exists, err := getJSON(bk, name, &old)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("policy %q: %w", name, ErrNotFound)
	}
	if err := checkRevision("policy", name, exists, old.Revision, ifMatch); err != nil {
		return err
	}
	raw := bk.Get([]byte(name))
	data := append([]byte(nil), raw...) // raw is only valid until the Delete below
	if err := bk.Delete([]byte(name)); err != nil {
		return err
	}
	return b.record(m, EntityPolicy, name, ActionDelete, data, []policy.Scope{old.Scope})
}

// PutEmployee creates or replaces e.
func (b *Batch) PutEmployee(m Meta, e *policy.Employee, ifMatch *uint64) (*policy.Employee, error) {
	bk := b.tx.Bucket(bucketEmploy)
	var old policy.Employee
	exists, err := getJSON(bk, e.ID, &old)
	if err != nil {
		return nil, err
	}
	if err := checkRevision("employee", e.ID, exists, old.Revision, ifMatch); err != nil {
		return nil, err
	}
	stored := *e
	stored.Revision = m.Index
	stored.UpdatedAt = m.ProcessedAt
	stored.CreatedAt = m.ProcessedAt
	action := ActionCreate
	if exists {
		stored.CreatedAt = old.CreatedAt
		action = ActionUpdate
	}
	raw, err := json.Marshal(&stored)
	if err != nil {
		return nil, fmt.Errorf("encode employee %q: %w", e.ID, err)
	}
	if err := bk.Put([]byte(e.ID), raw); err != nil {
		return nil, err
	}
	scopes := []policy.Scope{stored.Identity()}
	if exists && old.Identity() != stored.Identity() {
		scopes = append(scopes, old.Identity())
	}
	if err := b.record(m, EntityEmployee, e.ID, action, raw, scopes); err != nil {
		return nil, err
	}
	return &stored, nil
}

// DeleteEmployee deletes an employee; ErrNotFound if it does not exist.
func (b *Batch) DeleteEmployee(m Meta, id string, ifMatch *uint64) error {
	bk := b.tx.Bucket(bucketEmploy)
	var old policy.Employee
	exists, err := getJSON(bk, id, &old)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("employee %q: %w", id, ErrNotFound)
	}
	if err := checkRevision("employee", id, exists, old.Revision, ifMatch); err != nil {
		return err
	}
	data := append([]byte(nil), bk.Get([]byte(id))...)
	if err := bk.Delete([]byte(id)); err != nil {
		return err
	}
	return b.record(m, EntityEmployee, id, ActionDelete, data, []policy.Scope{old.Identity()})
}

// PutMember records a node's addresses. Re-registering the same addresses
// changes nothing and notifies nobody.
func (b *Batch) PutMember(m Meta, mem Member) error {
	bk := b.tx.Bucket(bucketMembers)
	raw, err := json.Marshal(&mem)
	if err != nil {
		return fmt.Errorf("encode member %q: %w", mem.ID, err)
	}
	if string(bk.Get([]byte(mem.ID))) == string(raw) {
		return nil
	}
	if err := bk.Put([]byte(mem.ID), raw); err != nil {
		return err
	}
	b.changes = append(b.changes, EntityChange{Type: EntityMember, ID: mem.ID, Action: ActionUpdate, Index: m.Index})
	return nil
}

// DeleteMember forgets a node's addresses. Deleting an unknown member is not
// an error: removal must be idempotent for retries.
func (b *Batch) DeleteMember(m Meta, id string) error {
	bk := b.tx.Bucket(bucketMembers)
	if bk.Get([]byte(id)) == nil {
		return nil
	}
	if err := bk.Delete([]byte(id)); err != nil {
		return err
	}
	b.changes = append(b.changes, EntityChange{Type: EntityMember, ID: id, Action: ActionDelete, Index: m.Index})
	return nil
}

// MaxPrunePerBatch bounds one prune command, so one apply never holds the
// write transaction for long; the leader proposes again while more is due.
const MaxPrunePerBatch = 10000

// PruneEvents deletes, oldest first, events processed before cutoff, at most
// MaxPrunePerBatch of them. It stops at the first event at or after cutoff:
// events are stamped by the leader in log order, so later IDs are not older
// except across clock steps between leaders, which only delays their
// pruning. It returns how many it deleted.
func (b *Batch) PruneEvents(cutoff time.Time) (int, error) {
	bk := b.tx.Bucket(bucketEvents)
	c := bk.Cursor()
	n := 0
	var last uint64
	// Re-seek after each delete: a bbolt cursor may skip an item after Delete.
	for k, v := c.First(); k != nil && n < MaxPrunePerBatch; k, v = c.First() {
		if len(v) < 8 || int64(binary.BigEndian.Uint64(v[:8])) >= cutoff.UnixNano() {
			break
		}
		last = binary.BigEndian.Uint64(k)
		if err := c.Delete(); err != nil {
			return n, err
		}
		n++
	}
	if n > 0 {
		if err := putUint(b.tx.Bucket(bucketMeta), keyPrunedThrough, last); err != nil {
			return n, err
		}
	}
	return n, nil
}

// record writes the event and the entity-state versions of one change and
// queues its notification. The event ID is the Raft index.
func (b *Batch) record(m Meta, typ EntityType, id string, action Action, data []byte, scopes []policy.Scope) error {
	org := scopes[0].Org
	ev := Event{
		ID:           m.Index,
		EntityType:   typ,
		Org:          org,
		Action:       action,
		EntityID:     id,
		Data:         json.RawMessage(data),
		OriginatedAt: m.OriginatedAt,
		ProcessedAt:  m.ProcessedAt,
	}
	if err := putEvent(b.tx.Bucket(bucketEvents), &ev); err != nil {
		return err
	}
	// A change that moves an entity between orgs changes both orgs' versions.
	seen := map[string]bool{}
	for _, sc := range scopes {
		if seen[sc.Org] {
			continue
		}
		seen[sc.Org] = true
		st := EntityState{EntityType: typ, Org: sc.Org, Version: m.Index, UpdatedAt: m.ProcessedAt}
		raw, err := json.Marshal(&st)
		if err != nil {
			return fmt.Errorf("encode entity state: %w", err)
		}
		if err := b.tx.Bucket(bucketStates).Put(stateKey(typ, sc.Org), raw); err != nil {
			return err
		}
	}
	b.changes = append(b.changes, EntityChange{Type: typ, ID: id, Action: action, Index: m.Index, Scopes: scopes})
	return nil
}

func stateKey(typ EntityType, org string) []byte {
	return []byte(string(typ) + "\x00" + org)
}

// putEvent stores an event under its big-endian ID, prefixed with its
// processed time so pruning needs no JSON decoding.
func putEvent(bk *bolt.Bucket, ev *Event) error {
	raw, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event %d: %w", ev.ID, err)
	}
	v := make([]byte, 8, 8+len(raw))
	binary.BigEndian.PutUint64(v, uint64(ev.ProcessedAt.UnixNano()))
	v = append(v, raw...)
	return bk.Put(u64(ev.ID), v)
}
