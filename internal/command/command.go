// Package command owns the commands of the Raft log: the one table of their
// types (commandv1.Body, whose field numbers are the type bytes), building
// them where a write is taken, the checks a leader makes before one enters
// the log, and their encoding for the oldest member. It does not apply
// them; raftfsm does. See docs/design.md.
package command

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"unicode"
	"unicode/utf8"

	commandv1 "github.com/policyd/policyd/api/command/v1"
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

// Command types. commandv1.Body is their one table: each number is its
// payload's field number there (TestTypesAreBodyFields), never reused once
// released, even for a retired command, and unique with the IgnoreUnknown
// bit masked. The features' own types are in their files: reload.go,
// drift.go, rollout.go.
const (
	TypePutPolicy      Type = 1
	TypeDeletePolicy   Type = 2
	TypePutEmployee    Type = 3
	TypeDeleteEmployee Type = 4
	TypeRegisterMember Type = 5
	TypeRemoveMember   Type = 6
	TypePruneEvents    Type = 7

	// TypeSetClusterID is ignorable: the ID only guards peer handshakes,
	// which an older node does not make.
	TypeSetClusterID = IgnoreUnknown | 15
)

// ErrInvalidCommand is returned by ResultErr for a command the FSM rejected
// as malformed (it never changes state).
var ErrInvalidCommand = errors.New("invalid command")

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
// are refused until every member reads them. Version 5 adds the policy
// source commands (SourceVersion), refused the same way.
const CommandVersion = 5

// ActorRetention is the actor of event log pruning. The "task:" prefix is
// reserved for the leader's own tasks (an admin token's actor is
// "token:NAME", a client certificate's "cert:SUBJECT"); the features' are
// ActorReload, ActorDrift and ActorRollout.
const ActorRetention = "task:retention"

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
func CheckEnvelope(c *Command) error {
	if a := c.Actor; a != "" {
		if err := CheckActor(a); err != nil {
			return err
		}
	}
	if id := c.RequestID; id != "" && !ValidRequestID(id) {
		return fmt.Errorf("request id %q: want 1 to %d bytes of printable ASCII", id, MaxRequestIDLen)
	}
	return nil
}

// WithAudit returns cmd with its actor and request id set.
func WithAudit(c *Command, actor, requestID string) *Command {
	c.Actor, c.RequestID = actor, requestID
	return c
}

// HasAudit reports whether cmd carries any field of command version 3.
func HasAudit(c *Command) bool {
	return c.Actor != "" || c.RequestID != "" || c.RevertedTo != 0
}

// ForVersion returns c as a cluster whose oldest member reads command
// version v can apply it: unchanged for v >= CommandVersion; below
// RolloutVersion a rollout or a shadow policy is refused with a
// NotUpgradedError (such a node would stop on the first, and drop the
// second's enforcement and enforce it); below 3 without the audit fields
// (actor, request_id, reverted_to), which such a node would drop while
// newer ones store them; below 2 also with a typed policy or employee
// written as the JSON that version 1 reads.
func ForVersion(c *Command, v uint32) (*Command, error) {
	if v >= CommandVersion {
		return c, nil
	}
	if v < SourceVersion && (IsSourceType(c.Type()) || c.Body.GetRolloutStart().GetRollout().GetSource() != "") {
		return nil, &NotUpgradedError{what: "policy sources", need: SourceVersion, oldest: v}
	}
	if v < RolloutVersion {
		switch {
		case IsRolloutType(c.Type()):
			return nil, &NotUpgradedError{what: "rollouts", need: RolloutVersion, oldest: v}
		case IsShadowPut(c):
			return nil, &NotUpgradedError{what: "shadow policies", need: RolloutVersion, oldest: v}
		}
	}
	if v < auditVersion && HasAudit(c) {
		cp := *c
		cp.Actor, cp.RequestID, cp.RevertedTo = "", "", 0
		c = &cp
	}
	if v >= 2 {
		return c, nil
	}
	var body *commandv1.Body
	switch k := c.Body.GetKind().(type) {
	case *commandv1.Body_PutPolicy:
		if k.PutPolicy.GetPolicy() == nil {
			return c, nil
		}
		raw, err := PolicyOf(k.PutPolicy.GetPolicy()).AppendJSON(nil)
		if err != nil {
			return nil, err
		}
		body = &commandv1.Body{Kind: &commandv1.Body_PutPolicy{PutPolicy: &commandv1.PutPolicy{PolicyJson: raw, IfMatch: k.PutPolicy.GetIfMatch()}}}
	case *commandv1.Body_PutEmployee:
		if k.PutEmployee.GetEmployee() == nil {
			return c, nil
		}
		raw, err := json.Marshal(EmployeeOf(k.PutEmployee.GetEmployee()))
		if err != nil {
			return nil, fmt.Errorf("encode employee: %w", err)
		}
		body = &commandv1.Body{Kind: &commandv1.Body_PutEmployee{PutEmployee: &commandv1.PutEmployee{EmployeeJson: raw, IfMatch: k.PutEmployee.GetIfMatch()}}}
	default:
		return c, nil
	}
	cp := *c
	cp.Body = body
	return &cp, nil
}

// NotUpgradedError refuses a command that a member of an older release
// cannot apply; the proposer answers it as a conflict.
type NotUpgradedError struct {
	what   string
	need   uint32
	oldest uint32
}

func (e *NotUpgradedError) Error() string {
	return fmt.Sprintf("cluster not upgraded: %s need every member to read command version %d; the oldest reads %d", e.what, e.need, e.oldest)
}

func precondition(ifMatch *uint64) *commandv1.Precondition {
	if ifMatch == nil {
		return nil
	}
	return &commandv1.Precondition{Revision: *ifMatch}
}

// Result codes carried in commandv1.Result.Code.
const (
	CodeNotFound = "not_found"
	CodeConflict = "conflict"
)

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
	case CodeNotFound:
		return &resultError{msg: r.GetMessage(), err: store.ErrNotFound}
	case CodeConflict:
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

// ConflictResult is the result of a command refused before it was
// proposed, as the FSM reports a conflict: it crosses a forwarded write
// like one.
func ConflictResult(msg string) *commandv1.Result {
	return &commandv1.Result{Code: CodeConflict, Message: msg}
}

// MaxKeyLen bounds every name, id and org a command carries. The admin API's
// rules are far stricter (253 characters); this bound only guarantees that
// no accepted entry can fail in the store (bbolt keys are at most 32 KiB),
// because an entry that fails to apply stops every replica.
const MaxKeyLen = 1024

// CheckKeys rejects empty or oversize keys, as field/value pairs.
func CheckKeys(what string, kv ...string) error {
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

// ClusterIDPattern is what a cluster ID looks like: 32 lowercase hex digits.
var ClusterIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)
