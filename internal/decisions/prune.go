package decisions

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// Prune drops whole segments, never the active one: those whose newest
// record is older than now minus Retention (and those holding no readable
// record), then the oldest while the store is over MaxBytes. Append calls
// it at every rotation; a periodic caller makes age retention timely on a
// quiet node. A scan already reading a dropped segment finishes it.
func (s *Store) Prune(now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.prune(now)
}

// prune is Prune with s.mu held.
func (s *Store) prune(now time.Time) error {
	cutoff := now.Add(-s.cfg.Retention).UnixNano()
	sealed := len(s.segs)
	if s.active != nil {
		sealed--
	}
	var drop []int
	total := s.bytes
	for i := range sealed {
		seg := s.segs[i]
		if seg.records == 0 || seg.maxT < cutoff || total > s.cfg.MaxBytes {
			drop = append(drop, i)
			total -= seg.size
		}
	}
	if len(drop) == 0 {
		return nil
	}
	var errs []error
	kept := s.segs[:0]
	dropped, freed := 0, int64(0)
	for i, seg := range s.segs {
		if len(drop) > 0 && drop[0] == i {
			drop = drop[1:]
			if err := os.Remove(seg.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("prune decision segment: %w", err))
				kept = append(kept, seg)
				continue
			}
			delete(s.reported, seg.id)
			s.bytes -= seg.size
			dropped++
			freed += seg.size
			continue
		}
		kept = append(kept, seg)
	}
	clear(s.segs[len(kept):])
	s.segs = kept
	if dropped > 0 {
		s.logger.Info("decisions: pruned segments", "segments", dropped, "bytes", freed, "kept_bytes", s.bytes)
		if err := syncDir(s.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
