package store

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
)

// Staged rollouts (docs/rollouts.md). The store keeps every rollout, in
// bucket rollouts by id, as its deterministic protobuf encoding; and, in
// rollout_locks, the name of each policy an active rollout stages, with the
// rollout's id, so that a plain write to it is refused with one lookup.
//
// Every rollout write records an event of type rollout (its JSON, see
// RolloutDoc) and notifies an EntityChange of type EntityRollout whose Data
// is the rollout's protobuf encoding as stored after the write and whose
// Scopes are the scopes of every change's policy: for a put the new
// policy's scope and the stored policy's, for a delete the stored policy's.
// Completion writes each change as an ordinary policy write in the same
// transaction, with its own event and notification, before the rollout's.
var (
	bucketRollouts     = []byte("rollouts")
	bucketRolloutLocks = []byte("rollout_locks")
)

// EntityRollout is a staged rollout.
const EntityRollout EntityType = "rollout"

// Rollout states.
const (
	RolloutRunning    = "running"
	RolloutPaused     = "paused"
	RolloutHalted     = "halted" // only with on_halt stay; still active
	RolloutRolledBack = "rolled_back"
	RolloutCompleted  = "completed"
	RolloutAborted    = "aborted"
)

// What a rollout does when it halts (Rollout.on_halt).
const (
	OnHaltRollback = "rollback"
	OnHaltStay     = "stay"
)

// Ops of a rollout change.
const (
	OpPut    = "put"
	OpDelete = "delete"
)

// RolloutActive reports whether a rollout in state st still stages its
// changes: its cohort receives the candidate, and its policies are locked.
func RolloutActive(st string) bool {
	return st == RolloutRunning || st == RolloutPaused || st == RolloutHalted
}

// ChangeName is the name of the policy a change puts or deletes.
func ChangeName(c *commandv1.RolloutChange) string {
	if c.GetOp() == OpPut {
		return c.GetPolicy().GetName()
	}
	return c.GetName()
}

// rolloutMarshal is deterministic: labels are a map, and every replica must
// store the same bytes.
var rolloutMarshal = proto.MarshalOptions{Deterministic: true}

// RolloutID is the id the FSM gives the rollout its entry at index starts.
func RolloutID(index uint64) string { return "r" + strconv.FormatUint(index, 10) }

// StartRollout stores r as a new rollout, running at stage 0, with id,
// timestamps and actor from m. A change's policy that another active
// rollout stages, or a delete of a policy that does not exist, is
// ErrConflict.
func (b *Batch) StartRollout(m Meta, r *commandv1.Rollout) (*commandv1.Rollout, []byte, error) {
	locks := b.tx.Bucket(bucketRolloutLocks)
	for _, c := range r.GetChanges() {
		name := ChangeName(c)
		if id := locks.Get([]byte(name)); id != nil {
			return nil, nil, fmt.Errorf("policy %q is under rollout %s: %w", name, id, ErrConflict)
		}
		if c.GetOp() == OpDelete {
			if old, err := policyKind.get(b.tx, name); err != nil {
				return nil, nil, err
			} else if old == nil {
				return nil, nil, fmt.Errorf("policy %q does not exist, so a rollout cannot delete it: %w", name, ErrConflict)
			}
		}
	}
	stored := proto.CloneOf(r)
	at := m.ProcessedAt.UnixMilli()
	stored.Id = RolloutID(m.Index)
	stored.State, stored.Stage, stored.StageStartedAtUnixMs = RolloutRunning, 0, at
	stored.HaltReason = ""
	stored.Actor, stored.RequestId = m.Actor, m.RequestID
	stored.CreatedAtUnixMs, stored.UpdatedAtUnixMs = at, at
	for _, c := range stored.GetChanges() {
		if err := locks.Put([]byte(ChangeName(c)), []byte(stored.Id)); err != nil {
			return nil, nil, err
		}
	}
	scopes, err := b.rolloutScopes(stored)
	if err != nil {
		return nil, nil, err
	}
	doc, err := b.putRollout(m, stored, ActionCreate, scopes)
	return stored, doc, err
}

