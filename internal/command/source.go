package command

import (
	"fmt"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
)

// Policy source types (docs/sources.md), command version 5. A sync is not
// ignorable: a node that skipped it would serve other sets. A sync request
// only wakes the leader's reconciler.
const (
	TypeSyncSource        Type = 18
	TypeRequestSourceSync      = IgnoreUnknown | 19
)

// SourceVersion is the command version that introduced policy sources:
// their commands are proposed only once every member reads it.
const SourceVersion = 5

// ActorSource is the actor of a sync of source ("source:kubernetes"),
// with the revision it read when there is one ("source:git:NAME@COMMIT").
func ActorSource(source, revision string) string {
	if revision == "" || source == "kubernetes" {
		return "source:" + source
	}
	return "source:" + source + "@" + revision
}

// IsSourceType reports whether t is a source command (SourceVersion).
func IsSourceType(t Type) bool { return t == TypeSyncSource || t == TypeRequestSourceSync }

// SyncSource builds one part of a source's sync: the policies it puts (their
// specs canonical, see PolicyMessage) and the names it deletes.
func SyncSource(s *commandv1.SyncSource) (*Command, error) {
	if err := CheckSync(s); err != nil {
		return nil, err
	}
	return New(s)
}

// RequestSourceSync builds the request that the leader sync source now.
func RequestSourceSync(source string, allowPrune bool) (*Command, error) {
	if err := CheckSourceName(source); err != nil {
		return nil, err
	}
	return New(&commandv1.RequestSourceSync{Source: source, AllowPrune: allowPrune})
}

// CheckSourceName refuses a source name that is not "kubernetes" or
// "git:NAME" with a valid NAME.
func CheckSourceName(source string) error {
	if source == "kubernetes" {
		return nil
	}
	if len(source) > 4 && source[:4] == "git:" {
		if err := policy.ValidPolicyName(source[4:]); err != nil {
			return fmt.Errorf("source %q: %w", source, err)
		}
		return nil
	}
	return fmt.Errorf("source %q: want kubernetes or git:NAME", source)
}

// CheckSync checks what a sync carries: a valid source, keys within bounds,
// each policy named once across puts and deletes, and adopt naming only
// puts. A node applies a sync whole, so nothing malformed may reach it.
func CheckSync(s *commandv1.SyncSource) error {
	if err := CheckSourceName(s.GetSource()); err != nil {
		return err
	}
	if s.GetParts() == 0 || s.GetPart() >= s.GetParts() {
		return fmt.Errorf("sync %s: part %d of %d", s.GetSource(), s.GetPart(), s.GetParts())
	}
	if len(s.GetRevision()) > MaxKeyLen {
		return fmt.Errorf("sync %s: revision is %d bytes, more than %d", s.GetSource(), len(s.GetRevision()), MaxKeyLen)
	}
	seen := make(map[string]bool, len(s.GetPuts())+len(s.GetDeletes()))
	once := func(name string) error {
		if seen[name] {
			return fmt.Errorf("sync %s: policy %q named twice", s.GetSource(), name)
		}
		seen[name] = true
		return nil
	}
	for _, p := range s.GetPuts() {
		if err := CheckKeys("sync "+s.GetSource(), "name", p.GetName(), "org", p.GetScope().GetOrg()); err != nil {
			return err
		}
		if err := once(p.GetName()); err != nil {
			return err
		}
	}
	for _, name := range s.GetDeletes() {
		if err := CheckKeys("sync "+s.GetSource(), "name", name); err != nil {
			return err
		}
		if err := once(name); err != nil {
			return err
		}
	}
	puts := make(map[string]bool, len(s.GetPuts()))
	for _, p := range s.GetPuts() {
		puts[p.GetName()] = true
	}
	for _, name := range s.GetAdopt() {
		if !puts[name] {
			return fmt.Errorf("sync %s: adopts %q, which it does not put", s.GetSource(), name)
		}
	}
	return nil
}
