package decisions

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzSegment opens a directory holding one arbitrary segment file, the
// newest or followed by a good one, and scans it: Open never fails or
// panics over a file's content, and what comes back from the arbitrary
// file is a run of CRC-valid frames from its start, re-encoding to exactly
// its leading bytes.
func FuzzSegment(f *testing.F) {
	good := appendHeader(nil, 1)
	for _, r := range recs(0, 3, 30) {
		good = appendFrame(good, r)
	}
	for _, seed := range [][]byte{
		good,
		good[:len(good)-5],
		append(bytes.Clone(good[:60]), 0xff),
		appendHeader(nil, 1),
		good[:7],
		make([]byte, 100),
		nil,
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, older bool) {
		dir := t.TempDir()
		path := filepath.Join(dir, segName(1, 0))
		if err := os.WriteFile(path, data, 0o640); err != nil {
			t.Fatal(err)
		}
		after := recs(100, 103, 20)
		if older {
			b := appendHeader(nil, 2)
			for _, r := range after {
				b = appendFrame(b, r)
			}
			if err := os.WriteFile(filepath.Join(dir, segName(2, 0)), b, 0o640); err != nil {
				t.Fatal(err)
			}
		}
		s := open(t, dir, Config{}, nil)
		var first, second []Record
		if _, err := s.ScanFrom(Cursor{}, time.Time{}, func(r Record, c Cursor) bool {
			r.Data = bytes.Clone(r.Data)
			if c.seg == 1 {
				first = append(first, r)
			} else {
				second = append(second, r)
			}
			return true
		}); err != nil {
			t.Fatalf("ScanFrom: %v", err)
		}
		enc := appendHeader(nil, 1)
		for _, r := range first {
			enc = appendFrame(enc, r)
		}
		if len(first) > 0 && !bytes.HasPrefix(data, enc) {
			t.Fatalf("records %v are not the file's leading frames", first)
		}
		if older {
			if d := diff(after, second); d != "" {
				t.Fatalf("the good segment after it (-want +got):\n%s", d)
			}
			return
		}
		// The newest segment is cut to its good records (or begun again)
		// and appending goes on after them.
		if checkHeader(data, 1) == nil || len(data) < headerSize {
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, enc) {
				t.Fatalf("after Open the file is %d bytes, want its %d good ones", len(got), len(enc))
			}
		}
		extra := rec(200, 20)
		if err := s.Append([]Record{extra}); err != nil {
			t.Fatalf("Append: %v", err)
		}
		if d := diff(append(first, extra), all(t, s)); d != "" {
			t.Fatalf("after Append (-want +got):\n%s", d)
		}
	})
}