// TransitionRollout moves a rollout as t says, if it is in t's expected
// state and stage (else ErrConflict, as for a move the state machine does
// not allow); ErrNotFound if there is no such rollout. State completed
// writes the changes as ordinary policy writes, with the rollout's actor.
func (b *Batch) TransitionRollout(m Meta, t *commandv1.RolloutTransition) (*commandv1.Rollout, []byte, error) {
	r, err := getRollout(b.tx, t.GetId())
	if err != nil {
		return nil, nil, err
	}
	if r.GetState() != t.GetExpectState() || r.GetStage() != t.GetExpectStage() {
		return nil, nil, fmt.Errorf("rollout %s is %s at stage %d, not %s at stage %d: %w",
			r.GetId(), r.GetState(), r.GetStage(), t.GetExpectState(), t.GetExpectStage(), ErrConflict)
	}
	if err := checkTransition(r, t); err != nil {
		return nil, nil, err
	}
	at := t.GetAtUnixMs()
	if at == 0 {
		at = m.ProcessedAt.UnixMilli()
	}
	from := r.GetState()
	if t.GetStage() != r.GetStage() || (t.GetState() == RolloutRunning && from != RolloutRunning) {
		// A new stage, or a resume: the bake time starts again.
		r.StageStartedAtUnixMs = at
	}
	r.State, r.Stage = t.GetState(), t.GetStage()
	switch r.GetState() {
	case RolloutHalted, RolloutRolledBack, RolloutAborted:
		r.HaltReason = t.GetReason()
	case RolloutRunning:
		r.HaltReason = ""
	}
	r.UpdatedAtUnixMs = m.ProcessedAt.UnixMilli()
	if !RolloutActive(r.GetState()) {
		locks := b.tx.Bucket(bucketRolloutLocks)
		for _, c := range r.GetChanges() {
			if err := locks.Delete([]byte(ChangeName(c))); err != nil {
				return nil, nil, err
			}
		}
	}
	// Before completion rewrites them: the stored policies' scopes count.
	scopes, err := b.rolloutScopes(r)
	if err != nil {
		return nil, nil, err
	}
	b.seqEvents, b.evIndex = true, 0
	defer func() { b.seqEvents = false }()
	if r.GetState() == RolloutCompleted {
		if err := b.completeRollout(m, r); err != nil {
			return nil, nil, err
		}
	}
	doc, err := b.putRollout(m, r, ActionUpdate, scopes)
	return r, doc, err
}

// checkTransition refuses a move the state machine does not allow, as a
// conflict: the caller decided on a state this rollout is not in.
func checkTransition(r *commandv1.Rollout, t *commandv1.RolloutTransition) error {
	from, to := r.GetState(), t.GetState()
	ok := false
	switch {
	case !RolloutActive(from):
	case to == RolloutRunning && from == RolloutRunning:
		// Advance to the next stage (the last one completes instead).
		ok = t.GetStage() == r.GetStage()+1 && int(t.GetStage()) < len(r.GetStages())
	case t.GetStage() != r.GetStage():
	case to == RolloutRunning: // resume
		ok = from == RolloutPaused || from == RolloutHalted
	case to == RolloutPaused:
		ok = from == RolloutRunning
	case to == RolloutHalted:
		ok = from == RolloutRunning && r.GetOnHalt() == OnHaltStay
	case to == RolloutRolledBack:
		ok = from == RolloutRunning && r.GetOnHalt() != OnHaltStay
	case to == RolloutCompleted, to == RolloutAborted:
		ok = true
	}
	if !ok {
		return fmt.Errorf("rollout %s: cannot go from %s at stage %d to %s at stage %d: %w",
			r.GetId(), from, r.GetStage(), to, t.GetStage(), ErrConflict)
	}
	return nil
}

// completeRollout writes r's changes as ordinary policy writes. A delete of
// a policy already gone is skipped: the state it asks for holds (the lock
// keeps others from writing it, so this only guards an impossible case
// without leaving the batch half-written).
func (b *Batch) completeRollout(m Meta, r *commandv1.Rollout) error {
	pm := m
	pm.Actor, pm.RequestID, pm.RevertedTo = r.GetActor(), r.GetRequestId(), 0
	for _, c := range r.GetChanges() {
		if c.GetOp() == OpPut {
			p := policyOf(c.GetPolicy())
			p.Source = r.GetSource() // a source's rollout leaves its policy the source's
			if _, _, err := b.PutPolicy(pm, p, nil); err != nil {
				return fmt.Errorf("complete rollout %s: %w", r.GetId(), err)
			}
			continue
		}
		old, err := policyKind.get(b.tx, c.GetName())
		if err != nil {
			return err
		}
		if old == nil {
			continue
		}
		if err := b.DeletePolicy(pm, c.GetName(), nil); err != nil {
			return fmt.Errorf("complete rollout %s: %w", r.GetId(), err)
		}
	}
	return nil
}

