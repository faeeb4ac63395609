package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// EntityType names what an event is about.
type EntityType string

// Entity types. Member changes are notified but not logged as events: they
// are cluster plumbing, not tenant state.
const (
	EntityPolicy   EntityType = "policy"
	EntityEmployee EntityType = "employee"
	EntityMember   EntityType = "member"
	// EntityRetention is the event log itself: a retention prune records
	// one event (RecordPrune).
	EntityRetention EntityType = "retention"
)

// Action is what happened to an entity.
type Action string

// Actions an event records.
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
	// Actor, RequestID and RevertedTo go into the event as they are (see
	// Event).
	Actor      string
	RequestID  string
	RevertedTo uint64
}

// Member is a node's advertised addresses, registered through Raft so every
// node can reach every other.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
	GRPCAddr string `json:"grpc_addr"`
	// CommandVersion is the newest Raft command encoding the node reads
	// (command.CommandVersion); 0 for a node that predates it.
	CommandVersion uint32 `json:"command_version,omitempty"`
}

// Batch is one write transaction over a batch of Raft entries. It is only
// valid inside the function passed to ApplyBatch.
type Batch struct {
	tx      *bolt.Tx
	changes []EntityChange
	// seqEvents, evIndex and evSeq number the events of one entry: a
	// rollout's completion records several at its index (see putEvent).
	// Other commands keep one key per entry (a second event at the same
	// index replaces the first), as releases before rollouts wrote them.
	seqEvents bool
	evIndex   uint64
	evSeq     uint16
}

// ApplyBatch runs fn in one write transaction and records lastIndex as the
// applied index in the same transaction. An error from fn (a storage failure,
// not a business error) rolls everything back. After the commit, subscribers
// are told what changed.
func (s *Store) ApplyBatch(lastIndex uint64, fn func(b *Batch) error) error {
	b := &Batch{}
	closed, err := func() (bool, error) {
		// Deferred: fn may panic (raftfsm stops on an undecodable entry),
		// and the lock must not outlive it, or Close and Restore hang.
		s.mu.RLock()
		defer s.mu.RUnlock()
		if s.closed {
			return true, nil
		}
		return false, s.db.Update(func(tx *bolt.Tx) error {
			b.tx = tx
			if err := fn(b); err != nil {
				return err
			}
			// The policy heads are written with the batch (heads.go).
			return errors.Join(putUint(tx.Bucket(bucketMeta), keyAppliedIndex, lastIndex),
				putUint(tx.Bucket(bucketMeta), keyHeadsIndex, lastIndex))
		})
	}()
	if closed {
		return ErrClosed
	}
	if err != nil {
		return fmt.Errorf("apply batch ending at %d to %s: %w", lastIndex, s.path, err)
	}
	s.advance(lastIndex)
	s.publish(Change{Index: lastIndex, Entities: b.changes, At: time.Now()})
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

// entityKind describes how one kind of keyed entity is stored, so that
// every kind shares the same put and delete logic: compare-and-set,
// revision and timestamps from the command, and the event and versions in
// the same transaction.
type entityKind[T any] struct {
	bucket   []byte
	typ      EntityType
	revision func(*T) uint64
	created  func(*T) time.Time
	// stamp sets the server-managed fields.
	stamp func(v *T, revision uint64, created, updated time.Time)
	// scope is what the entity touches: a policy's scope, an employee's
	// identity.
	scope func(*T) policy.Scope
	// encode is the stored form; it must be deterministic.
	encode func(*T) ([]byte, error)
	// decode reads the stored form back. raw is bbolt's memory: the result
	// is only used inside the transaction.
	decode func(raw []byte) (*T, error)
	// head, if set, reads what a write needs of the current value (its
	// revision, creation time and scope) without decoding it; index keeps
	// it (nil: key deleted).
	head  func(tx *bolt.Tx, key string) (*T, error)
	index func(tx *bolt.Tx, key string, stored *T) error
}

// get reads what a write needs of key's current value; nil if absent.
func (k entityKind[T]) get(tx *bolt.Tx, key string) (*T, error) {
	if k.head != nil {
		return k.head(tx, key)
	}
	raw := tx.Bucket(k.bucket).Get([]byte(key))
	if raw == nil {
		return nil, nil
	}
	v, err := k.decode(raw)
	if err != nil {
		return nil, fmt.Errorf("decode stored %s %q: %w", k.typ, key, err)
	}
	return v, nil
}

var policyKind = entityKind[policy.Policy]{
	bucket:   bucketPolicies,
	typ:      EntityPolicy,
	revision: func(p *policy.Policy) uint64 { return p.Revision },
	created:  func(p *policy.Policy) time.Time { return p.CreatedAt },
	stamp: func(p *policy.Policy, rev uint64, created, updated time.Time) {
		p.Revision, p.CreatedAt, p.UpdatedAt = rev, created, updated
	},
	scope: func(p *policy.Policy) policy.Scope { return p.Scope },
	// Policy specs arrive canonical from the proposer (command.PutPolicy),
	// so AppendJSON gives json.Marshal's bytes without its pass over the
	// spec.
	encode: func(p *policy.Policy) ([]byte, error) { return p.AppendJSON(nil) },
	decode: policy.DecodeStored,
	head:   getHead,
	index: func(tx *bolt.Tx, key string, p *policy.Policy) error {
		if p == nil {
			return tx.Bucket(bucketPolicyHeads).Delete([]byte(key))
		}
		return putHead(tx, p)
	},
}

var employeeKind = entityKind[policy.Employee]{
	bucket:   bucketEmploy,
	typ:      EntityEmployee,
	revision: func(e *policy.Employee) uint64 { return e.Revision },
	created:  func(e *policy.Employee) time.Time { return e.CreatedAt },
	stamp: func(e *policy.Employee, rev uint64, created, updated time.Time) {
		e.Revision, e.CreatedAt, e.UpdatedAt = rev, created, updated
	},
	scope:  (*policy.Employee).Identity,
	encode: func(e *policy.Employee) ([]byte, error) { return json.Marshal(e) },
	decode: func(raw []byte) (*policy.Employee, error) {
		var e policy.Employee
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, err
		}
		return &e, nil
	},
}

