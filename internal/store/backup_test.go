package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// backupOf writes s's snapshot to a file and returns its path, checking that
// Size announced the number of bytes written.
func backupOf(t *testing.T, s *Store) string {
	t.Helper()
	sn, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Release()
	var buf bytes.Buffer
	n, err := sn.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sn.Size(), n; got != want {
		t.Fatalf("Size() = %d, WriteTo wrote %d", got, want)
	}
	path := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestInspect(t *testing.T) {
	s := openStore(t)
	putPolicy(t, s, 3, pol("acme.a", policy.Scope{Org: "acme"}, "deny"))
	putEmployee(t, s, 4, emp("alice", "acme", "red"))
	path := backupOf(t, s)
	before := readFile(t, path)

	info, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info, (FileInfo{AppliedIndex: 4, Digest: digest(t, s)}); got != want {
		t.Fatalf("Inspect = %+v, want the live store's %+v", got, want)
	}
	if !bytes.Equal(readFile(t, path), before) {
		t.Fatal("Inspect changed the file")
	}
}

// TestInspectMissingBucket: a file written before a bucket existed inspects
// as if the bucket were empty, which is what Open makes of it.
func TestInspectMissingBucket(t *testing.T) {
	s := openStore(t)
	putPolicy(t, s, 2, pol("acme.a", policy.Scope{Org: "acme"}, "deny"))
	path := backupOf(t, s)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketMembers) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	info, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Digest != digest(t, s) {
		t.Fatalf("digest without the (empty) members bucket %s, with it %s", info.Digest, digest(t, s))
	}
}

func TestInspectRefuses(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, randomBytes(t, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign.db")
	writeForeignDB(t, foreign)
	tests := []struct {
		name, path string
		foreign    bool
	}{
		{"missing", filepath.Join(dir, "missing.db"), false},
		{"garbage", garbage, false},
		{"foreign bbolt file", foreign, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Inspect(tc.path)
			if err == nil {
				t.Fatal("Inspect accepted it")
			}
			if errors.Is(err, ErrForeignDB) != tc.foreign {
				t.Fatalf("err = %v; ErrForeignDB: %v, want %v", err, errors.Is(err, ErrForeignDB), tc.foreign)
			}
		})
	}
}
