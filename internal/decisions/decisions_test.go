package decisions

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/policyd/policyd/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logs captures a store's log lines.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// warnings are the captured lines at level WARN.
func (l *logs) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, "level=WARN") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

func (l *logs) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// base is the time of record 0; record i is i ms later.
var base = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// rec is record i: its time and a recognizable body of n bytes (n ≥ 12).
func rec(i, n int) Record {
	d := fmt.Appendf(nil, "rec-%08d", i)
	for len(d) < n {
		d = append(d, byte('a'+i%26))
	}
	return Record{Time: base.Add(time.Duration(i) * time.Millisecond), Data: d}
}

// recs are records [from, to) of n bytes each.
func recs(from, to, n int) []Record {
	var out []Record
	for i := from; i < to; i++ {
		out = append(out, rec(i, n))
	}
	return out
}

// open opens a store that the test closes.
func open(t testing.TB, dir string, cfg Config, l *logs) *Store {
	t.Helper()
	if l == nil {
		l = &logs{}
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = -1
	}
	s, err := Open(dir, cfg, l.logger())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	// Records are stamped from base: a wall clock would age them past
	// Retention and rotation would prune them.
	s.now = func() time.Time { return base }
	t.Cleanup(func() { s.Close() })
	return s
}

// all scans everything, copying each record.
func all(t testing.TB, s *Store) []Record {
	t.Helper()
	var out []Record
	if err := s.Scan(time.Time{}, time.Time{}, func(r Record) bool {
		out = append(out, Record{Time: r.Time, Data: bytes.Clone(r.Data)})
		return true
	}); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

// appendAll appends recs in batches of n.
func appendAll(t testing.TB, s *Store, rs []Record, n int) {
	t.Helper()
	for b := range slices.Chunk(rs, n) {
		if err := s.Append(b); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
}

// segFiles lists dir's segment files, sorted.
func segFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+segExt))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

// diff is cmp.Diff, with an empty scan equal to a nil want.
func diff(want, got []Record) string {
	if len(want) == 0 && len(got) == 0 {
		return ""
	}
	return cmp.Diff(want, got)
}

func TestRoundTrip(t *testing.T) {
	s := open(t, t.TempDir(), Config{}, nil)
	want := recs(0, 250, 100)
	appendAll(t, s, want, 100)
	if d := diff(want, all(t, s)); d != "" {
		t.Fatalf("scan (-want +got):\n%s", d)
	}
	st := s.Stats()
	if st.Records != 250 || st.Segments != 1 || st.Bytes != headerSize+250*(frameSize+100) || s.Bytes() != st.Bytes {
		t.Errorf("Stats = %+v, Bytes = %d", st, s.Bytes())
	}

	for _, tc := range []struct {
		name         string
		since, until time.Time
		want         []Record
	}{
		{"all", time.Time{}, time.Time{}, want},
		{"since", want[100].Time, time.Time{}, want[100:]},
		{"until excludes", time.Time{}, want[10].Time, want[:10]},
		{"window", want[5].Time, want[7].Time, want[5:7]},
		{"before all", time.Time{}, base, nil},
		{"after all", base.Add(time.Hour), time.Time{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []Record
			if err := s.Scan(tc.since, tc.until, func(r Record) bool {
				got = append(got, Record{Time: r.Time, Data: bytes.Clone(r.Data)})
				return true
			}); err != nil {
				t.Fatal(err)
			}
			if d := diff(tc.want, got); d != "" {
				t.Errorf("scan (-want +got):\n%s", d)
			}
		})
	}

	t.Run("stops when fn says", func(t *testing.T) {
		n := 0
		if err := s.Scan(time.Time{}, time.Time{}, func(Record) bool { n++; return n < 3 }); err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Errorf("fn called %d times, want 3", n)
		}
	})
}