// putEntity creates or replaces v under key. It returns the stored entity
// and its stored encoding.
func putEntity[T any](b *Batch, k entityKind[T], m Meta, key string, v *T, ifMatch *uint64) (*T, []byte, error) {
	bk := b.tx.Bucket(k.bucket)
	old, err := k.get(b.tx, key)
	if err != nil {
		return nil, nil, err
	}
	exists := old != nil
	var cur uint64
	if exists {
		cur = k.revision(old)
	}
	if err := checkRevision(string(k.typ), key, exists, cur, ifMatch); err != nil {
		return nil, nil, err
	}
	stored := *v
	created, action := m.ProcessedAt, ActionCreate
	if exists {
		created, action = k.created(old), ActionUpdate
	}
	k.stamp(&stored, m.Index, created, m.ProcessedAt)
	// A plain encoding is deterministic: every replica receives the same
	// command bytes. (Re-canonicalising policy specs here cost every
	// replica ~15% of its CPU under write load.)
	raw, err := k.encode(&stored)
	if err != nil {
		return nil, nil, fmt.Errorf("encode %s %q: %w", k.typ, key, err)
	}
	if err := bk.Put([]byte(key), raw); err != nil {
		return nil, nil, err
	}
	if k.index != nil {
		if err := k.index(b.tx, key, &stored); err != nil {
			return nil, nil, err
		}
	}
	scopes := []policy.Scope{k.scope(&stored)}
	if exists && k.scope(old) != scopes[0] {
		scopes = append(scopes, k.scope(old))
	}
	if err := b.record(m, k.typ, key, action, raw, scopes); err != nil {
		return nil, nil, err
	}
	return &stored, raw, nil
}

// deleteEntity deletes key; ErrNotFound if it does not exist.
func deleteEntity[T any](b *Batch, k entityKind[T], m Meta, key string, ifMatch *uint64) error {
	bk := b.tx.Bucket(k.bucket)
	old, err := k.get(b.tx, key)
	if err != nil {
		return err
	}
	if old == nil {
		return fmt.Errorf("%s %q: %w", k.typ, key, ErrNotFound)
	}
	if err := checkRevision(string(k.typ), key, true, k.revision(old), ifMatch); err != nil {
		return err
	}
	data := append([]byte(nil), bk.Get([]byte(key))...) // only valid until the Delete
	if err := bk.Delete([]byte(key)); err != nil {
		return err
	}
	if k.index != nil {
		if err := k.index(b.tx, key, nil); err != nil {
			return err
		}
	}
	return b.record(m, k.typ, key, ActionDelete, data, []policy.Scope{k.scope(old)})
}