// putRollout stores r, records its event and queues its notification. It
// returns the event's JSON (RolloutDoc).
func (b *Batch) putRollout(m Meta, r *commandv1.Rollout, action Action, scopes []policy.Scope) ([]byte, error) {
	raw, err := rolloutMarshal.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode rollout %s: %w", r.GetId(), err)
	}
	if err := b.tx.Bucket(bucketRollouts).Put([]byte(r.GetId()), raw); err != nil {
		return nil, err
	}
	doc, err := RolloutJSON(r)
	if err != nil {
		return nil, err
	}
	if len(scopes) == 0 {
		scopes = []policy.Scope{{}}
	}
	// The event (its org the first scope's), the entity-state versions of
	// the orgs touched, and the notification, whose data is the stored
	// protobuf rather than the event's JSON.
	if err := b.record(m, EntityRollout, r.GetId(), action, doc, scopes); err != nil {
		return nil, err
	}
	b.changes[len(b.changes)-1].Data = raw
	return doc, nil
}

// rolloutScopes is every scope r's changes touch: each put's scope, and
// the scope of each stored policy a change replaces or deletes.
func (b *Batch) rolloutScopes(r *commandv1.Rollout) ([]policy.Scope, error) {
	var out []policy.Scope
	add := func(sc policy.Scope) {
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	for _, c := range r.GetChanges() {
		if c.GetOp() == OpPut {
			add(policyOf(c.GetPolicy()).Scope)
		}
		old, err := policyKind.get(b.tx, ChangeName(c))
		if err != nil {
			return nil, err
		}
		if old != nil {
			add(old.Scope)
		}
	}
	return out, nil
}

// RolloutLock names the active rollout that stages policy name; "" if none.
func (b *Batch) RolloutLock(name string) string {
	return string(b.tx.Bucket(bucketRolloutLocks).Get([]byte(name)))
}

func getRollout(tx *bolt.Tx, id string) (*commandv1.Rollout, error) {
	raw := tx.Bucket(bucketRollouts).Get([]byte(id))
	if raw == nil {
		return nil, fmt.Errorf("rollout %q: %w", id, ErrNotFound)
	}
	var r commandv1.Rollout
	if err := proto.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("decode stored rollout %q: %w", id, err)
	}
	return &r, nil
}

// Rollout returns the rollout with id, or ErrNotFound.
func (s *Store) Rollout(id string) (*commandv1.Rollout, error) {
	var r *commandv1.Rollout
	err := s.view(func(tx *bolt.Tx) (err error) {
		r, err = getRollout(tx, id)
		return err
	})
	return r, err
}

// Rollouts returns every rollout, oldest first, with the applied index it
// read them at, in one transaction: what an in-memory index of the
// candidates reloads from (with RawPolicies at the same index).
func (s *Store) Rollouts() ([]*commandv1.Rollout, uint64, error) {
	var out []*commandv1.Rollout
	var index uint64
	err := s.view(func(tx *bolt.Tx) error {
		index = getUint(tx.Bucket(bucketMeta), keyAppliedIndex)
		return tx.Bucket(bucketRollouts).ForEach(func(k, v []byte) error {
			var r commandv1.Rollout
			if err := proto.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode stored rollout %q: %w", k, err)
			}
			out = append(out, &r)
			return nil
		})
	})
	if err != nil {
		return nil, 0, err
	}
	sortRollouts(out)
	return out, index, nil
}