func TestAppendRefuses(t *testing.T) {
	s := open(t, t.TempDir(), Config{}, nil)
	big := make([]Record, MaxBatchRecords+1)
	for i := range big {
		big[i] = rec(i, 12)
	}
	for _, tc := range []struct {
		name  string
		batch []Record
		is    error
	}{
		{"record over cap", []Record{rec(0, 12), {Time: base, Data: make([]byte, MaxRecordBytes+1)}}, ErrTooLarge},
		{"too many records", big, ErrTooLarge},
		{"batch over bytes", slices.Repeat([]Record{{Time: base, Data: make([]byte, MaxRecordBytes)}}, MaxBatchBytes/MaxRecordBytes), ErrTooLarge},
		{"zero time", []Record{{Data: []byte("x")}}, nil},
		{"before 1970", []Record{{Time: time.Unix(-1, 0), Data: []byte("x")}}, nil},
		{"after 2262", []Record{{Time: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), Data: []byte("x")}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Append(tc.batch)
			if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("Append = %v, want an error (%v)", err, tc.is)
			}
		})
	}
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after refused appends Stats = %+v, want nothing", got)
	}
	if err := s.Append(nil); err != nil {
		t.Errorf("Append(nil) = %v", err)
	}
	if err := s.Append([]Record{{Time: base, Data: make([]byte, MaxRecordBytes)}, {Time: base}}); err != nil {
		t.Errorf("Append of a record at the cap and an empty one = %v", err)
	}
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	const segBytes = 1000
	s := open(t, dir, Config{SegmentBytes: segBytes, MaxBytes: 1 << 20}, nil)
	want := recs(0, 100, 84) // 100-byte frames
	appendAll(t, s, want, 3)
	appendAll(t, s, recs(100, 120, 84), 20) // a batch bigger than a segment
	want = append(want, recs(100, 120, 84)...)

	files := segFiles(t, dir)
	// 9 frames of 100 bytes and the header fill 916 bytes: 12 segments, and
	// a 13th for the big batch.
	if len(files) != 13 || s.Stats().Segments != 13 {
		t.Fatalf("%d files, %d segments indexed, want 13", len(files), s.Stats().Segments)
	}
	for i, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		last := i == len(files)-1
		if (fi.Size() > segBytes) != last {
			t.Errorf("%s: %d bytes (SegmentBytes %d)", f, fi.Size(), segBytes)
		}
		first := fmt.Sprintf("%020d", want[min(i*9, 100)].Time.UnixNano())
		if wantName := fmt.Sprintf("%020d-%s.seg", i+1, first); filepath.Base(f) != wantName {
			t.Errorf("file %d is %s, want %s", i, filepath.Base(f), wantName)
		}
	}
	if d := diff(want, all(t, s)); d != "" {
		t.Fatalf("scan (-want +got):\n%s", d)
	}
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{SegmentBytes: 2000, MaxBytes: 1 << 20}
	s := open(t, dir, cfg, nil)
	want := recs(0, 60, 84)
	appendAll(t, s, want, 7)
	st := s.Stats()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(recs(0, 1, 12)); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	if err := s.Scan(time.Time{}, time.Time{}, func(Record) bool { return true }); !errors.Is(err, ErrClosed) {
		t.Errorf("Scan after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}

	l := &logs{}
	s = open(t, dir, cfg, l)
	if got := s.Stats(); got != st {
		t.Errorf("reopened Stats = %+v, want %+v", got, st)
	}
	if d := diff(want, all(t, s)); d != "" {
		t.Fatalf("reopened scan (-want +got):\n%s", d)
	}
	more := recs(60, 100, 84)
	appendAll(t, s, more, 7)
	if d := diff(append(want, more...), all(t, s)); d != "" {
		t.Fatalf("scan after appending (-want +got):\n%s", d)
	}
	if w := l.warnings(); len(w) != 0 {
		t.Errorf("warnings on a clean reopen: %q", w)
	}
}

func TestTornTail(t *testing.T) {
	// Two batches in one segment; the last record is cut at every byte.
	want := recs(0, 5, 40)
	last := rec(5, 40)
	var keep int64 = headerSize + 5*(frameSize+40)
	frame := appendFrame(nil, last)

	type cut struct {
		name string
		edit func(b []byte) []byte
	}
	var cuts []cut
	for n := 1; n < len(frame); n++ {
		cuts = append(cuts, cut{fmt.Sprintf("cut at %d of %d", n, len(frame)), func(b []byte) []byte { return b[:keep+int64(n)] }})
	}
	for _, i := range []int{0, 4, 8, len(frame) - 1} {
		cuts = append(cuts, cut{fmt.Sprintf("flip byte %d", i), func(b []byte) []byte { b[keep+int64(i)] ^= 0x40; return b }})
	}
	cuts = append(cuts,
		cut{"zeros after", func(b []byte) []byte { return append(b[:keep], make([]byte, 4096)...) }},
		cut{"length over cap", func(b []byte) []byte { b[keep+2] = 0xff; return b }},
	)
	for _, tc := range cuts {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Config{}, nil)
			appendAll(t, s, want, 3)
			appendAll(t, s, []Record{last}, 1)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			path := segFiles(t, dir)[0]
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tc.edit(b), 0o640); err != nil {
				t.Fatal(err)
			}

			l := &logs{}
			s = open(t, dir, Config{}, l)
			if d := diff(want, all(t, s)); d != "" {
				t.Fatalf("scan (-want +got):\n%s", d)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			w := l.warnings()
			if fi.Size() == keep+int64(len(frame)) {
				t.Fatal("the edit left the file whole")
			}
			if fi.Size() != keep {
				t.Errorf("file is %d bytes after Open, want %d", fi.Size(), keep)
			}
			if len(w) != 1 || !strings.Contains(w[0], "torn tail") || !strings.Contains(w[0], path) ||
				!strings.Contains(w[0], fmt.Sprintf("offset=%d", keep)) {
				t.Errorf("warnings %q, want one naming %s and offset %d", w, path, keep)
			}
			// Appending goes on where the good records end.
			appendAll(t, s, []Record{last}, 1)
			if d := diff(append(slices.Clone(want), last), all(t, s)); d != "" {
				t.Errorf("scan after appending (-want +got):\n%s", d)
			}
		})
	}
}

