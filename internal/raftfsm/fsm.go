// Package raftfsm adapts the store to hashicorp/raft: it decodes each log
// entry's command envelope, dispatches on its type byte, and applies a whole
// batch of entries in one store transaction. It owns the command encoding and
// Snapshot/Restore, and does no networking.
//
// Apply is deterministic: everything that must be equal on every replica
// (timestamps, IDs other than the Raft index) travels in the command. An
// entry that does not decode, or an unknown type without the IgnoreUnknown
// bit, is a bug or a version skew that would diverge replicas, so it panics;
// a business error (a failed compare-and-set, a missing entity) is returned
// as the entry's result and changes nothing. A batch or snapshot the store
// cannot write (a full disk) goes to the node's fault handler, which ends
// the node without a panic (SetStoreFault); without one it panics too.
package raftfsm

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// FSM is the raft.BatchingFSM over a store.
type FSM struct {
	st      *store.Store
	logger  *slog.Logger
	fault   func(error) error // see SetStoreFault
	skipped atomic.Uint64
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.BatchingFSM = (*FSM)(nil)
)

// New returns the FSM that applies entries to st.
func New(st *store.Store, logger *slog.Logger) *FSM {
	return &FSM{st: st, logger: logger}
}

// SetStoreFault sets what happens when the store cannot take a batch or a
// snapshot (a full disk): fault gets the error. A node's handler ends the
// node and does not return, so that raft neither panics nor acknowledges
// anything after the failed write; if it returns, ApplyBatch panics and
// Restore returns the error it gave. Call it before raft starts.
func (f *FSM) SetStoreFault(fault func(error) error) { f.fault = fault }

// decodeFunc decodes one command type's payload into the function that
// applies it. Decoding is separate from applying so that it can be fuzzed
// and so that a bad payload is found before the batch is touched.
type decodeFunc func(m store.Meta, payload []byte) (func(b *store.Batch) *commandv1.Result, error)

// decoders is the dispatch table. A type absent here is unknown.
var decoders = map[Type]decodeFunc{
	TypePutPolicy:      decodePutPolicy,
	TypeDeletePolicy:   decodeDeletePolicy,
	TypePutEmployee:    decodePutEmployee,
	TypeDeleteEmployee: decodeDeleteEmployee,
	TypeRegisterMember: decodeRegisterMember,
	TypeRemoveMember:   decodeRemoveMember,
	TypePruneEvents:    decodePruneEvents,
	TypeSetClusterID:   decodeSetClusterID,

	// Staged rollouts (docs/rollouts.md).
	TypeRolloutStart:      decodeRolloutStart,
	TypeRolloutTransition: decodeRolloutTransition,

	// Drift (docs/drift.md).
	TypeObserveDrift:        decodeObserveDrift,
	TypeRecordDriftDelivery: decodeRecordDriftDelivery,
	TypeCompleteDriftTasks:  decodeCompleteDriftTasks,
	TypePruneDrift:          decodePruneDrift,

	// Reload (docs/operations.md).
	TypeReloadObserve:       decodeReloadObserve,
	TypeReloadRestarted:     decodeReloadRestarted,
	TypeReloadRestartFailed: decodeReloadRestartFailed,
}

// Skipped is how many entries of an unknown type marked IgnoreUnknown this
// FSM skipped since it started: a newer node's commands, during a rolling
// upgrade.
func (f *FSM) Skipped() uint64 { return f.skipped.Load() }

// Apply applies a single entry.
func (f *FSM) Apply(l *raft.Log) any {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies entries in one store transaction. Entries at or below
// the store's applied index were applied before a restart and are skipped:
// the FSM is persistent and raft replays its log from the last snapshot.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	if len(logs) == 0 {
		return out
	}
	last := logs[len(logs)-1].Index
	applied := f.st.AppliedIndex()
	if last <= applied {
		return out
	}
	err := f.st.ApplyBatch(last, func(b *store.Batch) error {
		for i, l := range logs {
			if l.Index <= applied || l.Type != raft.LogCommand {
				continue
			}
			out[i] = f.applyOne(b, l)
		}
		return nil
	})
	if err != nil {
		// The state file can't be written. Carrying on would acknowledge
		// entries that are not stored; stop the node instead.
		if f.fault != nil {
			err = f.fault(err)
		}
		panic(fmt.Sprintf("raftfsm: %v", err))
	}
	return out
}

