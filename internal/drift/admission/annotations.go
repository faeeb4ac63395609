package admission

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Annotation names under Config.AnnotationPrefix.
const (
	annTrace       = "trace"
	annUpdaters    = "updaters"
	annControllers = "controllers"
	annPhase       = "phase"
	annApprovals   = "approvals"
	annRejections  = "rejections"
	annFreeze      = "freeze"
	annSnooze      = "snooze"
	annMode        = "mode"
	// annTracePrefix starts the trace-<key> annotations, the labels of the
	// object's own hop.
	annTracePrefix = "trace-"
)

// maxHashes bounds the updaters and controllers lists; the oldest hash is
// dropped first.
const maxHashes = 5

// maxTraceHops bounds a trace, so a hostile or looping trace on a parent
// cannot grow its children's annotations without limit. The origin hop is
// kept; the oldest hops after it are dropped.
const maxTraceHops = 16

func (c Config) key(name string) string { return c.prefix() + "/" + name }

func (c Config) prefix() string {
	if c.AnnotationPrefix == "" {
		return "policyd.io"
	}
	return c.AnnotationPrefix
}

// ours reports whether an annotation key is under the prefix.
func (c Config) ours(key string) bool {
	p := c.prefix()
	return len(key) > len(p) && key[len(p)] == '/' && strings.HasPrefix(key, p)
}

// system reports whether key is one of the annotations the webhook computes
// (trace, updaters) or records (controllers, phase); all other keys under
// the prefix (approvals, rejections, freeze, snooze, mode, trace-*) are user
// annotations.
func (c Config) system(key string) bool {
	switch key {
	case c.key(annTrace), c.key(annUpdaters), c.key(annControllers), c.key(annPhase):
		return true
	}
	return false
}

// UserHash is the 5-character identity recorded in updaters and controllers:
// SHA-256 of the username, first 4 bytes as a big-endian uint32, lowercase
// base 36, left-padded with 0, first 5 characters.
func UserHash(username string) string {
	sum := sha256.Sum256([]byte(username))
	s := strconv.FormatUint(uint64(binary.BigEndian.Uint32(sum[:4])), 36)
	if len(s) < 5 {
		s = strings.Repeat("0", 5-len(s)) + s
	}
	return s[:5]
}

// ParseHashes reads an updaters or controllers value: comma-separated
// hashes. Entries that are not 5 base-36 characters are dropped, duplicates
// are kept once, and only the newest maxHashes remain.
func ParseHashes(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		h := strings.TrimSpace(part)
		if !validHash(h) || slices.Contains(out, h) {
			continue
		}
		out = append(out, h)
	}
	if len(out) > maxHashes {
		out = out[len(out)-maxHashes:]
	}
	return out
}

