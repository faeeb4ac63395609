package decisions

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Durability: the records are not replicated and losing the last second of
// them in a machine crash is acceptable, so an Append only writes (one
// write call per batch, into the page cache: a process crash loses
// nothing). Segments are fsynced when sealed at rotation, at Close, at Sync
// and every FlushInterval; a new file's directory entry is fsynced when it
// is made. A crash can keep a prefix of the last batch: records are framed
// one by one, and Open cuts a torn tail back to the last whole record.

// Append writes batch in one write to the active segment, beginning a new
// segment first when the batch would take the active one past
// SegmentBytes (a batch is never split, so a batch larger than that has a
// segment to itself). Nothing is written when any record is invalid: over
// MaxRecordBytes, a zero time or one before 1970, or a batch over its caps.
func (s *Store) Append(batch []Record) error {
	if len(batch) == 0 {
		return nil
	}
	if len(batch) > MaxBatchRecords {
		return fmt.Errorf("append decisions: batch of %d records is over %d: %w", len(batch), MaxBatchRecords, ErrTooLarge)
	}
	size := 0
	for i, r := range batch {
		if len(r.Data) > MaxRecordBytes {
			return fmt.Errorf("append decisions: record %d has %d bytes, over %d: %w", i, len(r.Data), MaxRecordBytes, ErrTooLarge)
		}
		if err := checkTime(r.Time); err != nil {
			return fmt.Errorf("append decisions: record %d: %w", i, err)
		}
		size += frameSize + len(r.Data)
	}
	if size > MaxBatchBytes {
		return fmt.Errorf("append decisions: batch of %d bytes is over %d: %w", size, MaxBatchBytes, ErrTooLarge)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	rotated := false
	if s.active != nil {
		if cur := s.segs[len(s.segs)-1]; cur.records > 0 && cur.size+int64(size) > s.cfg.SegmentBytes {
			if err := s.seal(); err != nil {
				return err
			}
			rotated = true
		}
	}
	b := s.buf[:0]
	if s.active == nil {
		b = appendHeader(b, s.nextID)
	}
	for _, r := range batch {
		b = appendFrame(b, r)
	}
	s.keepBuf(b)
	if s.active == nil {
		if err := s.begin(batch[0].Time.UnixNano(), b); err != nil {
			return err
		}
	} else if err := s.write(b); err != nil {
		return err
	}
	seg := &s.segs[len(s.segs)-1]
	for _, r := range batch {
		seg.note(r.Time.UnixNano())
	}
	s.unsynced = true
	if rotated {
		if err := s.prune(s.now()); err != nil {
			s.logger.Warn("decisions: prune after rotation failed", "err", err)
		}
	}
	return nil
}

// checkTime refuses times a segment cannot hold: Unix nanoseconds are
// stored unsigned, and the zero time is a caller's mistake.
func checkTime(t time.Time) error {
	if t.IsZero() || t.Before(time.Unix(0, 0)) || t.UnixNano() < 0 {
		return fmt.Errorf("time %v is before 1970 or after 2262", t)
	}
	if !time.Unix(0, t.UnixNano()).Equal(t) {
		return fmt.Errorf("time %v is after 2262", t)
	}
	return nil
}

// keepBuf keeps Append's buffer for the next batch unless one huge batch
// grew it.
func (s *Store) keepBuf(b []byte) {
	if cap(b) <= 1<<20 {
		s.buf = b[:0]
	} else {
		s.buf = nil
	}
}

// write appends b to the active segment; a failed write is cut back off,
// so that the next batch does not follow a partial one.
func (s *Store) write(b []byte) error {
	seg := &s.segs[len(s.segs)-1]
	if _, err := s.active.Write(b); err != nil {
		if terr := s.active.Truncate(seg.size); terr != nil {
			// The file's end is unknown: stop appending to it.
			s.active.Close()
			s.active = nil
			return fmt.Errorf("append decisions to %s: %w (and cutting it back: %w)", seg.path, err, terr)
		}
		return fmt.Errorf("append decisions to %s: %w", seg.path, err)
	}
	seg.size += int64(len(b))
	seg.end = seg.size
	s.bytes += int64(len(b))
	return nil
}

// begin creates the next segment holding b (its header and first batch)
// and makes it active.
func (s *Store) begin(first int64, b []byte) error {
	id := s.nextID
	path := filepath.Join(s.dir, segName(id, first))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return fmt.Errorf("create decision segment: %w", err)
	}
	s.nextID++ // never reused, even if this one fails
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("append decisions to %s: %w", path, err)
	}
	if err := syncDir(s.dir); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	s.active = f
	s.add(segment{id: id, path: path, size: int64(len(b)), end: int64(len(b))})
	return nil
}

// seal fsyncs and closes the active segment.
func (s *Store) seal() error {
	f := s.active
	s.active = nil
	err := f.Sync()
	s.syncs++
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("seal decision segment %s: %w", s.segs[len(s.segs)-1].path, err)
	}
	return nil
}

// syncDir fsyncs dir, so that files made or removed in it stay so.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync decision store directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync decision store directory: %w", err)
	}
	return nil
}

// Sync fsyncs what Append has written. The fsync runs outside the lock, so
// appends go on meanwhile.
func (s *Store) Sync() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	f, dirty := s.active, s.unsynced
	s.unsynced = false
	if f != nil && dirty {
		s.syncs++
	}
	s.mu.Unlock()
	if f == nil || !dirty {
		return nil
	}
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) { // closed: seal synced it
		s.mu.Lock()
		s.unsynced = true
		s.mu.Unlock()
		return fmt.Errorf("sync decisions: %w", err)
	}
	return nil
}

// flusher calls Sync every interval until Close.
func (s *Store) flusher(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if err := s.Sync(); err != nil && !errors.Is(err, ErrClosed) {
				s.logger.Warn("decisions: periodic sync failed", "err", err)
			}
		}
	}
}

// Close stops the flusher and fsyncs and closes the active segment. Scans
// already running finish; later calls return ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.stop != nil {
		close(s.stop)
		<-s.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active == nil {
		return nil
	}
	return s.seal()
}
