package boltcheck

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// makeDB writes a bbolt file with what the checker must walk: branch pages,
// overflow pages, nested buckets stored in pages of their own and inline,
// and freed pages; with a persisted free list or without one (policyd's
// files).
func makeDB(t testing.TB, freelistSync bool) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: !freelistSync, FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		big, err := tx.CreateBucket([]byte("big"))
		if err != nil {
			return err
		}
		for i := range 600 {
			if err := big.Put(fmt.Appendf(nil, "key-%05d", i), bytes.Repeat([]byte{byte(i)}, 100)); err != nil {
				return err
			}
		}
		if err := big.Put([]byte("overflow"), bytes.Repeat([]byte("x"), 10000)); err != nil {
			return err
		}
		nested, err := big.CreateBucket([]byte("nested"))
		if err != nil {
			return err
		}
		for i := range 100 {
			if err := nested.Put(fmt.Appendf(nil, "n-%03d", i), bytes.Repeat([]byte{1}, 80)); err != nil {
				return err
			}
		}
		inline, err := tx.CreateBucket([]byte("inline"))
		if err != nil {
			return err
		}
		return inline.Put([]byte("a"), []byte("b"))
	})
	if err == nil {
		// Free some pages.
		err = db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("big"))
			for i := range 200 {
				if err := b.Delete(fmt.Appendf(nil, "key-%05d", i)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// boltAccepts opens raw with bbolt, as policyd does, and runs bbolt's own
// consistency check. A panic here fails the test binary.
func boltAccepts(t testing.TB, raw []byte, freelistSync bool) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "open.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: !freelistSync, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return err
	}
	defer db.Close()
	// Read every key, as the store and the log store do.
	var walk func(b *bolt.Bucket) error
	walk = func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(b.Bucket(k))
			}
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b) })
	})
	if err != nil {
		return err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("written"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), bytes.Repeat([]byte("v"), 5000))
	}); err != nil {
		return err
	}
	// bbolt's own check also asserts the meta pages' headers, which bbolt
	// otherwise never reads (a commit rewrites them whole).
	for id := range 2 {
		p := raw[id*db.Info().PageSize:]
		if order.Uint64(p) != uint64(id) || order.Uint16(p[8:]) != 0x04 {
			return nil
		}
	}
	return db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
}

