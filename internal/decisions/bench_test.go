package decisions

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchBatch is 100 records of about 600 bytes, the size of an encoded
// decision with a few attributes.
func benchBatch(r *rand.Rand, at time.Time) []Record {
	batch := make([]Record, 100)
	for i := range batch {
		d := make([]byte, 560+r.IntN(80))
		for j := range d {
			d[j] = byte(r.Uint32())
		}
		batch[i] = Record{Time: at.Add(time.Duration(i) * time.Microsecond), Data: d}
	}
	return batch
}

// BenchmarkAppend appends batches of 100 records of ~600 bytes with the
// default config (fsync every second and at each 64 MiB rotation).
func BenchmarkAppend(b *testing.B) {
	s, err := Open(b.TempDir(), Config{}, (&logs{}).logger())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	r := rand.New(rand.NewPCG(1, 2))
	batches := make([][]Record, 64)
	for i := range batches {
		batches[i] = benchBatch(r, base)
	}
	n := 0
	for b.Loop() {
		if err := s.Append(batches[n%len(batches)]); err != nil {
			b.Fatal(err)
		}
		n++
	}
	st := s.Stats()
	b.ReportMetric(float64(n*100)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(st.Bytes)/float64(st.Records), "disk-B/record")
}

// BenchmarkMillion scans, and opens, a store of 1,000,000 records of ~600
// bytes.
func BenchmarkMillion(b *testing.B) {
	dir := b.TempDir()
	s, err := Open(dir, Config{FlushInterval: -1}, (&logs{}).logger())
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	batches := make([][]Record, 64)
	for i := range batches {
		batches[i] = benchBatch(r, base)
	}
	for i := range 10_000 {
		if err := s.Append(batches[i%len(batches)]); err != nil {
			b.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Records != 1_000_000 {
		b.Fatalf("%d records", st.Records)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if s, err = Open(dir, Config{FlushInterval: -1}, (&logs{}).logger()); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.Logf("%d records, %d bytes in %d segments: %.1f bytes a record on disk", st.Records, st.Bytes, st.Segments,
		float64(st.Bytes)/float64(st.Records))

	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			n := 0
			if err := s.Scan(time.Time{}, time.Time{}, func(Record) bool { n++; return true }); err != nil {
				b.Fatal(err)
			}
			if n != 1_000_000 {
				b.Fatalf("scanned %d", n)
			}
		}
		b.ReportMetric(float64(b.N)*1e6/b.Elapsed().Seconds(), "records/s")
		b.SetBytes(st.Bytes)
	})
	b.Run("open", func(b *testing.B) { // a store over the same files, only to index them

		for b.Loop() {
			s2, err := Open(dir, Config{FlushInterval: -1}, (&logs{}).logger())
			if err != nil {
				b.Fatal(err)
			}
			if got := s2.Stats(); got != st {
				b.Fatal(fmt.Sprint(got, st))
			}
			s2.Close()
		}
		b.ReportMetric(float64(b.N)*1e6/b.Elapsed().Seconds(), "records/s")
		b.SetBytes(st.Bytes)
	})
}
