package store

import (
	"slices"
	"sync"
	"time"

	"github.com/policyd/policyd/internal/policy"
)

// Change is what one committed batch changed.
type Change struct {
	// Index is the applied index after the batch.
	Index uint64
	// Resync means the subscriber cannot rely on Entities: the whole state
	// was replaced (snapshot restore) or the subscriber fell too far behind.
	// It must reload what it serves from the store.
	Resync bool
	// Entities lists each changed entity in apply order.
	Entities []EntityChange
	// At is when this node committed the batch (local clock). Subscribers
	// measure their push latency from it.
	At time.Time
}

// EntityChange is one entity's change within a batch.
type EntityChange struct {
	Type   EntityType
	ID     string
	Action Action
	// Index is the Raft index of the command (the event ID and revision).
	Index uint64
	// Scopes the change touches: for a policy its new scope and, if it
	// moved, its old one; for an employee its identity before and after;
	// for a rollout the scopes of its changes' policies, new and stored.
	Scopes []policy.Scope
	// Data is a policy's stored JSON after this change, or a rollout's
	// stored protobuf (commandv1.Rollout; see rollout.go); nil for a
	// delete, for other entity types, and on subscriptions made with
	// Subscribe rather than SubscribeWithData. A subscriber that keeps a copy takes
	// the change's own state from it: re-reading the store could return a
	// later state, and the copy would mix states of different indexes.
	// Shared and read-only.
	Data []byte
	// Policy is Data as the apply had it, so that a subscriber need not
	// decode it again; nil where Data is, and in a Resync. Shared and
	// read-only.
	Policy *policy.Policy
}

// maxPending and maxPendingBytes (the policies' Data) bound a subscriber's
// queue. Past either, the queue is replaced by a single Resync: memory stays
// bounded and the writer never waits.
const (
	maxPending      = 1024
	maxPendingBytes = 64 << 20
)

// Subscription receives change notifications. Ready fires when Next has
// something; Next drains everything queued so far.
type Subscription struct {
	s       *Store
	ready   chan struct{}
	mu      sync.Mutex
	pending []Change
	// pendingBytes is the Data held by pending.
	pendingBytes int
	done         bool
	withData     bool // changes keep EntityChange.Data
}

// dataBytes is the size of the entity states c carries.
func (c Change) dataBytes() int {
	n := 0
	for _, e := range c.Entities {
		n += len(e.Data)
	}
	return n
}

// Subscribe registers a subscriber. Its changes carry no entity states
// (EntityChange.Data is nil), so a slow subscriber holds little. Call Close
// when done.
func (s *Store) Subscribe() *Subscription { return s.subscribe(false) }

// SubscribeWithData is Subscribe for a subscriber that keeps a copy of the
// policies (the node's dispatcher, for the policy index): each policy change
// carries the policy's stored JSON.
func (s *Store) SubscribeWithData() *Subscription { return s.subscribe(true) }

func (s *Store) subscribe(withData bool) *Subscription {
	sub := &Subscription{s: s, ready: make(chan struct{}, 1), withData: withData}
	s.subMu.Lock()
	s.subs[sub] = struct{}{}
	s.subMu.Unlock()
	return sub
}

// Ready is signalled (at most one pending signal) when changes are queued, and
// closed when the store closes.
func (sub *Subscription) Ready() <-chan struct{} { return sub.ready }

// Next returns and clears the queued changes; nil if none.
func (sub *Subscription) Next() []Change {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	out := sub.pending
	sub.pending, sub.pendingBytes = nil, 0
	return out
}

// Close unregisters the subscription.
func (sub *Subscription) Close() {
	sub.s.subMu.Lock()
	delete(sub.s.subs, sub)
	sub.s.subMu.Unlock()
	sub.close()
}

func (sub *Subscription) close() {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if !sub.done {
		sub.done = true
		close(sub.ready)
	}
}

func (sub *Subscription) push(c Change) {
	sub.mu.Lock()
	if sub.done {
		sub.mu.Unlock()
		return
	}
	size := c.dataBytes()
	if len(sub.pending) >= maxPending || sub.pendingBytes+size > maxPendingBytes {
		sub.pending = []Change{{Index: c.Index, Resync: true, At: c.At}}
		sub.pendingBytes = 0
	} else {
		sub.pending = append(sub.pending, c)
		sub.pendingBytes += size
	}
	sub.mu.Unlock()
	select {
	case sub.ready <- struct{}{}:
	default:
	}
}

func (s *Store) publish(c Change) {
	var lean *Change // c without Data, made for the first subscriber that wants it
	s.subMu.Lock()
	defer s.subMu.Unlock()
	hasData := c.dataBytes() > 0
	for sub := range s.subs {
		if sub.withData || !hasData {
			sub.push(c)
			continue
		}
		if lean == nil {
			l := c
			l.Entities = slices.Clone(c.Entities)
			for i := range l.Entities {
				l.Entities[i].Data, l.Entities[i].Policy = nil, nil
			}
			lean = &l
		}
		sub.push(*lean)
	}
}