func meta(t testing.TB, raw []byte) Meta {
	t.Helper()
	m, err := CheckReader(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// pageOf returns the first page of the given type after the meta pages.
func pageOf(t testing.TB, raw []byte, ps int, flags uint16) int {
	t.Helper()
	for id := 2; (id+1)*ps <= len(raw); id++ {
		p := raw[id*ps:]
		if order.Uint64(p) == uint64(id) && order.Uint16(p[8:]) == flags && order.Uint16(p[10:]) > 1 {
			return id
		}
	}
	t.Fatalf("no page with flags %#x", flags)
	return 0
}

func TestCheck(t *testing.T) {
	for _, sync := range []bool{false, true} {
		good := makeDB(t, sync)
		m := meta(t, good)
		ps := int(m.PageSize)
		if sync != (m.Freelist != noFreelist) {
			t.Fatalf("freelist sync %v, meta free list page %d", sync, m.Freelist)
		}
		// Byte offsets of what the cases damage.
		leaf, branch := pageOf(t, good, ps, leafFlag)*ps, pageOf(t, good, ps, branchFlag)*ps
		newer := 0 // the meta page in force
		if m.TxID%2 == 1 {
			newer = ps
		}
		tests := []struct {
			name   string
			damage func(b []byte) []byte
			want   string // "" if the file is still whole
		}{
			{"intact", func(b []byte) []byte { return b }, ""},
			{"truncated to 1000 bytes", func(b []byte) []byte { return b[:1000] }, "shorter than two meta pages"},
			{"truncated to a page", func(b []byte) []byte { return b[:ps] }, "truncated"},
			{"truncated below the high water mark", func(b []byte) []byte { return b[:(int(m.HighMark)-1)*ps] }, "truncated"},
			{"truncated to half", func(b []byte) []byte { return b[:int(m.HighMark)*ps/2] }, "truncated"},
			{"newer meta damaged: the older is used", func(b []byte) []byte { b[newer+pageHeaderSize+20]++; return b }, ""},
			{"both meta pages damaged", func(b []byte) []byte {
				b[pageHeaderSize+20]++
				b[ps+pageHeaderSize+20]++
				return b
			}, "both meta pages are invalid"},
			{"zeroed start", func(b []byte) []byte { clear(b[:2*ps]); return b }, "both meta pages are invalid"},
			{"leaf page id", func(b []byte) []byte { b[leaf]++; return b }, "its header says"},
			{"leaf page type", func(b []byte) []byte { b[leaf+8] = 0x04; return b }, "type 0x4"},
			{"leaf element count", func(b []byte) []byte { binary.NativeEndian.PutUint16(b[leaf+10:], 0xfff0); return b }, "do not fit"},
			{"leaf key position", func(b []byte) []byte {
				binary.NativeEndian.PutUint32(b[leaf+pageHeaderSize+4:], 1<<30)
				return b
			}, "outside the page"},
			{"leaf keys out of order", func(b []byte) []byte {
				e0 := leaf + pageHeaderSize
				pos := binary.NativeEndian.Uint32(b[e0+4:])
				b[e0+int(pos)] = 0xff // the first key now sorts last
				return b
			}, "page 2: key 0 is not below"},
			{"branch child out of range", func(b []byte) []byte {
				binary.NativeEndian.PutUint64(b[branch+pageHeaderSize+8:], 1<<40)
				return b
			}, "outside the"},
			{"branch child referenced twice", func(b []byte) []byte {
				e0, e1 := branch+pageHeaderSize, branch+pageHeaderSize+elementSize
				copy(b[e1+8:e1+16], b[e0+8:e0+16])
				return b
			}, "referenced twice"},
		}
		for _, tc := range tests {
			t.Run(fmt.Sprintf("freelist sync %v/%s", sync, tc.name), func(t *testing.T) {
				raw := tc.damage(bytes.Clone(good))
				path := filepath.Join(t.TempDir(), "state.db")
				if err := os.WriteFile(path, raw, 0o600); err != nil {
					t.Fatal(err)
				}
				err := Check(path)
				if tc.want == "" {
					if err != nil {
						t.Fatalf("Check = %v, want nil", err)
					}
					if err := boltAccepts(t, raw, sync); err != nil {
						t.Fatalf("bbolt refuses a file Check accepts: %v", err)
					}
					return
				}
				if !errors.Is(err, ErrDamaged) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
					t.Fatalf("Check = %v, want ErrDamaged mentioning %q", err, tc.want)
				}
			})
		}
	}
}

func TestCheckMissingOrEmpty(t *testing.T) {
	dir := t.TempDir()
	if err := Check(filepath.Join(dir, "missing.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(empty); err != nil {
		t.Fatalf("empty file: %v", err)
	}
}

// FuzzCheck damages a real bbolt file (one byte changed, the file cut
// short) and requires that Check either refuses it or bbolt opens it and
// finds it consistent: a file Check passes never makes bbolt fault or
// panic.
func FuzzCheck(f *testing.F) {
	good := map[bool][]byte{false: makeDB(f, false), true: makeDB(f, true)}
	f.Add(uint32(20), byte(1), uint32(0), false)
	f.Add(uint32(4096+20), byte(1), uint32(0), true)
	f.Add(uint32(0), byte(0), uint32(3*4096), false)
	f.Add(uint32(5*4096), byte(0x80), uint32(0), false)
	f.Add(uint32(7*4096+10), byte(0xff), uint32(0), true)
	f.Add(uint32(9*4096+30), byte(0x10), uint32(0), false)
	f.Fuzz(func(t *testing.T, off uint32, xor byte, cut uint32, sync bool) {
		raw := bytes.Clone(good[sync])
		raw[int(off)%len(raw)] ^= xor
		if cut > 0 {
			raw = raw[:int(cut)%len(raw)]
		}
		if _, err := CheckReader(bytes.NewReader(raw), int64(len(raw))); err != nil {
			if !errors.Is(err, ErrDamaged) {
				t.Fatalf("error without ErrDamaged: %v", err)
			}
			return
		}
		if err := boltAccepts(t, raw, sync); err != nil {
			t.Fatalf("Check passed a file bbolt finds damaged: %v", err)
		}
	})
}