func TestTornHeader(t *testing.T) {
	for n := range headerSize {
		t.Run(fmt.Sprintf("%d bytes", n), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Config{SegmentBytes: 250, MaxBytes: 1 << 20}, nil)
			appendAll(t, s, recs(0, 4, 84), 1) // two segments of two
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			files := segFiles(t, dir)
			if err := os.Truncate(files[1], int64(n)); err != nil {
				t.Fatal(err)
			}
			l := &logs{}
			s = open(t, dir, Config{SegmentBytes: 250, MaxBytes: 1 << 20}, l)
			if w := l.warnings(); len(w) != 1 || !strings.Contains(w[0], files[1]) {
				t.Errorf("warnings %q, want one naming %s", w, files[1])
			}
			appendAll(t, s, recs(10, 11, 84), 1)
			if d := diff(append(recs(0, 2, 84), rec(10, 84)), all(t, s)); d != "" {
				t.Errorf("scan (-want +got):\n%s", d)
			}
		})
	}
}

func TestDamagedOldSegment(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{SegmentBytes: 1000, MaxBytes: 1 << 20}
	s := open(t, dir, cfg, nil)
	rs := recs(0, 27, 84) // three segments of 9 records
	appendAll(t, s, rs, 9)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files := segFiles(t, dir)
	if len(files) != 3 {
		t.Fatalf("%d segments, want 3", len(files))
	}
	// Record 4 of the middle segment: a flipped data byte fails its CRC.
	off := int64(headerSize + 4*100 + frameSize + 20)
	flip(t, files[1], off)

	l := &logs{}
	s = open(t, dir, cfg, l)
	want := append(slices.Clone(rs[:13]), rs[18:]...)
	for range 2 {
		if d := diff(want, all(t, s)); d != "" {
			t.Fatalf("scan (-want +got):\n%s", d)
		}
	}
	w := l.warnings()
	if len(w) != 1 || !strings.Contains(w[0], files[1]) || !strings.Contains(w[0], "offset=416") || !strings.Contains(w[0], "CRC") {
		t.Errorf("warnings %q, want one naming %s at offset 416", w, files[1])
	}

	t.Run("damaged after Open", func(t *testing.T) {
		// The first segment rots while the store is open: a scan stops it
		// there, says so once, and reads the rest.
		flip(t, files[0], headerSize+2*100+frameSize)
		want := append(slices.Clone(rs[:2]), want[9:]...)
		for range 2 {
			if d := diff(want, all(t, s)); d != "" {
				t.Fatalf("scan (-want +got):\n%s", d)
			}
		}
		if w := l.warnings(); len(w) != 2 || !strings.Contains(w[1], files[0]) || !strings.Contains(w[1], "offset=216") {
			t.Errorf("warnings %q, want a second naming %s at offset 216", w, files[0])
		}
	})
}

