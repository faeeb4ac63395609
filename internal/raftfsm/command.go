package raftfsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// Type is a command's type byte. Numbers are never reused: a retired command
// keeps its number, commented out, so an old log never decodes as something
// else.
type Type uint8

// IgnoreUnknown is the flag bit that lets a node skip a command type it does
// not know (a newer node's optional command during a rolling upgrade).
// Without it, an unknown type stops the node: skipping would diverge state.
const IgnoreUnknown Type = 0x80

// Command types: every number in one table. A number is never reused once
// released, even for a retired command, and numbers are unique with the
// IgnoreUnknown bit masked (TestTypesUnique).
const (
	TypePutPolicy      Type = 1
	TypeDeletePolicy   Type = 2
	TypePutEmployee    Type = 3
	TypeDeleteEmployee Type = 4
	TypeRegisterMember Type = 5
	TypeRemoveMember   Type = 6
	TypePruneEvents    Type = 7

	// Reload (docs/operations.md): the leader's reload controller records its
	// hash cache, its pending-restart queue and the outcome of every restart
	// attempt. Ignorable: the state is the controller's memory, rebuilt from
	// Kubernetes, so a node of an older version that skips them at worst
	// restarts a Deployment once more when it leads later; stopping instead
	// would take the old replicas down as soon as an upgraded leader with
	// reload enabled starts.
	TypeReloadObserve       = IgnoreUnknown | 8
	TypeReloadRestarted     = IgnoreUnknown | 9
	TypeReloadRestartFailed = IgnoreUnknown | 10

	// Drift (docs/drift.md): the webhook's observations, and the leader's
	// record of the follow-up it performed.
	TypeObserveDrift        Type = 11
	TypeRecordDriftDelivery Type = 12
	TypeCompleteDriftTasks  Type = 13
	TypePruneDrift          Type = 14

	// TypeSetClusterID is ignorable: the ID only guards peer handshakes,
	// which an older node does not make.
	TypeSetClusterID = IgnoreUnknown | 15

	// Staged rollouts (docs/rollouts.md), command version 4. Not
	// ignorable: a node that skipped them would serve other sets and accept
	// writes the others refuse.
	TypeRolloutStart      Type = 16
	TypeRolloutTransition Type = 17
)

// ErrInvalidCommand is returned by ResultErr for a command the FSM rejected
// as malformed (it never changes state).
var ErrInvalidCommand = errors.New("invalid command")

// NewCommand wraps payload in an envelope of type t. Timestamps are left for
// the proposer: OriginatedAt by the receiving node, ProcessedAt by the leader.
func NewCommand(t Type, payload proto.Message) (*commandv1.Command, error) {
	b, err := proto.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("encode command type %d: %w", t, err)
	}
	return &commandv1.Command{Type: uint32(t), Payload: b}, nil
}

// CommandVersion is the newest command encoding this node reads and
// writes. Version 1 carried policies and employees as JSON, which every
// replica parsed again; version 2 carries them as typed messages. A node
// registers its version with its addresses, and writes version 2 only once
// every voter reads it (ForVersion), so that a rolling upgrade never puts an
// entry in the log that a node still running the older release cannot apply.
// Version 3 adds the audit fields of the envelope (actor, request_id,
// reverted_to): a node of version 2 drops them unread, so its events would
// lack what the others' hold, and they are written only once every member
// reads them. Version 4 adds the rollout commands (RolloutVersion), which
// are refused until every member reads them.
const CommandVersion = 4

// Actors of the leader's own tasks: the "task:" prefix is reserved for
// them (an admin token's actor is "token:NAME", a client certificate's
// "cert:SUBJECT").
const (
	ActorReload    = "task:reload"    // the reload controller (restarts, hash cache)
	ActorDrift     = "task:drift"     // the drift webhook's sink and follow-up, and drift pruning
	ActorRetention = "task:retention" // event log pruning
)

