package policyset

import (
	"slices"

	"github.com/policyd/policyd/internal/store"
)

// WithoutShadow is s without its shadow policies, versioned by its own
// content: what a client that did not declare the shadow capability is
// served. It is s itself when s holds no shadow policy, and the same *Set
// on every call, so snapshots and messages encoded per set are shared.
func (s *Set) WithoutShadow() *Set {
	if e := s.enforced.Load(); e != nil {
		return e
	}
	if !slices.ContainsFunc(s.Policies, func(rp store.RawPolicy) bool { return rp.Policy.Shadow() }) {
		s.enforced.CompareAndSwap(nil, s)
		return s.enforced.Load()
	}
	e := &Set{Identity: s.Identity, Index: s.Index, Rollouts: s.Rollouts}
	h := store.NewSetHash()
	for _, rp := range s.Policies {
		if rp.Policy.Shadow() {
			continue
		}
		h.Add(rp.Policy.Name, rp.Stored)
		e.Policies = append(e.Policies, rp)
	}
	e.Version = h.Sum()
	e.enforced.Store(e)
	s.enforced.CompareAndSwap(nil, e)
	return s.enforced.Load()
}

// HasShadow reports whether s holds a shadow policy.
func (s *Set) HasShadow() bool { return s.WithoutShadow() != s }
