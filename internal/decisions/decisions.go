// Package decisions is a node's store of the authorization decisions its
// sidecars ship: opaque timestamped records in append-only segment files
// under one directory, not replicated. It owns the file format (segment.go),
// crash recovery at Open, retention by age and size (Prune), and reading by
// time window or by cursor. Records come back in arrival order, which is
// only roughly time order; a query that merges nodes sorts by time above
// this package. It does not decode records, serve HTTP or read config.
package decisions

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Caps on what one Append takes, so that one sidecar cannot make a node
// buffer without bound.
const (
	MaxRecordBytes  = 64 << 10 // data of one record
	MaxBatchRecords = 10_000   // records in one batch
	MaxBatchBytes   = 8 << 20  // one batch, framed
)

// Defaults of Config's zero fields.
const (
	DefaultRetention     = 24 * time.Hour
	DefaultMaxBytes      = 1 << 30
	DefaultSegmentBytes  = 64 << 20
	DefaultFlushInterval = time.Second
)

// Errors callers tell apart.
var (
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("decision store closed")
	// ErrTooLarge is a record or batch over its cap; nothing was written.
	ErrTooLarge = errors.New("too large")
	// ErrBadCursor is a cursor this store did not hand out.
	ErrBadCursor = errors.New("bad decision cursor")
)

// Config sizes the store; zero fields take the defaults above.
type Config struct {
	// Retention is how long a segment is kept after its newest record.
	Retention time.Duration
	// MaxBytes caps the directory; the oldest segments go first.
	MaxBytes int64
	// SegmentBytes is where a segment is sealed and the next begun.
	SegmentBytes int64
	// FlushInterval is how often written records are fsynced; negative:
	// only at rotation, Sync and Close.
	FlushInterval time.Duration
}

// withDefaults fills c's zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.SegmentBytes == 0 {
		c.SegmentBytes = DefaultSegmentBytes
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	switch {
	case c.Retention < 0:
		return c, fmt.Errorf("decisions retention %v is negative", c.Retention)
	case c.SegmentBytes < 0 || c.MaxBytes < 0:
		return c, fmt.Errorf("decisions max_bytes %d and segment size %d must be positive", c.MaxBytes, c.SegmentBytes)
	case c.SegmentBytes > c.MaxBytes:
		return c, fmt.Errorf("decisions segment size %d is over max_bytes %d", c.SegmentBytes, c.MaxBytes)
	}
	return c, nil
}

// Record is one decision as the store sees it: when, and opaque bytes.
// Records a scan hands out share a buffer: Data is valid until the scan's
// callback returns; copy it (bytes.Clone) to keep it.
type Record struct {
	Time time.Time
	Data []byte
}

// segment is the index entry of one file, enough to skip it without
// reading it.
type segment struct {
	id      uint64
	path    string
	size    int64 // bytes in the file, counted against MaxBytes
	end     int64 // readable extent: size, or where Open found damage
	records int64
	minT    int64 // Unix nanoseconds, when records > 0
	maxT    int64
}

// Store is one node's decision store. Appends are serialized; scans run
// beside them and read what was written when they began.
type Store struct {
	dir    string
	cfg    Config
	logger *slog.Logger

	mu       sync.Mutex
	closed   bool
	segs     []segment // by id; the last is active when active != nil
	active   *os.File  // nil until the first Append, or after damage
	nextID   uint64
	bytes    int64
	unsynced bool
	buf      []byte           // Append's encoding buffer
	reported map[uint64]bool  // segments whose damage a scan has logged
	syncs    int              // fsyncs done, for tests
	now      func() time.Time // the clock of Append's Prune; tests set it

	stop chan struct{} // closed by Close to end the flusher
	done chan struct{} // closed when the flusher has ended
}

// Open opens the store in dir, creating dir if need be, reads every
// segment through to index it and repairs a torn tail of the newest. One
// Store per directory: the caller owns dir (policyd holds data_dir through
// state.db's lock).
func Open(dir string, cfg Config, logger *slog.Logger) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create decision store directory: %w", err)
	}
	s := &Store{dir: dir, cfg: cfg, logger: logger, nextID: 1, reported: make(map[uint64]bool), now: time.Now}
	if err := s.load(); err != nil {
		if s.active != nil {
			s.active.Close()
		}
		return nil, err
	}
	if cfg.FlushInterval > 0 {
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.flusher(cfg.FlushInterval)
	}
	return s, nil
}