// flip inverts a bit of the byte at off in path.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x01
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

func TestDamagedHeader(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{SegmentBytes: 1000, MaxBytes: 1 << 20}
	s := open(t, dir, cfg, nil)
	rs := recs(0, 27, 84)
	appendAll(t, s, rs, 9)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files := segFiles(t, dir)
	flip(t, files[0], 1)  // magic
	flip(t, files[2], 12) // id: the active one cannot be appended to
	l := &logs{}
	s = open(t, dir, cfg, l)
	if d := diff(rs[9:18], all(t, s)); d != "" {
		t.Fatalf("scan (-want +got):\n%s", d)
	}
	if w := l.warnings(); len(w) != 2 || !strings.Contains(w[0], files[0]) || !strings.Contains(w[1], files[2]) {
		t.Errorf("warnings %q, want one for each of %s and %s", w, files[0], files[2])
	}
	appendAll(t, s, recs(30, 31, 84), 1)
	now := segFiles(t, dir)
	if len(now) != 4 {
		t.Fatalf("segments %q, want a new fourth one", now)
	}
	// Files with no readable record go at the next Prune.
	if err := s.Prune(base); err != nil {
		t.Fatal(err)
	}
	if got, want := segFiles(t, dir), []string{files[1], now[3]}; !slices.Equal(got, want) {
		t.Errorf("after Prune %q, want %q", got, want)
	}
	if d := diff(append(slices.Clone(rs[9:18]), rec(30, 84)), all(t, s)); d != "" {
		t.Fatalf("scan (-want +got):\n%s", d)
	}
}

