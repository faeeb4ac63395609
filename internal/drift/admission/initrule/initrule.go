// Package initrule parses drift.initialization rules: when a parent of one
// group and kind counts as initialized. A rule is "group/Kind=Signal+Signal"
// and a signal is a condition type that must be True, observedGeneration,
// readyReplicas, or default (the built-in order, alone in its rule); any
// other word is an error, so a typo fails at load time instead of leaving
// parents initializing forever. It has no dependencies, so config validates
// the rules when it loads them and the admission package evaluates them.
// See docs/drift.md.
package initrule

import (
	"fmt"
	"strings"
)

// Words that are signals but not condition types.
const (
	SignalDefault            = "default"
	SignalObservedGeneration = "observedGeneration"
	SignalReadyReplicas      = "readyReplicas"
)

var keywords = []string{SignalDefault, SignalObservedGeneration, SignalReadyReplicas}

// Rule says when a parent of one group and kind is initialized: Default
// (the default order), or all of Conditions True and, if set,
// observedGeneration == generation and readyReplicas == replicas.
type Rule struct {
	Group              string   `json:"group"`
	Kind               string   `json:"kind"`
	Default            bool     `json:"default,omitempty"`
	Conditions         []string `json:"conditions,omitempty"`
	ObservedGeneration bool     `json:"observedGeneration,omitempty"`
	ReadyReplicas      bool     `json:"readyReplicas,omitempty"`
}

// Parse reads one rule in its text form (see the package doc and docs/drift.md).
func Parse(s string) (Rule, error) {
	target, signals, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return Rule{}, fmt.Errorf("initialization rule %q: want group/Kind=Signal+Signal", s)
	}
	group, kind, ok := strings.Cut(target, "/")
	if !ok || kind == "" || strings.Contains(kind, "/") {
		return Rule{}, fmt.Errorf("initialization rule %q: %q is not group/Kind (core group: /Kind)", s, target)
	}
	r := Rule{Group: group, Kind: kind}
	n := 0
	for sig := range strings.SplitSeq(signals, "+") {
		n++
		switch sig {
		case SignalDefault:
			r.Default = true
		case SignalObservedGeneration:
			r.ObservedGeneration = true
		case SignalReadyReplicas:
			r.ReadyReplicas = true
		default:
			if err := checkCondition(sig); err != nil {
				return Rule{}, fmt.Errorf("initialization rule %q: %w", s, err)
			}
			r.Conditions = append(r.Conditions, sig)
		}
	}
	if r.Default && n > 1 {
		return Rule{}, fmt.Errorf("initialization rule %q: %s is the seed's whole detection order and stands alone; write other signals as another rule for %s/%s (rules of one kind are alternatives)",
			s, SignalDefault, group, kind)
	}
	return r, nil
}

// checkCondition accepts a condition type: an optional DNS prefix and a
// name that starts with an upper-case letter, of letters, digits and -_.
// (at most 316 characters, metav1.Condition's limit).
func checkCondition(sig string) error {
	for _, k := range keywords {
		if strings.EqualFold(sig, k) {
			return fmt.Errorf("unknown signal %q: did you mean %s?", sig, k)
		}
	}
	name := sig
	if i := strings.LastIndexByte(sig, '/'); i >= 0 {
		if !dnsPrefix(sig[:i]) {
			return fmt.Errorf("unknown signal %q: %q is not a DNS prefix", sig, sig[:i])
		}
		name = sig[i+1:]
	}
	if name == "" || len(sig) > 316 || name[0] < 'A' || name[0] > 'Z' || !wordChars(name) {
		return fmt.Errorf("unknown signal %q: a condition type starts with an upper-case letter (Ready, Available); the other signals are %s",
			sig, strings.Join(keywords, ", "))
	}
	return nil
}

func dnsPrefix(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}

func wordChars(s string) bool {
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}