// load lists dir and indexes its segments, oldest first.
func (s *Store) load() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("list decision store: %w", err)
	}
	type file struct {
		id   uint64
		name string
	}
	var files []file
	for _, e := range entries {
		id, ok := parseSegName(e.Name())
		if !ok || !e.Type().IsRegular() {
			s.logger.Warn("decisions: ignoring a file that is not a segment", "file", filepath.Join(s.dir, e.Name()))
			continue
		}
		files = append(files, file{id, e.Name()})
	}
	slices.SortFunc(files, func(a, b file) int { return cmp.Compare(a.id, b.id) })
	for i, f := range files {
		if i > 0 && f.id == files[i-1].id {
			s.logger.Warn("decisions: ignoring a second segment with the same id", "file", filepath.Join(s.dir, f.name))
			continue
		}
		s.nextID = f.id + 1
		if err := s.loadSegment(f.id, filepath.Join(s.dir, f.name), i == len(files)-1); err != nil {
			return err
		}
	}
	return nil
}

// loadSegment reads one segment through, checking every record, and adds
// it to the index. The newest (last) is cut back to its last good record
// and opened for appending; an older one is read up to its first damage.
func (s *Store) loadSegment(id uint64, path string, last bool) error {
	flag := os.O_RDONLY
	if last {
		flag = os.O_RDWR | os.O_APPEND
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return fmt.Errorf("open decision segment: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("decision segment %s: %w", path, err)
	}
	seg := segment{id: id, path: path, size: info.Size(), end: info.Size()}
	hdr := make([]byte, headerSize)
	n, err := f.ReadAt(hdr, 0)
	if err != nil && n < headerSize && int64(n) < seg.size {
		return fmt.Errorf("read decision segment %s: %w", path, err)
	}
	if herr := checkHeader(hdr[:n], id); herr != nil {
		if last && seg.size < headerSize {
			// The crash came as the file was begun: begin it again.
			s.logger.Warn("decisions: rewrote a torn segment header", "file", path, "offset", 0, "dropped_bytes", seg.size)
			if err := rewrite(f, appendHeader(nil, id)); err != nil {
				return fmt.Errorf("repair decision segment %s: %w", path, err)
			}
			seg.size, seg.end = headerSize, headerSize
			s.add(seg)
			s.active, keep = f, true
			return nil
		}
		// Not ours to read, but ours by name: it counts against MaxBytes
		// and, holding no record, is the first Prune drops.
		s.logger.Warn("decisions: damaged segment header; skipping the file", "file", path, "offset", 0, "err", herr)
		seg.end = 0
		s.add(seg)
		return nil
	}
	rd := newReader(f, headerSize, seg.size)
	for {
		t, _, err := rd.next()
		if err == nil {
			seg.note(t)
			continue
		}
		if errors.Is(err, io.EOF) {
			break
		}
		var d *damage
		if !errors.As(err, &d) {
			return fmt.Errorf("decision segment %s: %w", path, err)
		}
		if !last {
			s.logger.Warn("decisions: damaged segment; reading it only up to the damage", "file", path,
				"offset", d.off, "skipped_bytes", seg.size-d.off, "reason", d.reason)
			seg.end = d.off
			s.reported[id] = true
			break
		}
		s.logger.Warn("decisions: truncated a torn tail", "file", path, "offset", d.off,
			"dropped_bytes", seg.size-d.off, "reason", d.reason)
		if err := f.Truncate(d.off); err != nil {
			return fmt.Errorf("truncate decision segment %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync decision segment %s: %w", path, err)
		}
		seg.size, seg.end = d.off, d.off
		break
	}
	s.add(seg)
	if last {
		s.active, keep = f, true
	}
	return nil
}

// add appends seg to the index.
func (s *Store) add(seg segment) {
	s.segs = append(s.segs, seg)
	s.bytes += seg.size
}

// note counts a record at t (Unix nanoseconds) into seg's index entry.
func (seg *segment) note(t int64) {
	if seg.records == 0 || t < seg.minT {
		seg.minT = t
	}
	if seg.records == 0 || t > seg.maxT {
		seg.maxT = t
	}
	seg.records++
}

// rewrite makes f hold exactly b, durably.
func rewrite(f *os.File, b []byte) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		return err
	}
	return f.Sync()
}

// Stats is what the store holds, for metrics (policyd_decision_store_bytes
// is Bytes).
type Stats struct {
	Segments int
	Records  int64
	Bytes    int64
}

// Stats counts the store's segments, records and bytes on disk.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Segments: len(s.segs), Bytes: s.bytes}
	for _, seg := range s.segs {
		st.Records += seg.records
	}
	return st
}

// Bytes is the size of every segment file together, framing included.
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}