// auditVersion is the command version that introduced the envelope's audit
// fields.
const auditVersion = 3

// MaxActorLen bounds an actor name; a certificate subject is the longest.
const MaxActorLen = 1024

// MaxRequestIDLen bounds a request id (X-Request-Id).
const MaxRequestIDLen = 128

// CheckActor refuses an actor name that is empty, too long, not valid UTF-8
// or holds control characters: it is shown to operators in listings and
// terminals, where such characters could forge or hide entries.
func CheckActor(actor string) error {
	switch {
	case actor == "":
		return errors.New("actor: empty")
	case len(actor) > MaxActorLen:
		return fmt.Errorf("actor: %d bytes, more than %d", len(actor), MaxActorLen)
	case !utf8.ValidString(actor):
		return fmt.Errorf("actor %q: not valid UTF-8", actor)
	}
	for _, r := range actor {
		if unicode.IsControl(r) {
			return fmt.Errorf("actor %q: holds control character %U", actor, r)
		}
	}
	return nil
}

// ValidRequestID reports whether id is usable as a request id: 1 to
// MaxRequestIDLen bytes of printable ASCII.
func ValidRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// CheckEnvelope refuses a command whose audit fields are malformed; the
// leader runs it before anything enters the log.
func CheckEnvelope(cmd *commandv1.Command) error {
	if a := cmd.GetActor(); a != "" {
		if err := CheckActor(a); err != nil {
			return err
		}
	}
	if id := cmd.GetRequestId(); id != "" && !ValidRequestID(id) {
		return fmt.Errorf("request id %q: want 1 to %d bytes of printable ASCII", id, MaxRequestIDLen)
	}
	return nil
}

// WithAudit returns cmd with its actor and request id set.
func WithAudit(cmd *commandv1.Command, actor, requestID string) *commandv1.Command {
	cmd.Actor, cmd.RequestId = actor, requestID
	return cmd
}

// HasAudit reports whether cmd carries any field of command version 3.
func HasAudit(cmd *commandv1.Command) bool {
	return cmd.GetActor() != "" || cmd.GetRequestId() != "" || cmd.GetRevertedTo() != 0
}

// PutPolicy builds the command that stores p: its spec canonicalised once,
// here, on the node that took the write (server-managed fields are dropped;
// the FSM sets them).
func PutPolicy(p *policy.Policy, ifMatch *uint64) (*commandv1.Command, error) {
	spec, err := p.CanonicalSpec()
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", p.Name, err)
	}
	pb := &commandv1.Policy{
		Name: p.Name, Kind: p.Kind, Labels: p.Labels, Spec: spec,
		Enforcement: policy.CanonicalEnforcement(p.Enforcement),
		Scope:       &commandv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
	}
	return NewCommand(TypePutPolicy, &commandv1.PutPolicy{Policy: pb, IfMatch: precondition(ifMatch)})
}

// IsShadowPut reports whether cmd is a PutPolicy of a shadow policy
// (command version 4: RolloutVersion).
func IsShadowPut(cmd *commandv1.Command) bool {
	if Type(cmd.GetType()) != TypePutPolicy {
		return false
	}
	var c commandv1.PutPolicy
	if err := decodePayload(cmd.GetPayload(), &c); err != nil {
		return false
	}
	return c.GetPolicy().GetEnforcement() == policy.EnforcementShadow
}

// PolicyOf is the policy a typed command carries. The spec aliases the
// message's bytes, which proto.Unmarshal owns.
func PolicyOf(pb *commandv1.Policy) *policy.Policy {
	sc := pb.GetScope()
	return &policy.Policy{
		Name: pb.GetName(), Kind: pb.GetKind(), Labels: pb.GetLabels(), Spec: pb.GetSpec(),
		Enforcement: pb.GetEnforcement(),
		Scope:       policy.Scope{Org: sc.GetOrg(), Team: sc.GetTeam(), Employee: sc.GetEmployee()},
	}
}

