package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/policyd/policyd/internal/third_party/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/store/boltcheck"
)

// writeLog creates a log of kind in raftDir holding entries 1-50 and a
// term, as a node leaves it.
func writeLog(t *testing.T, raftDir, kind string) {
	t.Helper()
	ls, _, err := Open(raftDir, kind, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	var logs []*raft.Log
	for i := uint64(1); i <= 50; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry %d", i)})
	}
	if err := ls.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := ls.SetUint64(keyCurrentTerm, 1); err != nil {
		t.Fatal(err)
	}
	if err := ls.Close(); err != nil {
		t.Fatal(err)
	}
}

// updateBolt changes a stopped log's bbolt file with bbolt itself: a file
// that is whole, holding a value raft cannot use.
func updateBolt(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func truncateBelowHighMark(t *testing.T, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := boltcheck.CheckReader(strings.NewReader(string(raw)), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, int64(m.HighMark-1)*int64(m.PageSize)); err != nil {
		t.Fatal(err)
	}
}

func overwriteAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// TestOpenLogStoreRefusesDamage: a Raft log cut short, with its bbolt meta
// pages overwritten, an entry that does not decode or is missing, or a term
// that is not a number, is refused with ErrDamaged and an error naming
// the file, where bbolt faulted (SIGBUS) or raft panicked on reading it.
func TestOpenLogStoreRefusesDamage(t *testing.T) {
	tests := []struct {
		name, kind string
		damage     func(t *testing.T, raftDir string) // nil: intact
		want       string
	}{
		{"intact", KindBoltDB, nil, ""},
		{"intact", KindWAL, nil, ""},
		{"truncated", KindBoltDB, func(t *testing.T, d string) { truncateBelowHighMark(t, filepath.Join(d, boltLogFile)) }, "truncated"},
		{"meta pages overwritten", KindBoltDB, func(t *testing.T, d string) {
			overwriteAt(t, filepath.Join(d, boltLogFile), 16, []byte("garbage"))
			overwriteAt(t, filepath.Join(d, boltLogFile), 4096+16, []byte("garbage"))
		}, "both meta pages are invalid"},
		{"entry does not decode", KindBoltDB, func(t *testing.T, d string) {
			updateBolt(t, filepath.Join(d, boltLogFile), func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("logs")).Put(be64(25), []byte{0xc1, 0xff, 0x00})
			})
		}, "entry 25 of 1-50"},
		{"entry missing", KindBoltDB, func(t *testing.T, d string) {
			updateBolt(t, filepath.Join(d, boltLogFile), func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("logs")).Delete(be64(30))
			})
		}, "entry 30 of 1-50"},
		{"entries missing below the snapshot (a follower that installed one)", KindBoltDB, func(t *testing.T, d string) {
			updateBolt(t, filepath.Join(d, boltLogFile), func(tx *bolt.Tx) error {
				for i := uint64(10); i <= 35; i++ {
					if err := tx.Bucket([]byte("logs")).Delete(be64(i)); err != nil {
						return err
					}
				}
				return nil
			})
			writeSnapshot(t, d, 35)
		}, ""},
		{"entry missing above the snapshot", KindBoltDB, func(t *testing.T, d string) {
			updateBolt(t, filepath.Join(d, boltLogFile), func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("logs")).Delete(be64(40))
			})
			writeSnapshot(t, d, 35)
		}, "entry 40 of 1-50"},
		{"term is not a number", KindBoltDB, func(t *testing.T, d string) {
			updateBolt(t, filepath.Join(d, boltLogFile), func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("conf")).Put(keyCurrentTerm, []byte{1})
			})
		}, "raft log damaged"},
		{"meta db truncated", KindWAL, func(t *testing.T, d string) {
			truncateBelowHighMark(t, filepath.Join(d, walDir, metadb.FileName))
		}, "truncated"},
		{"meta db pages overwritten", KindWAL, func(t *testing.T, d string) {
			overwriteAt(t, filepath.Join(d, walDir, metadb.FileName), 0, make([]byte, 3*4096))
		}, "both meta pages are invalid"},
		// A damaged tail segment reads back as a shorter log (raft-wal
		// checks only its last batch): the node finds that against
		// state.db (checkLogCoversState, TestDamagedDataRefused).
	}
	for _, tc := range tests {
		t.Run(tc.kind+"/"+tc.name, func(t *testing.T) {
			raftDir := t.TempDir()
			writeLog(t, raftDir, tc.kind)
			if tc.damage != nil {
				tc.damage(t, raftDir)
			}
			ls, _, err := Open(raftDir, tc.kind, hclog.NewNullLogger())
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Open on an intact log: %v", err)
				}
				if err := ls.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				_ = ls.Close()
				t.Fatal("Open accepted a damaged log")
			}
			path := Path(raftDir, tc.kind)
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want ErrDamaged naming %s and saying %q", err, path, tc.want)
			}
		})
	}
}

