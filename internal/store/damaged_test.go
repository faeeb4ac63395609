package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store/boltcheck"
)

// TestOpenRefusesDamagedFiles: a state.db cut short or overwritten is
// refused with ErrDamaged and an error naming it, and left as it was; bbolt
// would have read past the end of its mapping (a fatal SIGBUS) or panicked
// in a goroutine of its own on most of these.
func TestOpenRefusesDamagedFiles(t *testing.T) {
	src := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(src, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 300; i++ {
		putPolicy(t, s, i, pol(fmt.Sprintf("policy-%04d", i), policy.Scope{Org: "acme"}, "deny"))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	good := readFile(t, src)
	m, err := boltcheck.CheckReader(bytes.NewReader(good), int64(len(good)))
	if err != nil {
		t.Fatal(err)
	}
	ps, hwm := int(m.PageSize), int(m.HighMark)
	const metaAt = 16 // a meta page's content follows the page header
	tests := []struct {
		name   string
		damage func(b []byte) []byte
		want   string
	}{
		{"truncated to half", func(b []byte) []byte { return b[:hwm*ps/2] }, "truncated"},
		{"last page cut", func(b []byte) []byte { return b[:(hwm-1)*ps] }, "truncated"},
		{"shorter than two pages", func(b []byte) []byte { return b[:100] }, "shorter than two meta pages"},
		{"both meta pages overwritten", func(b []byte) []byte {
			copy(b[metaAt:], "garbage!")
			copy(b[ps+metaAt:], "garbage!")
			return b
		}, "both meta pages are invalid"},
		{"the root page zeroed", func(b []byte) []byte { clear(b[int(m.Root)*ps : int(m.Root+1)*ps]); return b }, "page"},
		{"pages overwritten with text", func(b []byte) []byte {
			for off := 2 * ps; off < len(b); off += ps {
				copy(b[off:], "this page was overwritten by something else")
			}
			return b
		}, "page"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			raw := tc.damage(bytes.Clone(good))
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, opts := range []Options{{}, {NoSync: true}} {
				s, err := OpenWithOptions(path, testLogger(), opts)
				if err == nil {
					_ = s.Close()
					t.Fatalf("Open(%+v) succeeded on a damaged file", opts)
				}
				if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Open(%+v) = %v, want ErrDamaged naming %s and saying %q", opts, err, path, tc.want)
				}
				if !bytes.Equal(readFile(t, path), raw) {
					t.Fatal("Open modified the file it refused")
				}
				_ = os.Remove(path + DirtySuffix)
			}
			if _, err := Inspect(path); !errors.Is(err, ErrDamaged) {
				t.Errorf("Inspect = %v, want ErrDamaged", err)
			}
		})
	}
}

// TestApplyBatchErrorNamesFile: a batch that cannot be written says which
// file, so that the node's last line names it.
func TestApplyBatchErrorNamesFile(t *testing.T) {
	s := openStore(t)
	err := s.ApplyBatch(1, func(*Batch) error { return errors.New("no space left on device") })
	if err == nil || !strings.Contains(err.Error(), s.Path()) {
		t.Fatalf("ApplyBatch = %v, want an error naming %s", err, s.Path())
	}
}
