package decisions

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"time"
)

// Cursor is a position in the store: a segment and an offset in it, the
// start of a record. The zero Cursor is the oldest record kept. A cursor
// into a segment that Prune has dropped resumes at the oldest kept one, so
// a slow pager skips what retention took rather than failing.
type Cursor struct {
	seg uint64
	off int64
}

// Position orders the records of one store: a record written later has a
// greater position, so a query can break ties between equal times.
func (c Cursor) Position() uint64 { return c.seg<<40 | uint64(c.off) }

// cursorVersion opens an encoded cursor, so the encoding can change.
const cursorVersion = 1

// String encodes c as an opaque URL-safe token.
func (c Cursor) String() string {
	b := make([]byte, 0, 17)
	b = append(b, cursorVersion)
	b = binary.BigEndian.AppendUint64(b, c.seg)
	b = binary.BigEndian.AppendUint64(b, uint64(c.off))
	return base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor decodes what Cursor.String returned; the empty string is the
// zero Cursor.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 17 || b[0] != cursorVersion {
		return Cursor{}, fmt.Errorf("%w: %q", ErrBadCursor, s)
	}
	c := Cursor{seg: binary.BigEndian.Uint64(b[1:]), off: int64(binary.BigEndian.Uint64(b[9:]))}
	if c.off < 0 || (c.seg == 0) != (c.off == 0) || (c.seg != 0 && c.off < headerSize) {
		return Cursor{}, fmt.Errorf("%w: %q", ErrBadCursor, s)
	}
	return c, nil
}

// Scan calls fn with every record whose time is in [since, until), in
// arrival order, until fn returns false; a zero since or until is
// unbounded. Segments wholly outside the window are not read. It reads
// what was written when it began. A record damaged since Open ends its
// segment's part of the scan, with one warning per segment, and the scan
// goes on with the next segment.
func (s *Store) Scan(since, until time.Time, fn func(Record) bool) error {
	_, err := s.scan(Cursor{}, since, until, func(r Record, _ Cursor) bool { return fn(r) })
	return err
}

// ScanFrom is Scan from c with no lower time bound, handing fn each record
// with the cursor just after it; it returns the cursor after the last
// record read, where the next page begins (the same cursor again when
// nothing is new). A cursor past the end of a segment that a crash cut
// short may land inside a record written later, and then ScanFrom fails
// with ErrBadCursor.
func (s *Store) ScanFrom(c Cursor, until time.Time, fn func(Record, Cursor) bool) (Cursor, error) {
	return s.scan(c, time.Time{}, until, fn)
}

// Seek is the cursor of the first segment that may hold records at or after
// since: where paging through [since, …) begins. Pages can still hold
// earlier records, which the caller filters out.
func (s *Store) Seek(since time.Time) Cursor {
	s.mu.Lock()
	defer s.mu.Unlock()
	lo := since.UnixNano()
	for _, seg := range s.segs {
		if seg.records > 0 && seg.maxT >= lo {
			return Cursor{seg: seg.id, off: headerSize}
		}
	}
	if n := len(s.segs); n > 0 {
		return Cursor{seg: s.segs[n-1].id, off: s.segs[n-1].end}
	}
	return Cursor{}
}

// scan is Scan and ScanFrom: from c, records in [since, until).
func (s *Store) scan(c Cursor, since, until time.Time, fn func(Record, Cursor) bool) (Cursor, error) {
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if !since.IsZero() {
		lo = since.UnixNano()
	}
	if !until.IsZero() {
		hi = until.UnixNano()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return c, ErrClosed
	}
	segs := make([]segment, 0, len(s.segs))
	for _, seg := range s.segs {
		if seg.id >= c.seg {
			segs = append(segs, seg)
		}
	}
	s.mu.Unlock()

	for _, seg := range segs {
		start := int64(headerSize)
		if seg.id == c.seg {
			start = c.off
		}
		if start >= seg.end || seg.records == 0 || seg.maxT < lo || seg.minT >= hi {
			if start <= seg.end {
				c = Cursor{seg: seg.id, off: max(seg.end, headerSize)}
			}
			continue
		}
		next, more, err := s.scanSegment(seg, start, lo, hi, fn)
		if errors.Is(err, fs.ErrNotExist) {
			continue // pruned since the snapshot
		}
		if err != nil {
			return c, err
		}
		c = next
		if !more {
			return c, nil
		}
	}
	return c, nil
}

// scanSegment reads seg from start up to its end as snapshotted; more is
// false when fn stopped the scan.
func (s *Store) scanSegment(seg segment, start, lo, hi int64, fn func(Record, Cursor) bool) (next Cursor, more bool, err error) {
	f, err := os.Open(seg.path)
	if err != nil {
		return Cursor{}, false, fmt.Errorf("scan decisions: %w", err)
	}
	defer f.Close()
	rd := newReader(f, start, seg.end)
	for {
		t, data, err := rd.next()
		if err != nil {
			return s.scanEnd(seg, start, rd.off, err)
		}
		if t < lo || t >= hi {
			continue
		}
		if !fn(Record{Time: time.Unix(0, t), Data: data}, Cursor{seg: seg.id, off: rd.off}) {
			return Cursor{seg: seg.id, off: rd.off}, false, nil
		}
	}
}

// scanEnd is where reading seg from start ended with err at off: its end,
// damage (logged; the scan goes on with the next segment), a cursor that
// was not at a record, or an I/O error.
func (s *Store) scanEnd(seg segment, start, off int64, err error) (Cursor, bool, error) {
	if errors.Is(err, io.EOF) {
		return Cursor{seg: seg.id, off: off}, true, nil
	}
	var d *damage
	if !errors.As(err, &d) {
		return Cursor{}, false, fmt.Errorf("scan decisions in %s: %w", seg.path, err)
	}
	if d.off == start && start != headerSize {
		return Cursor{}, false, fmt.Errorf("%w: no record at offset %d of segment %d (%s)", ErrBadCursor, start, seg.id, d.reason)
	}
	s.reportDamage(seg, d)
	return Cursor{seg: seg.id, off: seg.end}, true, nil
}

// reportDamage logs, once per segment, damage a scan found.
func (s *Store) reportDamage(seg segment, d *damage) {
	s.mu.Lock()
	first := !s.reported[seg.id]
	s.reported[seg.id] = true
	s.mu.Unlock()
	if first {
		s.logger.Warn("decisions: damaged segment; a scan skips the rest of it", "file", seg.path,
			"offset", d.off, "skipped_bytes", seg.end-d.off, "reason", d.reason)
	}
}