// PutEmployee builds the command that stores e.
func PutEmployee(e *policy.Employee, ifMatch *uint64) (*commandv1.Command, error) {
	pb := &commandv1.Employee{Id: e.ID, Org: e.Org, Team: e.Team, Status: e.Status}
	return NewCommand(TypePutEmployee, &commandv1.PutEmployee{Employee: pb, IfMatch: precondition(ifMatch)})
}

// EmployeeOf is the employee a typed command carries.
func EmployeeOf(pb *commandv1.Employee) *policy.Employee {
	return &policy.Employee{ID: pb.GetId(), Org: pb.GetOrg(), Team: pb.GetTeam(), Status: pb.GetStatus()}
}

// ForVersion returns cmd as a cluster whose oldest voter reads command
// version v can apply it: unchanged for v >= 3; below 3 without the audit
// fields (actor, request_id, reverted_to), which such a node would drop
// while newer ones store them; below 2 also with a typed policy or
// employee written as the JSON that version 1 reads. The proposer calls it,
// and the leader again, since a follower's view of the members may lag.
func ForVersion(cmd *commandv1.Command, v uint32) (*commandv1.Command, error) {
	if v >= CommandVersion {
		return cmd, nil
	}
	if v < RolloutVersion && IsShadowPut(cmd) {
		// Such a node would drop the enforcement field and enforce the
		// policy; the proposer's gate refuses it first.
		return nil, fmt.Errorf("a shadow policy needs every member to read command version %d; the oldest reads %d", RolloutVersion, v)
	}
	if v < auditVersion && HasAudit(cmd) {
		cmd = proto.CloneOf(cmd)
		cmd.Actor, cmd.RequestId, cmd.RevertedTo = "", "", 0
	}
	if v >= 2 {
		return cmd, nil
	}
	switch Type(cmd.GetType()) {
	case TypePutPolicy:
		var c commandv1.PutPolicy
		if err := decodePayload(cmd.GetPayload(), &c); err != nil || c.GetPolicy() == nil {
			return cmd, err
		}
		raw, err := PolicyOf(c.GetPolicy()).AppendJSON(nil)
		if err != nil {
			return nil, err
		}
		return downgraded(cmd, &commandv1.PutPolicy{PolicyJson: raw, IfMatch: c.GetIfMatch()})
	case TypePutEmployee:
		var c commandv1.PutEmployee
		if err := decodePayload(cmd.GetPayload(), &c); err != nil || c.GetEmployee() == nil {
			return cmd, err
		}
		raw, err := json.Marshal(EmployeeOf(c.GetEmployee()))
		if err != nil {
			return nil, fmt.Errorf("encode employee: %w", err)
		}
		return downgraded(cmd, &commandv1.PutEmployee{EmployeeJson: raw, IfMatch: c.GetIfMatch()})
	}
	return cmd, nil
}

// downgraded is cmd with payload in place of its own, timestamps kept.
func downgraded(cmd *commandv1.Command, payload proto.Message) (*commandv1.Command, error) {
	b, err := proto.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("encode command type %d: %w", cmd.GetType(), err)
	}
	cp := proto.CloneOf(cmd)
	cp.Payload = b
	return cp, nil
}

// DeletePolicy builds the command that deletes a policy.
func DeletePolicy(name string, ifMatch *uint64) (*commandv1.Command, error) {
	return NewCommand(TypeDeletePolicy, &commandv1.DeletePolicy{Name: name, IfMatch: precondition(ifMatch)})
}

// DeleteEmployee builds the command that deletes an employee.
func DeleteEmployee(id string, ifMatch *uint64) (*commandv1.Command, error) {
	return NewCommand(TypeDeleteEmployee, &commandv1.DeleteEmployee{Id: id, IfMatch: precondition(ifMatch)})
}