// PutPolicy creates or replaces p. Name, kind, scope, labels and spec come
// from p; revision and timestamps from m. It returns the stored policy and
// its stored JSON.
func (b *Batch) PutPolicy(m Meta, p *policy.Policy, ifMatch *uint64) (*policy.Policy, []byte, error) {
	stored, raw, err := putEntity(b, policyKind, m, p.Name, p, ifMatch)
	if err == nil {
		b.changes[len(b.changes)-1].Policy = stored
	}
	return stored, raw, err
}

// DeletePolicy deletes the named policy; ErrNotFound if it does not exist.
func (b *Batch) DeletePolicy(m Meta, name string, ifMatch *uint64) error {
	return deleteEntity(b, policyKind, m, name, ifMatch)
}

// PutEmployee creates or replaces e. It returns the stored employee and its
// stored JSON.
func (b *Batch) PutEmployee(m Meta, e *policy.Employee, ifMatch *uint64) (*policy.Employee, []byte, error) {
	return putEntity(b, employeeKind, m, e.ID, e, ifMatch)
}

// DeleteEmployee deletes an employee; ErrNotFound if it does not exist.
func (b *Batch) DeleteEmployee(m Meta, id string, ifMatch *uint64) error {
	return deleteEntity(b, employeeKind, m, id, ifMatch)
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

// ResetMemberVersions clears the command version of every member but
// except, so that each registers again.
func (b *Batch) ResetMemberVersions(m Meta, except string) error {
	bk := b.tx.Bucket(bucketMembers)
	var reset []Member
	err := bk.ForEach(func(k, v []byte) error {
		var mem Member
		if err := json.Unmarshal(v, &mem); err != nil {
			return fmt.Errorf("decode member %q: %w", k, err)
		}
		if mem.ID != except && mem.CommandVersion != 0 {
			mem.CommandVersion = 0
			reset = append(reset, mem)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, mem := range reset {
		if err := b.PutMember(m, mem); err != nil {
			return err
		}
	}
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
	n, _, err := b.pruneEvents(cutoff)
	return n, err
}

// retentionMark is how a stored retention record's JSON names its type.
var retentionMark = []byte(`"entity_type":"retention"`)

// pruneEvents is PruneEvents, also counting the retention records
// (RecordPrune) among the events it deleted.
func (b *Batch) pruneEvents(cutoff time.Time) (n, records int, err error) {
	bk := b.tx.Bucket(bucketEvents)
	c := bk.Cursor()
	var last uint64
	var lastKey []byte
	// Re-seek to the deleted key after each delete, which finds the next
	// one: a bbolt cursor may skip an item after Delete, and re-seeking
	// from First would walk the emptied pages again (quadratic in the
	// events pruned). The events of one entry (putEvent) go together.
	for k, v := c.First(); k != nil; k, v = c.Seek(lastKey) {
		id := binary.BigEndian.Uint64(k)
		if n >= MaxPrunePerBatch && id != last {
			break
		}
		if len(v) < 8 || int64(binary.BigEndian.Uint64(v[:8])) >= cutoff.UnixNano() {
			break
		}
		last, lastKey = id, bytes.Clone(k)
		if bytes.Contains(v[8:], retentionMark) {
			records++
		}
		if err := c.Delete(); err != nil {
			return n, records, err
		}
		n++
	}
	// Never lower the mark: a restore sets it above events it keeps
	// (Store.StartHistory), and pruning those later must not undo that.
	if meta := b.tx.Bucket(bucketMeta); n > 0 && last > getUint(meta, keyPrunedThrough) {
		if err := putUint(meta, keyPrunedThrough, last); err != nil {
			return n, records, err
		}
	}
	return n, records, nil
}

// PruneEventsRecorded is PruneEvents for a prune command with an actor
// (command version 3): it also records, as an event of type
// EntityRetention, what it removed, unless it removed nothing or only
// earlier such records (else each record's own pruning would record
// another, forever). Without an actor it records nothing, as a node of an
// older version applying the same entry would not.
func (b *Batch) PruneEventsRecorded(m Meta, cutoff time.Time) (int, error) {
	n, records, err := b.pruneEvents(cutoff)
	if err != nil || m.Actor == "" || n == records {
		return n, err
	}
	return n, b.recordPrune(m, cutoff, n)
}

// recordPrune writes the event of a prune that removed n events. It
// neither notifies nor versions anything: no tenant state changed.
func (b *Batch) recordPrune(m Meta, cutoff time.Time, n int) error {
	data, err := json.Marshal(struct {
		Cutoff        time.Time `json:"cutoff"`
		Count         int       `json:"count"`
		PrunedThrough uint64    `json:"pruned_through"`
	}{cutoff.UTC(), n, getUint(b.tx.Bucket(bucketMeta), keyPrunedThrough)})
	if err != nil {
		return fmt.Errorf("encode prune record: %w", err)
	}
	ev := Event{
		ID: m.Index, EntityType: EntityRetention, Action: ActionDelete, EntityID: "events", Data: data,
		OriginatedAt: m.OriginatedAt, ProcessedAt: m.ProcessedAt,
		Actor: m.Actor, RequestID: m.RequestID,
	}
	return b.putEvent(&ev)
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
		Actor:        m.Actor,
		RequestID:    m.RequestID,
		RevertedTo:   m.RevertedTo,
	}
	if err := b.putEvent(&ev); err != nil {
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
	ec := EntityChange{Type: typ, ID: id, Action: action, Index: m.Index, Scopes: scopes}
	if typ == EntityPolicy && action != ActionDelete {
		ec.Data = data
	}
	b.changes = append(b.changes, ec)
	return nil
}

func stateKey(typ EntityType, org string) []byte {
	return []byte(string(typ) + "\x00" + org)
}

// putEvent stores an event under its big-endian ID, prefixed with its
// processed time so pruning needs no JSON decoding. The first event of an
// entry is keyed by the ID alone; further events of the same entry (a
// rollout's completion writes its policies and itself) by the ID and a
// big-endian sequence number, so that they sort after it and every reader
// taking the first 8 bytes as the ID sees them as events of that entry.
func (b *Batch) putEvent(ev *Event) error {
	v := make([]byte, 8, 8+len(ev.Data)+256)
	binary.BigEndian.PutUint64(v, uint64(ev.ProcessedAt.UnixNano()))
	v, err := ev.appendJSON(v)
	if err != nil {
		return fmt.Errorf("encode event %d: %w", ev.ID, err)
	}
	key := u64(ev.ID)
	if b.seqEvents {
		if b.evIndex == ev.ID {
			b.evSeq++
			key = binary.BigEndian.AppendUint16(key, b.evSeq)
		} else {
			b.evIndex, b.evSeq = ev.ID, 0
		}
	}
	return b.tx.Bucket(bucketEvents).Put(key, v)
}

// eventHead is Event's fields before Data, in order, with the same tags.
type eventHead struct {
	ID         uint64     `json:"id"`
	EntityType EntityType `json:"entity_type"`
	Org        string     `json:"org"`
	Action     Action     `json:"action"`
	EntityID   string     `json:"entity_id"`
}

// eventTail is Event's fields after ProcessedAt, with the same tags.
type eventTail struct {
	Actor      string `json:"actor,omitempty"`
	RequestID  string `json:"request_id,omitempty"`
	RevertedTo uint64 `json:"reverted_to,omitempty"`
}

// appendJSON appends json.Marshal's encoding of ev, copying Data as it is
// rather than validating and compacting it again: Data is always the
// store's own json.Marshal-compact encoding of the entity.
func (ev *Event) appendJSON(dst []byte) ([]byte, error) {
	head, err := json.Marshal(eventHead{ID: ev.ID, EntityType: ev.EntityType, Org: ev.Org, Action: ev.Action, EntityID: ev.EntityID})
	if err != nil {
		return nil, err
	}
	dst = append(dst, head[:len(head)-1]...)
	dst = append(dst, `,"data":`...)
	dst = policy.AppendRaw(dst, ev.Data)
	if dst, err = policy.AppendTimeField(dst, "originated_at", ev.OriginatedAt); err != nil {
		return nil, err
	}
	if dst, err = policy.AppendTimeField(dst, "processed_at", ev.ProcessedAt); err != nil {
		return nil, err
	}
	if ev.Actor != "" || ev.RequestID != "" || ev.RevertedTo != 0 {
		tail, err := json.Marshal(eventTail{Actor: ev.Actor, RequestID: ev.RequestID, RevertedTo: ev.RevertedTo})
		if err != nil {
			return nil, err
		}
		if len(tail) > 2 {
			dst = append(dst, ',')
			dst = append(dst, tail[1:len(tail)-1]...)
		}
	}
	return append(dst, '}'), nil
}