func (f *FSM) applyOne(b *store.Batch, l *raft.Log) *commandv1.Result {
	e, err := DecodeEntry(l.Index, l.Data)
	if err != nil {
		panic(fmt.Sprintf("raftfsm: %v", err))
	}
	if e.Apply == nil {
		f.skipped.Add(1)
		f.logger.Warn("skipping unknown command type marked ignorable", "index", l.Index, "type", uint8(e.Type))
		return &commandv1.Result{Index: l.Index}
	}
	return e.Apply(b)
}

// Entry is a decoded log entry, ready to apply.
type Entry struct {
	Type Type
	Meta store.Meta
	// Apply writes the command into a batch; nil for an unknown type that
	// carries IgnoreUnknown (the entry is skipped).
	Apply func(b *store.Batch) *commandv1.Result
}

// DecodeEntry decodes a log entry's envelope and payload without applying
// it. Any error means the entry is corrupt or comes from a node that knows
// commands this one does not; the FSM stops on it rather than diverge.
func DecodeEntry(index uint64, data []byte) (*Entry, error) {
	var cmd commandv1.Command
	if err := proto.Unmarshal(data, &cmd); err != nil {
		return nil, fmt.Errorf("entry %d: decode command envelope: %w", index, err)
	}
	if cmd.GetType() > 0xff {
		return nil, fmt.Errorf("entry %d: command type %d is not a byte", index, cmd.GetType())
	}
	e := &Entry{
		Type: Type(cmd.GetType()),
		Meta: store.Meta{
			Index:        index,
			ProcessedAt:  time.Unix(0, cmd.GetProcessedAtUnixNano()).UTC(),
			OriginatedAt: time.Unix(0, cmd.GetOriginatedAtUnixNano()).UTC(),
			Actor:        cmd.GetActor(),
			RequestID:    cmd.GetRequestId(),
			RevertedTo:   cmd.GetRevertedTo(),
		},
	}
	dec, ok := decoders[e.Type]
	if !ok {
		if e.Type&IgnoreUnknown != 0 {
			return e, nil
		}
		return nil, fmt.Errorf("entry %d: unknown command type %d (0x%02x) without the ignore flag; this node is older than the cluster", index, e.Type, uint8(e.Type))
	}
	apply, err := dec(e.Meta, cmd.GetPayload())
	if err != nil {
		return nil, fmt.Errorf("entry %d: %w", index, err)
	}
	e.Apply = apply
	return e, nil
}

// MaxKeyLen bounds every name, id and org a command carries. The admin API's
// rules are far stricter (253 characters); this bound only guarantees that
// no accepted entry can fail in the store (bbolt keys are at most 32 KiB),
// because an entry that fails to apply stops every replica.
const MaxKeyLen = 1024

// checkKeys rejects empty or oversize keys, as field/value pairs.
func checkKeys(what string, kv ...string) error {
	for i := 0; i+1 < len(kv); i += 2 {
		field, v := kv[i], kv[i+1]
		if field != "org" && v == "" {
			return fmt.Errorf("%s: empty %s", what, field)
		}
		if len(v) > MaxKeyLen {
			return fmt.Errorf("%s: %s is %d bytes, more than %d", what, field, len(v), MaxKeyLen)
		}
	}
	return nil
}

func decodePayload(payload []byte, msg proto.Message) error {
	if err := proto.Unmarshal(payload, msg); err != nil {
		return fmt.Errorf("decode %T: %w", msg, err)
	}
	return nil
}

func decodePutPolicy(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.PutPolicy
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	p, err := putPolicyOf(&c)
	if err != nil {
		return nil, err
	}
	if err := checkKeys("put policy", "name", p.Name, "org", p.Scope.Org); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		if err := underRollout(b, p.Name); err != nil {
			return result(m.Index, 0, err)
		}
		stored, raw, err := b.PutPolicy(m, p, fromPrecondition(c.GetIfMatch()))
		if err != nil {
			return result(m.Index, 0, err)
		}
		return storedResult(m.Index, stored.Revision, raw)
	}, nil
}