func validHash(h string) bool {
	if len(h) != 5 {
		return false
	}
	for i := range len(h) {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// AddHash returns list with h appended, unless it is already there, keeping
// the newest maxHashes.
func AddHash(list []string, h string) []string {
	if slices.Contains(list, h) {
		return list
	}
	out := append(slices.Clone(list), h)
	if len(out) > maxHashes {
		out = out[len(out)-maxHashes:]
	}
	return out
}

// FormatHashes is the annotation value of a hash list.
func FormatHashes(list []string) string { return strings.Join(list, ",") }

// ParseApprovals reads a <prefix>/approvals value. Entries without a kind
// or a name, or with an unknown mode, are dropped (they could never match);
// an empty mode becomes once.
func ParseApprovals(s string) ([]Approval, error) {
	var raw []Approval
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("parse approvals: %w", err)
	}
	out := raw[:0]
	for _, a := range raw {
		if a.Mode == "" {
			a.Mode = ApprovalOnce
		}
		switch a.Mode {
		case ApprovalOnce, ApprovalGeneration, ApprovalAlways:
		default:
			continue
		}
		if a.Kind == "" || a.Name == "" {
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

// ParseRejections reads a <prefix>/rejections value. Entries without a kind
// or a name are dropped.
func ParseRejections(s string) ([]Rejection, error) {
	var raw []Rejection
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("parse rejections: %w", err)
	}
	out := raw[:0]
	for _, r := range raw {
		if r.Kind == "" || r.Name == "" {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// Freeze is the parsed <prefix>/freeze annotation.
type Freeze struct {
	User    string `json:"user,omitempty"`
	Message string `json:"message,omitempty"`
	At      string `json:"at,omitempty"`
}

// ParseFreeze reads a <prefix>/freeze value. The safe side wins: anything
// but an empty value or "false" freezes, and a value that is neither JSON
// nor "true" still freezes (the message says so).
func ParseFreeze(s string) (f Freeze, frozen bool) {
	switch strings.TrimSpace(s) {
	case "", "false":
		return Freeze{}, false
	case "true":
		return Freeze{Message: "legacy freeze annotation"}, true
	}
	if err := json.Unmarshal([]byte(s), &f); err != nil {
		return Freeze{Message: "unparsable freeze annotation"}, true
	}
	return f, true
}

func (f Freeze) String() string {
	user, msg, at := f.User, f.Message, f.At
	if user == "" {
		user = "unknown user"
	}
	if msg == "" {
		msg = "no reason given"
	}
	if at == "" {
		at = "unknown time"
	}
	return fmt.Sprintf("frozen by %s at %s: %s", user, at, msg)
}

// Snooze is the parsed <prefix>/snooze annotation.
type Snooze struct {
	Expiry  time.Time `json:"expiry"`
	User    string    `json:"user,omitempty"`
	Message string    `json:"message,omitempty"`
}

// ParseSnooze reads a <prefix>/snooze value: JSON or a bare RFC 3339 time.
// Unparsable means not snoozed, so callbacks are not lost to a typo.
func ParseSnooze(s string) (Snooze, bool) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return Snooze{Expiry: t}, true
	}
	var sn Snooze
	if err := json.Unmarshal([]byte(s), &sn); err != nil || sn.Expiry.IsZero() {
		return Snooze{}, false
	}
	return sn, true
}

// Hop is one step of a <prefix>/trace: the origin first, then each object a
// controller changed because of the one before.
type Hop struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Generation int64  `json:"generation,omitempty"`
	User       string `json:"user,omitempty"`
	Timestamp  string `json:"timestamp,omitempty"`
	// Labels are the object's own <prefix>/trace-<key> annotations when
	// the hop was written (see traceLabels); they are not inherited.
	Labels map[string]string `json:"labels,omitempty"`
	// Approval is the approval mode that let a drifting change through.
	Approval string `json:"approval,omitempty"`
	// Drift marks a drifting change let through in log mode.
	Drift bool `json:"drift,omitempty"`
}

// ParseTrace reads a <prefix>/trace value.
func ParseTrace(s string) ([]Hop, error) {
	var hops []Hop
	if err := json.Unmarshal([]byte(s), &hops); err != nil {
		return nil, fmt.Errorf("parse trace: %w", err)
	}
	return hops, nil
}

// rawTrace reads a trace keeping each hop's JSON as it is, so that a
// child's trace copies its parent's hops whole: labels, and fields a newer
// version or another tool wrote. Every hop must be an object that reads as
// a Hop.
func rawTrace(s string) ([]json.RawMessage, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("parse trace: %w", err)
	}
	for i, r := range raw {
		var h Hop
		if len(r) == 0 || r[0] != '{' {
			return nil, fmt.Errorf("parse trace: hop %d is not an object", i)
		}
		if err := json.Unmarshal(r, &h); err != nil {
			return nil, fmt.Errorf("parse trace: hop %d: %w", i, err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, r); err != nil {
			return nil, fmt.Errorf("parse trace: hop %d: %w", i, err)
		}
		raw[i] = buf.Bytes()
	}
	return raw, nil
}

// extendTrace appends hop to the parent's hops, bounded by maxTraceHops.
func extendTrace(parent []json.RawMessage, hop Hop) []json.RawMessage {
	out := append(slices.Clone(parent), marshalHop(hop))
	if len(out) > maxTraceHops {
		out = append(out[:1], out[len(out)-maxTraceHops+1:]...)
	}
	return out
}

func marshalHop(h Hop) json.RawMessage {
	b, err := json.Marshal(h)
	if err != nil { // Hop has only strings, ints, bools and a string map
		panic(fmt.Sprintf("marshal trace hop: %v", err))
	}
	return b
}

func formatTrace(hops []json.RawMessage) string {
	b, err := json.Marshal(hops)
	if err != nil { // hops are compact JSON objects already
		panic(fmt.Sprintf("marshal trace: %v", err))
	}
	return string(b)
}

// maxTraceLabel bounds one trace label's value; a longer one is left out
// of the hop, which would otherwise copy it into every descendant's trace.
const maxTraceLabel = 1 << 10

// traceLabels reads an object's <prefix>/trace-<key> annotations as hop
// labels. A key that is not a valid label key (a qualified name such as
// ticket or example.com/ticket) and a value over maxTraceLabel bytes are
// left out; ignored says which and why.
func (c Config) traceLabels(ann map[string]string) (labels map[string]string, ignored []string) {
	pre := c.key(annTracePrefix)
	for k, v := range ann {
		key, ok := strings.CutPrefix(k, pre)
		if !ok {
			continue
		}
		switch errs := validation.IsQualifiedName(key); {
		case len(errs) > 0:
			ignored = append(ignored, fmt.Sprintf("ignoring %s: %q is not a valid label key: %s", k, key, strings.Join(errs, "; ")))
		case len(v) > maxTraceLabel:
			ignored = append(ignored, fmt.Sprintf("ignoring %s: its value is %d bytes, more than %d", k, len(v), maxTraceLabel))
		default:
			if labels == nil {
				labels = map[string]string{}
			}
			labels[key] = v
		}
	}
	slices.Sort(ignored)
	return labels, ignored
}

// groupOf is the group of an apiVersion ("apps/v1" → "apps", "v1" → "").
func groupOf(apiVersion string) string {
	if i := strings.LastIndexByte(apiVersion, '/'); i >= 0 {
		return apiVersion[:i]
	}
	return ""
}

// Wildcard matches any apiVersion, kind or name in an approval or
// rejection. Only the whole value "*" is a wildcard: "apps/*" or "web-*"
// are names like any other and match only themselves.
const Wildcard = "*"

// matchesChild reports whether an approval or rejection entry names the
// child. The version is ignored (an object is the same at every served
// version), and an empty apiVersion matches any group, as does "*" in any
// of the three fields.
func matchesChild(apiVersion, kind, name string, child ObjectRef) bool {
	if apiVersion != "" && apiVersion != Wildcard && groupOf(apiVersion) != groupOf(child.APIVersion) {
		return false
	}
	return (kind == Wildcard || kind == child.Kind) && (name == Wildcard || name == child.Name)
}

// validAt reports whether an approval counts at the parent's generation.
func (a Approval) validAt(gen int64) bool {
	return a.Mode == ApprovalAlways || a.Generation == gen
}

// validAt reports whether a rejection counts at the parent's generation.
func (r Rejection) validAt(gen int64) bool {
	return r.Generation == 0 || r.Generation == gen
}

// pruneApprovals drops once and generation approvals that are not for gen.
// It works on the raw JSON so that fields it does not know survive.
func pruneApprovals(value string, gen int64) (string, bool) {
	return filterApprovals(value, func(a Approval) bool { return a.validAt(gen) })
}

// removeApproval drops the first entry equal to a.
func removeApproval(value string, a Approval) (string, bool) {
	done := false
	return filterApprovals(value, func(b Approval) bool {
		if !done && b == a {
			done = true
			return false
		}
		return true
	})
}

// filterApprovals keeps the entries of an approvals value for which keep
// is true; entries that do not parse as an approval are kept untouched.
func filterApprovals(value string, keep func(Approval) bool) (string, bool) {
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return value, false
	}
	out := raw[:0]
	changed := false
	for _, r := range raw {
		var a Approval
		if err := json.Unmarshal(r, &a); err == nil {
			if a.Mode == "" {
				a.Mode = ApprovalOnce
			}
			if !keep(a) {
				changed = true
				continue
			}
		}
		out = append(out, r)
	}
	if !changed {
		return value, false
	}
	b, err := json.Marshal(out)
	if err != nil { // re-marshalling RawMessages that were just parsed
		return value, false
	}
	return string(b), true
}
