package feed

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/coder/websocket"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

const (
	// maxReplayEvents bounds the policy events a resume replays; a client
	// that missed more gets init, which is cheaper by then.
	maxReplayEvents = 1000
	// replayLookback bounds how far before since the replay looks for the
	// scope a policy had at since.
	replayLookback = 4096
	// attachTries is how often a replay is recomputed when changes were
	// dispatched while it was being computed, before settling for init.
	attachTries = 3
)

// Sync modes, for the connect log.
const (
	syncInit   = "init"
	syncReplay = "replay"
)

// replayItem is one message of a replay: an upsert (policy set) or a
// delete.
type replayItem struct {
	name    string
	version uint64
	policy  *feedv1.Policy
}

// attach registers c with the hub and queues what brings the client up to
// date: a replay of what it missed since, or init. It returns how the
// client is synchronised and its identity then, or false when the hub has
// closed.
func (h *Hub) attach(c *conn, since uint64) (string, policy.Identity, bool) {
	if since > 0 {
		for range attachTries {
			h.mu.RLock()
			closed, upto := h.closed, h.dispatched
			h.mu.RUnlock()
			if closed {
				return "", policy.Identity{}, false
			}
			// The event log is read outside the lock; the result holds if
			// nothing was dispatched meanwhile.
			items, ok, err := h.replay(c.ident, since, upto)
			if err != nil {
				h.logger.Warn("feed replay failed, sending init", "conn", c.addr, "since", since, "err", err)
				ok = false
			}
			if ok && h.deps.Policies.ChangedSince(c.ident, since) {
				// The client may hold a rollout's candidate, or be due
				// one: the event log describes neither.
				ok = false
			}
			if ok && len(items) > max(1, h.cfg.SendBuffer/2) {
				ok = false // a long replay: init is one message
			}
			h.mu.Lock()
			if h.closed {
				h.mu.Unlock()
				return "", policy.Identity{}, false
			}
			if h.dispatched != upto {
				h.mu.Unlock()
				continue
			}
			mode := syncInit
			if ok {
				mode = h.attachLocked(c, since, func() { h.sendReplayLocked(c, items, max(upto, since)) })
			} else {
				h.attachLocked(c, 0, func() { h.sendInitLocked(c, time.Time{}) })
			}
			ident := c.ident
			h.mu.Unlock()
			return mode, ident, true
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return "", policy.Identity{}, false
	}
	h.attachLocked(c, 0, func() { h.sendInitLocked(c, time.Time{}) })
	return syncInit, c.ident, true
}

// attachLocked registers c and queues its first messages with sync, after
// checking the employee record once more: a change to it committed during
// the handshake may have been dispatched before c was registered, and the
// store, which is never behind the dispatcher, shows it. A replay (since >
// 0) is only valid if the employee has not changed since: the replay is
// computed for the current identity, and one that moved meanwhile needs
// init to drop its old scope's policies. It returns the sync mode used.
func (h *Hub) attachLocked(c *conn, since uint64, sync func()) string {
	h.wg.Add(1)
	h.live[c] = struct{}{}
	h.metrics.connections.Inc()
	if h.deps.Refusal != nil {
		if msg := h.deps.Refusal(); msg != "" {
			c.closeWith(websocket.StatusTryAgainLater, msg, nil)
			return syncInit
		}
	}
	emp, err := h.deps.Store.FindEmployee(c.ident.Employee)
	switch {
	case err != nil:
		h.failLocked(c, fmt.Errorf("read employee %q: %w", c.ident.Employee, err))
		return syncInit
	case emp == nil:
		h.revokeLocked(c, reasonDeleted)
		return syncInit
	case !emp.Active():
		h.revokeLocked(c, reasonDeactivated)
		return syncInit
	case emp.Org != c.ident.Org:
		h.revokeLocked(c, reasonOrgChanged)
		return syncInit
	}
	// Moved to another team during the handshake: serve the new team,
	// from init.
	moved := emp.Identity() != c.ident
	c.ident = emp.Identity()
	h.indexLocked(c)
	if moved || (since > 0 && emp.Revision > since) {
		h.sendInitLocked(c, time.Time{})
		return syncInit
	}
	sync()
	if since > 0 {
		return syncReplay
	}
	return syncInit
}

// sendReplayLocked queues a replay computed up to index upto.
func (h *Hub) sendReplayLocked(c *conn, items []replayItem, upto uint64) {
	set := h.setLocked(c)
	if len(set.Rollouts) > 0 {
		// A rollout reached the index after attach checked ChangedSince:
		// the replay holds stable states only.
		h.sendInitLocked(c, time.Time{})
		return
	}
	c.base = max(c.base, upto)
	c.set = set
	digest := set.Version
	if len(items) == 0 {
		c.sent.Store(&digest) // the client holds the current set already
		return
	}
	for _, it := range items {
		var (
			data []byte
			err  error
		)
		// A connection without the shadow capability holds no shadow
		// policy: one that became shadow is deleted from it, as
		// SetFor's set leaves it out.
		if it.policy != nil && (c.caps.Shadow || it.policy.Enforcement != policy.EnforcementShadow) {
			data, err = encode(feedv1.Upsert{Type: feedv1.TypeUpsert, Policy: *it.policy, Version: it.version, Digest: digest})
		} else {
			data, err = encode(feedv1.Delete{Type: feedv1.TypeDelete, PolicyName: it.name, Version: it.version, Digest: digest})
		}
		if err != nil {
			h.failLocked(c, err)
			return
		}
		if !h.enqueueLocked(c, outMsg{data: data, digest: digest, policy: true}) {
			return
		}
	}
}

// replay works out what a client of identity id that holds the state as
// of index since is missing at index upto, from the event log. ok is false
// when that cannot be known (events pruned, too many of them, a policy's
// scope at since not found); the caller then sends init.
func (h *Hub) replay(id policy.Identity, since, upto uint64) (_ []replayItem, ok bool, _ error) {
	if since >= upto {
		return nil, true, nil
	}
	if upto-since > maxReplayEvents {
		// More log entries than a replay may scan, so maybe as many policy
		// events to read and decode (4 KB each) before giving up. A
		// sidecar's since is the last change to its own set, often far
		// back; in a failover's reconnect storm every feed sidecar of the
		// dead node did that read, up to attachTries times, and the node
		// stalled for seconds (bench failover). Init is one message.
		return nil, false, nil
	}
	page, err := h.deps.Store.ListEvents(store.EventFilter{Type: store.EntityPolicy, After: since, Limit: maxReplayEvents + 1})
	if err != nil {
		return nil, false, err
	}
	if page.PrunedThrough > since {
		return nil, false, nil // events the client missed are gone
	}
	type history struct {
		first, last  store.Event
		lastScope    policy.Scope
		lastPolicy   *policy.Policy
		everApplied  bool // some state after since applied to id
		neverExisted bool // created after since
	}
	byName := map[string]*history{}
	n := 0
	for _, ev := range page.Events {
		if ev.ID > upto {
			break
		}
		if n++; n > maxReplayEvents {
			return nil, false, nil
		}
		// An event's data is the policy's stored form.
		p, err := policy.DecodeStored(ev.Data)
		if err != nil {
			return nil, false, fmt.Errorf("decode event %d: %w", ev.ID, err)
		}
		hs := byName[ev.EntityID]
		if hs == nil {
			hs = &history{first: ev, neverExisted: ev.Action == store.ActionCreate}
			byName[ev.EntityID] = hs
		}
		hs.last, hs.lastScope, hs.lastPolicy = ev, p.Scope, p
		// Put events hold the new state, delete events the deleted one:
		// either way a state the policy had after since.
		hs.everApplied = hs.everApplied || p.Scope.AppliesTo(id)
	}

	// Each policy is sent once, in its state at upto, at the index of its
	// first change after since, in that order (as OnChange does within a
	// batch): a client cut off in the middle resumes correctly from the
	// last version it got.
	var items []replayItem
	var lookups []string // first changed by an update after since; scope at since unknown
	for name, hs := range byName {
		switch {
		case hs.last.Action != store.ActionDelete && hs.lastScope.AppliesTo(id):
			items = append(items, replayItem{name: name, version: hs.first.ID, policy: wirePolicy(hs.lastPolicy)})
		case hs.everApplied:
			items = append(items, replayItem{name: name, version: hs.first.ID})
		case hs.neverExisted, hs.first.Action == store.ActionDelete:
			// Did not exist at since, or its state at since is the
			// delete event's, which did not apply: the client never had it.
		default:
			lookups = append(lookups, name)
		}
	}
	if len(lookups) > 0 {
		atSince, ok, err := h.scopesAt(since, page.PrunedThrough, lookups)
		if err != nil || !ok {
			return nil, false, err
		}
		for _, name := range lookups {
			if atSince[name].AppliesTo(id) {
				items = append(items, replayItem{name: name, version: byName[name].first.ID})
			}
		}
	}
	slices.SortFunc(items, func(a, b replayItem) int { return cmp.Compare(a.version, b.version) })
	return items, true, nil
}

// scopesAt finds the scope each named policy had at index since, from its
// last event at or before since, looking back at most replayLookback
// indexes. ok is false if any of them is not found there.
func (h *Hub) scopesAt(since, prunedThrough uint64, names []string) (map[string]policy.Scope, bool, error) {
	from := prunedThrough
	if since > replayLookback && since-replayLookback > from {
		from = since - replayLookback
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	// Event IDs are distinct indexes, so (from, since] holds at most
	// replayLookback events.
	page, err := h.deps.Store.ListEvents(store.EventFilter{Type: store.EntityPolicy, After: from, Limit: replayLookback})
	if err != nil {
		return nil, false, err
	}
	if page.PrunedThrough > from {
		return nil, false, nil // pruned meanwhile
	}
	out := map[string]policy.Scope{}
	for _, ev := range page.Events {
		if ev.ID > since {
			break
		}
		if !want[ev.EntityID] {
			continue
		}
		// An event's data is the policy's stored form.
		p, err := policy.DecodeStored(ev.Data)
		if err != nil {
			return nil, false, fmt.Errorf("decode event %d: %w", ev.ID, err)
		}
		out[ev.EntityID] = p.Scope
	}
	if len(out) != len(want) {
		return nil, false, nil
	}
	return out, true, nil
}