func TestForeignFiles(t *testing.T) {
	// Files that are not segments are left alone, with a warning each.
	dir := t.TempDir()
	for _, name := range []string{"notes.txt", "1-2.seg", "00000000000000000000-00000000000000000000.seg"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("hello"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "00000000000000000007-00000000000000000000.seg"), 0o750); err != nil {
		t.Fatal(err)
	}
	l := &logs{}
	s := open(t, dir, Config{}, l)
	if w := l.warnings(); len(w) != 4 || !strings.Contains(w[0], "not a segment") {
		t.Errorf("warnings %q, want 4 of files that are not segments", w)
	}
	appendAll(t, s, recs(0, 3, 20), 3)
	if d := diff(recs(0, 3, 20), all(t, s)); d != "" {
		t.Fatalf("scan (-want +got):\n%s", d)
	}
	if err := s.Prune(base.Add(48 * time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err != nil {
		t.Errorf("a foreign file went: %v", err)
	}
}

func TestPruneByAge(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Config{Retention: time.Hour, SegmentBytes: 1000, MaxBytes: 1 << 20}, nil)
	s.now = func() time.Time { return base }
	// Four segments of 9 records, each an hour after the previous; in the
	// third, one record arrives late with an older time.
	var rs []Record
	for seg := range 4 {
		for i := range 9 {
			r := rec(seg*9+i, 84)
			r.Time = base.Add(time.Duration(seg)*time.Hour + time.Duration(i)*time.Minute)
			if seg == 2 && i == 8 {
				r.Time = base
			}
			rs = append(rs, r)
		}
	}
	appendAll(t, s, rs, 9)
	for _, tc := range []struct {
		name string
		now  time.Time
		want []Record // kept
	}{
		{"nothing old yet", base.Add(time.Hour + 8*time.Minute), rs},
		{"first is old", base.Add(time.Hour + 9*time.Minute), rs[9:]},
		{"newest record counts, not the earliest", base.Add(3*time.Hour + 7*time.Minute), rs[18:]},
		{"never the active one", base.Add(100 * time.Hour), rs[27:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Prune(tc.now); err != nil {
				t.Fatal(err)
			}
			if d := diff(tc.want, all(t, s)); d != "" {
				t.Errorf("kept (-want +got):\n%s", d)
			}
			if st := s.Stats(); st.Records != int64(len(tc.want)) || len(segFiles(t, dir)) != st.Segments {
				t.Errorf("Stats %+v, %d files", st, len(segFiles(t, dir)))
			}
		})
	}
}

func TestPruneBySize(t *testing.T) {
	// 9 records (916 bytes) a segment, at most 3000 bytes: an Append that
	// rotates drops the oldest segments until the store fits.
	dir := t.TempDir()
	s := open(t, dir, Config{SegmentBytes: 1000, MaxBytes: 3000}, nil)
	rs := recs(0, 9*10, 84)
	for i, b := range slices.Collect(slices.Chunk(rs, 9)) {
		appendAll(t, s, b, 9)
		if got, want := s.Stats().Segments, min(i+1, 3); got != want {
			t.Fatalf("after %d segments, %d kept, want %d", i+1, got, want)
		}
		if s.Bytes() > 3000 {
			t.Fatalf("Bytes = %d, over MaxBytes", s.Bytes())
		}
	}
	if d := diff(rs[7*9:], all(t, s)); d != "" {
		t.Errorf("kept (-want +got):\n%s", d)
	}
	if got := len(segFiles(t, dir)); got != 3 {
		t.Errorf("%d files, want 3", got)
	}
}

func TestCursor(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Config{SegmentBytes: 1000, MaxBytes: 1 << 20, Retention: time.Hour}, nil)
	s.now = func() time.Time { return base }
	rs := recs(0, 50, 84)
	appendAll(t, s, rs, 4)

	// page reads up to n records from c, through the cursor's string.
	page := func(c Cursor, n int) ([]Record, Cursor) {
		t.Helper()
		c, err := ParseCursor(c.String())
		if err != nil {
			t.Fatalf("ParseCursor(%q): %v", c, err)
		}
		var out []Record
		next, err := s.ScanFrom(c, time.Time{}, func(r Record, _ Cursor) bool {
			out = append(out, Record{Time: r.Time, Data: bytes.Clone(r.Data)})
			return len(out) < n
		})
		if err != nil {
			t.Fatalf("ScanFrom: %v", err)
		}
		return out, next
	}

	var got []Record
	c := Cursor{}
	for {
		p, next := page(c, 7)
		got = append(got, p...)
		if len(p) == 0 {
			if next != c {
				t.Errorf("an empty page moved the cursor from %v to %v", c, next)
			}
			break
		}
		c = next
	}
	if d := diff(rs, got); d != "" {
		t.Fatalf("paged (-want +got):\n%s", d)
	}

	// New records come after the last cursor, across a rotation.
	appendAll(t, s, recs(50, 60, 84), 5)
	p, end := page(c, 100)
	if d := diff(recs(50, 60, 84), p); d != "" {
		t.Errorf("after the end (-want +got):\n%s", d)
	}

	// A cursor into a pruned segment resumes at the oldest kept. Segments
	// hold 8 records (816 bytes); a smaller MaxBytes drops the first two.
	_, mid := page(Cursor{}, 3) // inside segment 1
	total := s.Bytes()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, Config{SegmentBytes: 1000, MaxBytes: total - 2*816}, nil)
	if err := s.Prune(base); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Bytes; got != total-2*816 {
		t.Fatalf("after Prune %d bytes, want %d", got, total-2*816)
	}
	p, _ = page(mid, 4)
	if d := diff(recs(16, 20, 84), p); d != "" {
		t.Errorf("from a pruned segment (-want +got):\n%s", d)
	}
	if p, next := page(end, 100); len(p) != 0 || next != end {
		t.Errorf("from the end: %d records, cursor %v, want none and %v", len(p), next, end)
	}

	// until filters without stopping; the cursor still moves past.
	var n int
	next, err := s.ScanFrom(Cursor{}, rec(20, 84).Time, func(Record, Cursor) bool { n++; return true })
	if err != nil || n != 4 || next != end {
		t.Errorf("ScanFrom until record 20 = %d records, %v, %v; want 4, %v", n, next, err, end)
	}
	if got := s.Seek(rec(40, 84).Time); got.seg != 6 || got.off != headerSize {
		t.Errorf("Seek(record 40) = %+v, want the start of segment 6", got)
	}

	for _, bad := range []string{"x", Cursor{seg: 1, off: 3}.String(), Cursor{seg: 0, off: 100}.String(), "AQ"} {
		if _, err := ParseCursor(bad); !errors.Is(err, ErrBadCursor) {
			t.Errorf("ParseCursor(%q) = %v, want ErrBadCursor", bad, err)
		}
	}
	if _, err := s.ScanFrom(Cursor{seg: 3, off: headerSize + 50}, time.Time{}, func(Record, Cursor) bool { return true }); !errors.Is(err, ErrBadCursor) {
		t.Errorf("ScanFrom(mid-record) = %v, want ErrBadCursor", err)
	}
}