// failingLog is a log store whose writes fail with err: a fake, for the
// unit table below; TestFullDisk (tests/e2e) fills a real disk.
type failingLog struct {
	*raft.InmemStore
	err error
}

func (f failingLog) StoreLogs([]*raft.Log) error      { return f.err }
func (f failingLog) SetUint64([]byte, uint64) error   { return f.err }
func (f failingLog) DeleteRange(uint64, uint64) error { return f.err }
func (failingLog) Close() error                       { return nil }

// TestFaults: before the node is armed, a failed write comes back as a
// DataError naming the file; after, the write never returns (raft would
// panic or go on), Faulted is closed and Fault names the file and what to
// do.
func TestFaults(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		write    func(ls Store) error
		path     string
		recovery string
	}{
		{"append, disk full", &os.PathError{Op: "write", Path: "raft.db", Err: syscall.ENOSPC},
			func(ls Store) error { return ls.StoreLogs([]*raft.Log{{Index: 1}}) }, "raft.db", "free space on the disk of /data"},
		{"term, I/O error", syscall.EIO,
			func(ls Store) error { return ls.SetUint64(keyCurrentTerm, 2) }, "raft.db", "check the disk of /data"},
		{"truncation, disk full", syscall.ENOSPC,
			func(ls Store) error { return ls.DeleteRange(1, 2) }, "raft.db", "free space"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFaults("/data")
			park := make(chan struct{})
			f.park = park
			ls := watch(failingLog{raft.NewInmemStore(), tc.err}, "/data/raft", KindBoltDB, f)
			var de *DataError
			if err := tc.write(ls); !errors.As(err, &de) || !de.Write || !strings.HasSuffix(de.Path, tc.path) ||
				!errors.Is(err, tc.err) || !strings.Contains(de.Recovery, tc.recovery) {
				t.Fatalf("unarmed write = %v, want a DataError for %s wrapping %v, recovery %q", err, tc.path, tc.err, tc.recovery)
			}
			f.Arm() // a failure before arming that did not stop New ends the node now
			select {
			case <-f.done:
			default:
				t.Fatal("arm after a failed write did not signal it")
			}

			f = NewFaults("/data")
			f.park = park
			ls = watch(failingLog{raft.NewInmemStore(), tc.err}, "/data/raft", KindBoltDB, f)
			f.Arm()
			returned := make(chan error, 1)
			go func() { returned <- tc.write(ls) }()
			select {
			case <-f.done:
			case <-time.After(10 * time.Second):
				t.Fatal("Faulted not closed after a failed write")
			}
			if !f.Parked() {
				t.Error("parked = false after an armed failure")
			}
			select {
			case err := <-returned:
				t.Fatalf("the failed write returned (%v): raft would go on", err)
			default:
			}
			if err := f.Fault(); err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), "to recover: ") {
				t.Errorf("Fault = %v, want one naming %s and the recovery", err, tc.path)
			}
			close(park) // tests only: let the goroutine end
			if err := <-returned; !errors.Is(err, tc.err) {
				t.Errorf("released write returned %v, want %v", err, tc.err)
			}
		})
	}
}

// TestWatchedLogStoreKeepsMonotonic: raft-wal's MonotonicLogStore survives
// the wrapper, or raft would keep a gap after a snapshot restore.
func TestWatchedLogStoreKeepsMonotonic(t *testing.T) {
	dir := t.TempDir()
	ls, _, err := Open(dir, KindWAL, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	w := watch(ls, dir, KindWAL, NewFaults(dir))
	if m, ok := any(w).(raft.MonotonicLogStore); !ok || !m.IsMonotonic() {
		t.Fatal("the wrapped WAL is not monotonic")
	}
	if got, want := w.stablePath, filepath.Join(dir, walDir, metadb.FileName); got != want {
		t.Errorf("stable path = %s, want %s", got, want)
	}
}

// writeSnapshot puts a raft snapshot at index into raftDir's snapshot store.
func writeSnapshot(t *testing.T, raftDir string, index uint64) {
	t.Helper()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, 1, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
}