// RegisterMember builds the command that records a node's addresses and
// command version.
func RegisterMember(m store.Member) (*commandv1.Command, error) {
	return NewCommand(TypeRegisterMember, &commandv1.RegisterMember{
		Id: m.ID, RaftAddr: m.RaftAddr, HttpAddr: m.HTTPAddr, GrpcAddr: m.GRPCAddr,
		CommandVersion: m.CommandVersion,
	})
}

// RegisterMemberAfresh is RegisterMember for a node's first registration
// after an upgrade: every other member's recorded command version is
// cleared, so that each registers again (commandv1.RegisterMember's
// reset_versions).
func RegisterMemberAfresh(m store.Member) (*commandv1.Command, error) {
	return NewCommand(TypeRegisterMember, &commandv1.RegisterMember{
		Id: m.ID, RaftAddr: m.RaftAddr, HttpAddr: m.HTTPAddr, GrpcAddr: m.GRPCAddr,
		CommandVersion: m.CommandVersion, ResetVersions: true,
	})
}

// RemoveMember builds the command that forgets a node's addresses.
func RemoveMember(id string) (*commandv1.Command, error) {
	return NewCommand(TypeRemoveMember, &commandv1.RemoveMember{Id: id})
}

// SetClusterID builds the command that names the cluster.
func SetClusterID(id string) (*commandv1.Command, error) {
	return NewCommand(TypeSetClusterID, &commandv1.SetClusterID{Id: id})
}

// PruneEvents builds the command that deletes events processed before cutoff.
func PruneEvents(cutoff time.Time) (*commandv1.Command, error) {
	return NewCommand(TypePruneEvents, &commandv1.PruneEvents{CutoffUnixNano: cutoff.UnixNano()})
}

func precondition(ifMatch *uint64) *commandv1.Precondition {
	if ifMatch == nil {
		return nil
	}
	return &commandv1.Precondition{Revision: *ifMatch}
}

func fromPrecondition(p *commandv1.Precondition) *uint64 {
	if p == nil {
		return nil
	}
	v := p.GetRevision()
	return &v
}

// Result codes carried in commandv1.Result.Code.
const (
	codeNotFound = "not_found"
	codeConflict = "conflict"
)

// result turns a business error from the store into an apply response.
func result(index, revision uint64, err error) *commandv1.Result {
	r := &commandv1.Result{Index: index, Revision: revision}
	switch {
	case err == nil:
	case errors.Is(err, store.ErrNotFound):
		r.Code, r.Message = codeNotFound, err.Error()
	case errors.Is(err, store.ErrConflict):
		r.Code, r.Message = codeConflict, err.Error()
	default:
		// Not a business error: the transaction may be half-written. Stop
		// rather than commit it (see ApplyBatch).
		panic(fmt.Sprintf("raftfsm: entry %d: store: %v", index, err))
	}
	return r
}

// storedResult is a put's response: it carries the stored JSON, so that
// the node that took the request can answer with it before it applies the
// entry itself.
func storedResult(index, revision uint64, raw []byte) *commandv1.Result {
	return &commandv1.Result{Index: index, Revision: revision, Value: raw}
}

// ResultErr turns an apply response back into an error wrapping the store's
// sentinel (store.ErrNotFound, store.ErrConflict) or ErrInvalidCommand; nil on
// success. It is the inverse of what Apply returns, also across a forwarded
// write.
func ResultErr(r *commandv1.Result) error {
	if r == nil {
		return fmt.Errorf("%w: empty apply result", ErrInvalidCommand)
	}
	switch r.GetCode() {
	case "":
		return nil
	case codeNotFound:
		return &resultError{msg: r.GetMessage(), err: store.ErrNotFound}
	case codeConflict:
		return &resultError{msg: r.GetMessage(), err: store.ErrConflict}
	default:
		return &resultError{msg: r.GetMessage(), err: ErrInvalidCommand}
	}
}

type resultError struct {
	msg string
	err error
}

func (e *resultError) Error() string { return e.msg }
func (e *resultError) Unwrap() error { return e.err }
