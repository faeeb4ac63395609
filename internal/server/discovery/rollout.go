package discovery

import "time"

// recohort moves every stream that declared rollouts and that check
// selects (or that is served a candidate now) to the group of the set it
// is to be served, and offers it that set's snapshot unless it was sent
// that version already (a stage change that only adds members leaves a
// member's content as it was): a cohort member of a rollout that is
// rolled back gets the stable set on the same path as any push.
func (s *Service) recohort(at time.Time, check func(*stream) bool) {
	type cand struct {
		st  *stream
		key groupKey
	}
	s.mu.Lock()
	var cands []cand
	for st := range s.streams {
		if st.caps.Rollouts && (st.key.tags != "" || check(st)) {
			cands = append(cands, cand{st, st.key})
		}
	}
	s.mu.Unlock()
	for _, c := range cands {
		set := s.setFor(c.st, c.key.id)
		if keyOf(c.key.id, set, c.st.caps) != c.key {
			s.move(c.st, at)
		}
	}
}