func TestConcurrent(t *testing.T) {
	// Writers append numbered records while readers scan: every scan sees,
	// of each writer, a gapless prefix of its records.
	s := open(t, t.TempDir(), Config{SegmentBytes: 16 << 10, MaxBytes: 1 << 30}, nil)
	const writers, batches, per = 4, 50, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers+2)
	for w := range writers {
		wg.Go(func() {
			for b := range batches {
				var batch []Record
				for i := range per {
					batch = append(batch, Record{Time: base, Data: fmt.Appendf(nil, "%d/%d", w, b*per+i)})
				}
				if err := s.Append(batch); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	check := func() error {
		next := make([]int, writers)
		return s.Scan(time.Time{}, time.Time{}, func(r Record) bool {
			var w, i int
			if _, err := fmt.Sscanf(string(r.Data), "%d/%d", &w, &i); err != nil || i != next[w] {
				errs <- fmt.Errorf("record %q after %v", r.Data, next)
				return false
			}
			next[w]++
			return true
		})
	}
	done := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := check(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	poll.Eventually(t, "all appends", func() error {
		if n := s.Stats().Records; n != writers*batches*per {
			return fmt.Errorf("%d records", n)
		}
		return nil
	})
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := check(); err != nil {
		t.Error(err)
	}
}

func TestPeriodicSync(t *testing.T) {
	s, err := Open(t.TempDir(), Config{FlushInterval: time.Millisecond}, (&logs{}).logger())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	appendAll(t, s, recs(0, 1, 20), 1)
	poll.Eventually(t, "a periodic fsync", poll.Holds(func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.syncs > 0 && !s.unsynced
	}))
	if err := s.Sync(); err != nil {
		t.Errorf("Sync = %v", err)
	}
}

func TestConfig(t *testing.T) {
	for _, cfg := range []Config{{Retention: -1}, {MaxBytes: -1}, {SegmentBytes: 2 << 30}} {
		if _, err := Open(t.TempDir(), cfg, (&logs{}).logger()); err == nil {
			t.Errorf("Open(%+v) succeeded", cfg)
		}
	}
}