// ActiveRollouts returns the rollouts that still stage their changes,
// oldest first: those the locks name, so that a caller that looks often
// (the leader's driver) does not read every rollout ever made.
func (s *Store) ActiveRollouts() ([]*commandv1.Rollout, error) {
	var out []*commandv1.Rollout
	err := s.view(func(tx *bolt.Tx) error {
		seen := map[string]bool{}
		return tx.Bucket(bucketRolloutLocks).ForEach(func(_, id []byte) error {
			if seen[string(id)] {
				return nil
			}
			seen[string(id)] = true
			r, err := getRollout(tx, string(id))
			if err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	sortRollouts(out)
	return out, nil
}

// sortRollouts orders rollouts oldest first ("r9" before "r10" when they
// were created in the same millisecond).
func sortRollouts(rs []*commandv1.Rollout) {
	slices.SortFunc(rs, func(a, b *commandv1.Rollout) int {
		return cmp.Or(cmp.Compare(a.GetCreatedAtUnixMs(), b.GetCreatedAtUnixMs()), cmp.Compare(len(a.GetId()), len(b.GetId())), cmp.Compare(a.GetId(), b.GetId()))
	})
}

// policyOf is the policy a command message carries (command.PolicyOf,
// which the store cannot import).
func policyOf(pb *commandv1.Policy) *policy.Policy {
	sc := pb.GetScope()
	return &policy.Policy{
		Name: pb.GetName(), Kind: pb.GetKind(), Labels: pb.GetLabels(), Spec: pb.GetSpec(),
		Enforcement: pb.GetEnforcement(),
		Scope:       policy.Scope{Org: sc.GetOrg(), Team: sc.GetTeam(), Employee: sc.GetEmployee()},
	}
}

// CandidatePolicy is a put of rollout r as sidecars in its cohort receive
// it: revision 0 (it is no revision yet) and created_at and updated_at the
// rollout's creation, so its stored bytes, and the set's version, are the
// same on every node.
func CandidatePolicy(r *commandv1.Rollout, p *commandv1.Policy) (RawPolicy, error) {
	pol := policyOf(p)
	pol.Source = r.GetSource()
	at := time.UnixMilli(r.GetCreatedAtUnixMs()).UTC()
	pol.CreatedAt, pol.UpdatedAt = at, at
	raw, err := pol.AppendJSON(nil)
	if err != nil {
		return RawPolicy{}, fmt.Errorf("candidate of rollout %s: %w", r.GetId(), err)
	}
	return RawPolicy{Policy: pol, Stored: raw}, nil
}

// RolloutDoc is a rollout's JSON: its event's data and the admin API's
// answer.
type RolloutDoc struct {
	ID             string             `json:"id"`
	Changes        []RolloutChangeDoc `json:"changes"`
	Stages         []RolloutStageDoc  `json:"stages"`
	MaxNackRatio   float64            `json:"max_nack_ratio"`
	MinAckCoverage float64            `json:"min_ack_coverage"`
	OnHalt         string             `json:"on_halt"`
	State          string             `json:"state"`
	Stage          uint32             `json:"stage"`
	StageStartedAt time.Time          `json:"stage_started_at"`
	HaltReason     string             `json:"halt_reason,omitempty"`
	Actor          string             `json:"actor,omitempty"`
	RequestID      string             `json:"request_id,omitempty"`
	CreatedAt      time.Time          `json:"created_at"`
	UpdatedAt      time.Time          `json:"updated_at"`
	// Source is the policy source that started it; omitted: the API.
	Source string `json:"source,omitempty"`
}

// RolloutChangeDoc is one change: a put carries the candidate policy
// (CandidatePolicy), a delete the name.
type RolloutChangeDoc struct {
	Op     string          `json:"op"`
	Policy json.RawMessage `json:"policy,omitempty"`
	Name   string          `json:"name,omitempty"`
}

// RolloutStageDoc is one stage; Bake is a Go duration ("2m0s").
type RolloutStageDoc struct {
	Percent uint32 `json:"percent"`
	Bake    string `json:"bake"`
}

// RolloutDocOf is r as JSON.
func RolloutDocOf(r *commandv1.Rollout) (*RolloutDoc, error) {
	ms := func(v int64) time.Time { return time.UnixMilli(v).UTC() }
	d := &RolloutDoc{
		ID: r.GetId(), Changes: []RolloutChangeDoc{}, Stages: []RolloutStageDoc{},
		MaxNackRatio: r.GetMaxNackRatio(), MinAckCoverage: r.GetMinAckCoverage(), OnHalt: r.GetOnHalt(),
		State: r.GetState(), Stage: r.GetStage(), StageStartedAt: ms(r.GetStageStartedAtUnixMs()),
		HaltReason: r.GetHaltReason(), Actor: r.GetActor(), RequestID: r.GetRequestId(),
		CreatedAt: ms(r.GetCreatedAtUnixMs()), UpdatedAt: ms(r.GetUpdatedAtUnixMs()), Source: r.GetSource(),
	}
	for _, c := range r.GetChanges() {
		cd := RolloutChangeDoc{Op: c.GetOp(), Name: c.GetName()}
		if c.GetOp() == OpPut {
			cp, err := CandidatePolicy(r, c.GetPolicy())
			if err != nil {
				return nil, err
			}
			cd.Policy, cd.Name = cp.Stored, ""
		}
		d.Changes = append(d.Changes, cd)
	}
	for _, s := range r.GetStages() {
		d.Stages = append(d.Stages, RolloutStageDoc{Percent: s.GetPercent(), Bake: (time.Duration(s.GetBakeMs()) * time.Millisecond).String()})
	}
	return d, nil
}

// RolloutJSON is RolloutDocOf encoded; deterministic.
func RolloutJSON(r *commandv1.Rollout) ([]byte, error) {
	d, err := RolloutDocOf(r)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode rollout %s: %w", r.GetId(), err)
	}
	return raw, nil
}
