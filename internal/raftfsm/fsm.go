// Package raftfsm adapts the store to hashicorp/raft: it decodes each log
// entry (internal/command), dispatches on its Body and applies a batch of
// entries in one store transaction; it owns Snapshot/Restore. It builds no
// commands and does no networking. Apply is deterministic: what must be
// equal on every replica travels in the command. An entry that does not
// decode panics, since it would diverge replicas; a business error is the
// entry's result; a store that cannot write goes to SetStoreFault's handler.
// See docs/design.md.
package raftfsm

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/policyd/policyd/internal/third_party/raft"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// FSM is the raft.BatchingFSM over a store.
type FSM struct {
	st      *store.Store
	logger  *slog.Logger
	fault   func(error) error // see SetStoreFault
	skipped atomic.Uint64
	// decoded holds the commands the leader already decoded, by the first
	// byte of their entry's data (see Decoded).
	decoded sync.Map // *byte → *command.Command
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

// prepare checks a command's payload and returns the function that applies
// it, or nil for an ignorable type this node does not know. Checking is
// separate from applying so that the leader can refuse, before proposing,
// what every replica would stop on (Check), and so that a bad payload is
// found before the batch is touched. The switch covers every field of
// commandv1.Body (TestEveryTypeApplies).
func prepare(m store.Meta, c *command.Command) (func(*store.Batch) *commandv1.Result, error) {
	switch k := c.Body.GetKind().(type) {
	case nil:
		return nil, nil
	case *commandv1.Body_PutPolicy:
		return preparePutPolicy(m, k.PutPolicy)
	case *commandv1.Body_DeletePolicy:
		return prepareDeletePolicy(m, k.DeletePolicy)
	case *commandv1.Body_PutEmployee:
		return preparePutEmployee(m, k.PutEmployee)
	case *commandv1.Body_DeleteEmployee:
		return prepareDeleteEmployee(m, k.DeleteEmployee)
	case *commandv1.Body_RegisterMember:
		return prepareRegisterMember(m, k.RegisterMember)
	case *commandv1.Body_RemoveMember:
		return prepareRemoveMember(m, k.RemoveMember)
	case *commandv1.Body_PruneEvents:
		return preparePruneEvents(m, k.PruneEvents)
	case *commandv1.Body_SetClusterId:
		return prepareSetClusterID(m, k.SetClusterId)
	case *commandv1.Body_RolloutStart:
		return prepareRolloutStart(m, k.RolloutStart)
	case *commandv1.Body_RolloutTransition:
		return prepareRolloutTransition(m, k.RolloutTransition)
	case *commandv1.Body_SyncSource:
		return prepareSyncSource(m, k.SyncSource)
	case *commandv1.Body_RequestSourceSync:
		return prepareRequestSourceSync(m, k.RequestSourceSync)
	case *commandv1.Body_ObserveDrift:
		return prepareObserveDrift(m, k.ObserveDrift)
	case *commandv1.Body_RecordDriftDelivery:
		return prepareRecordDriftDelivery(m, k.RecordDriftDelivery)
	case *commandv1.Body_CompleteDriftTasks:
		return prepareCompleteDriftTasks(m, k.CompleteDriftTasks)
	case *commandv1.Body_PruneDrift:
		return preparePruneDrift(m, k.PruneDrift)
	case *commandv1.Body_ReloadObserve:
		return prepareReloadObserve(m, k.ReloadObserve)
	case *commandv1.Body_ReloadRestarted:
		return prepareReloadRestarted(m, k.ReloadRestarted)
	case *commandv1.Body_ReloadRestartFailed:
		return prepareReloadRestartFailed(m, k.ReloadRestartFailed)
	default:
		return nil, fmt.Errorf("command type %d has no apply", c.Type())
	}
}

// Check refuses a command that every replica would stop on: what the FSM
// checks before applying, run on the leader before the command enters the
// log, on the decoded command rather than on its bytes.
func Check(c *command.Command) error {
	_, err := prepare(store.Meta{}, c)
	return err
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

// Decoded records that data is the entry of c, already decoded on this node,
// so that applying it here takes c instead of decoding data again: raft hands
// the leader's FSM the very bytes the leader proposed. The record holds data
// alive, so its address is not reused while it is kept; forget drops it
// once the entry has applied or will not apply here. c must be what data
// decodes to, and nothing else may hold it.
func (f *FSM) Decoded(data []byte, c *command.Command) (forget func()) {
	k := unsafe.SliceData(data)
	f.decoded.Store(k, c)
	return func() { f.decoded.Delete(k) }
}

func (f *FSM) applyOne(b *store.Batch, l *raft.Log) *commandv1.Result {
	var e *Entry
	var err error
	if c, ok := f.decoded.LoadAndDelete(unsafe.SliceData(l.Data)); ok && len(l.Data) > 0 {
		e, err = entryOf(l.Index, c.(*command.Command))
	} else {
		e, err = DecodeEntry(l.Index, l.Data)
	}
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
	Type command.Type
	Meta store.Meta
	// Apply writes the command into a batch; nil for an unknown type that
	// carries IgnoreUnknown (the entry is skipped).
	Apply func(b *store.Batch) *commandv1.Result
}

// DecodeEntry decodes a log entry's envelope and payload without applying
// it. Any error means the entry is corrupt or comes from a node that knows
// commands this one does not; the FSM stops on it rather than diverge.
func DecodeEntry(index uint64, data []byte) (*Entry, error) {
	c, err := command.Unmarshal(data)
	if err != nil {
		return nil, fmt.Errorf("entry %d: %w", index, err)
	}
	return entryOf(index, c)
}

// entryOf is the entry at index carrying c.
func entryOf(index uint64, c *command.Command) (*Entry, error) {
	var err error
	e := &Entry{
		Type: c.Type(),
		Meta: store.Meta{
			Index:        index,
			ProcessedAt:  time.Unix(0, c.ProcessedAtUnixNano).UTC(),
			OriginatedAt: time.Unix(0, c.OriginatedAtUnixNano).UTC(),
			Actor:        c.Actor,
			RequestID:    c.RequestID,
			RevertedTo:   c.RevertedTo,
		},
	}
	if e.Apply, err = prepare(e.Meta, c); err != nil {
		return nil, fmt.Errorf("entry %d: %w", index, err)
	}
	return e, nil
}

func preparePutPolicy(m store.Meta, c *commandv1.PutPolicy) (func(*store.Batch) *commandv1.Result, error) {
	p, err := putPolicyOf(c)
	if err != nil {
		return nil, err
	}
	if err := command.CheckKeys("put policy", "name", p.Name, "org", p.Scope.Org); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		if err := underRollout(b, p.Name); err != nil {
			return result(m.Index, 0, err)
		}
		if err := b.CheckAPIWrite(p.Name); err != nil {
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
		return command.PolicyOf(pb), nil
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
		return command.EmployeeOf(pb), nil
	}
	var e policy.Employee
	if err := json.Unmarshal(c.GetEmployeeJson(), &e); err != nil {
		return nil, fmt.Errorf("decode employee: %w", err)
	}
	return &e, nil
}

func prepareDeletePolicy(m store.Meta, c *commandv1.DeletePolicy) (func(*store.Batch) *commandv1.Result, error) {
	if err := command.CheckKeys("delete policy", "name", c.GetName()); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		if err := underRollout(b, c.GetName()); err != nil {
			return result(m.Index, 0, err)
		}
		if err := b.CheckAPIWrite(c.GetName()); err != nil {
			return result(m.Index, 0, err)
		}
		return result(m.Index, m.Index, b.DeletePolicy(m, c.GetName(), fromPrecondition(c.GetIfMatch())))
	}, nil
}

func preparePutEmployee(m store.Meta, c *commandv1.PutEmployee) (func(*store.Batch) *commandv1.Result, error) {
	e, err := putEmployeeOf(c)
	if err != nil {
		return nil, err
	}
	if err := command.CheckKeys("put employee", "id", e.ID, "org", e.Org); err != nil {
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

func prepareDeleteEmployee(m store.Meta, c *commandv1.DeleteEmployee) (func(*store.Batch) *commandv1.Result, error) {
	if err := command.CheckKeys("delete employee", "id", c.GetId()); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.DeleteEmployee(m, c.GetId(), fromPrecondition(c.GetIfMatch())))
	}, nil
}

func prepareRegisterMember(m store.Meta, c *commandv1.RegisterMember) (func(*store.Batch) *commandv1.Result, error) {
	if err := command.CheckKeys("register member", "id", c.GetId()); err != nil {
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

func prepareRemoveMember(m store.Meta, c *commandv1.RemoveMember) (func(*store.Batch) *commandv1.Result, error) {
	if err := command.CheckKeys("remove member", "id", c.GetId()); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.DeleteMember(m, c.GetId()))
	}, nil
}

func preparePruneEvents(m store.Meta, c *commandv1.PruneEvents) (func(*store.Batch) *commandv1.Result, error) {
	cutoff := time.Unix(0, c.GetCutoffUnixNano())
	return func(b *store.Batch) *commandv1.Result {
		n, err := b.PruneEventsRecorded(m, cutoff)
		// Revision carries the count, so the leader knows whether to prune again.
		return result(m.Index, uint64(n), err)
	}, nil
}

func prepareSetClusterID(m store.Meta, c *commandv1.SetClusterID) (func(*store.Batch) *commandv1.Result, error) {
	if !command.ClusterIDPattern.MatchString(c.GetId()) {
		return nil, fmt.Errorf("cluster ID %q is not %s", c.GetId(), command.ClusterIDPattern)
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, 0, b.SetClusterID(m, c.GetId()))
	}, nil
}

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