// putPolicyOf is the policy a put carries: typed, read as it is, or in an
// entry of command version 1, its JSON (the proposer's canonical form).
func putPolicyOf(c *commandv1.PutPolicy) (*policy.Policy, error) {
	if pb := c.GetPolicy(); pb != nil {
		return PolicyOf(pb), nil
	}
	p, err := policy.DecodeStored(c.GetPolicyJson())
	if err != nil {
		return nil, fmt.Errorf("decode policy: %w", err)
	}
	return p, nil
}

// putEmployeeOf is putPolicyOf for an employee.
func putEmployeeOf(c *commandv1.PutEmployee) (*policy.Employee, error) {
	if pb := c.GetEmployee(); pb != nil {
		return EmployeeOf(pb), nil
	}
	var e policy.Employee
	if err := json.Unmarshal(c.GetEmployeeJson(), &e); err != nil {
		return nil, fmt.Errorf("decode employee: %w", err)
	}
	return &e, nil
}

func decodeDeletePolicy(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.DeletePolicy
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	if err := checkKeys("delete policy", "name", c.GetName()); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		if err := underRollout(b, c.GetName()); err != nil {
			return result(m.Index, 0, err)
		}
		return result(m.Index, m.Index, b.DeletePolicy(m, c.GetName(), fromPrecondition(c.GetIfMatch())))
	}, nil
}

func decodePutEmployee(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.PutEmployee
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	e, err := putEmployeeOf(&c)
	if err != nil {
		return nil, err
	}
	if err := checkKeys("put employee", "id", e.ID, "org", e.Org); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		stored, raw, err := b.PutEmployee(m, e, fromPrecondition(c.GetIfMatch()))
		if err != nil {
			return result(m.Index, 0, err)
		}
		return storedResult(m.Index, stored.Revision, raw)
	}, nil
}

func decodeDeleteEmployee(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.DeleteEmployee
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	if err := checkKeys("delete employee", "id", c.GetId()); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.DeleteEmployee(m, c.GetId(), fromPrecondition(c.GetIfMatch())))
	}, nil
}

func decodeRegisterMember(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.RegisterMember
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	if err := checkKeys("register member", "id", c.GetId()); err != nil {
		return nil, err
	}
	mem := store.Member{
		ID: c.GetId(), RaftAddr: c.GetRaftAddr(), HTTPAddr: c.GetHttpAddr(), GRPCAddr: c.GetGrpcAddr(),
		CommandVersion: c.GetCommandVersion(),
	}
	reset := c.GetResetVersions()
	return func(b *store.Batch) *commandv1.Result {
		if reset {
			if err := b.ResetMemberVersions(m, mem.ID); err != nil {
				return result(m.Index, 0, err)
			}
		}
		return result(m.Index, m.Index, b.PutMember(m, mem))
	}, nil
}

func decodeRemoveMember(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.RemoveMember
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	if err := checkKeys("remove member", "id", c.GetId()); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.DeleteMember(m, c.GetId()))
	}, nil
}

func decodePruneEvents(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.PruneEvents
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	cutoff := time.Unix(0, c.GetCutoffUnixNano())
	return func(b *store.Batch) *commandv1.Result {
		n, err := b.PruneEventsRecorded(m, cutoff)
		// Revision carries the count, so the leader knows whether to prune again.
		return result(m.Index, uint64(n), err)
	}, nil
}

func decodeSetClusterID(m store.Meta, payload []byte) (func(*store.Batch) *commandv1.Result, error) {
	var c commandv1.SetClusterID
	if err := decodePayload(payload, &c); err != nil {
		return nil, err
	}
	if !ClusterIDPattern.MatchString(c.GetId()) {
		return nil, fmt.Errorf("cluster ID %q is not %s", c.GetId(), ClusterIDPattern)
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, 0, b.SetClusterID(m, c.GetId()))
	}, nil
}

// ClusterIDPattern is what a cluster ID looks like: 32 lowercase hex digits.
var ClusterIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Snapshot captures the store as of the last applied entry. Persist streams it
// while applies continue.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	sn, err := f.st.Snapshot()
	if err != nil {
		return nil, err
	}
	return &fsmSnapshot{sn: sn}, nil
}

// Restore replaces the store with a snapshot (a bbolt file image).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.st.Restore(rc); err != nil {
		if f.fault != nil {
			err = f.fault(err)
		}
		return fmt.Errorf("raftfsm restore: %w", err)
	}
	return nil
}

type fsmSnapshot struct{ sn *store.Snapshot }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.sn.WriteTo(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() { s.sn.Release() }
