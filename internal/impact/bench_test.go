package impact

import (
	"strconv"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/impact/impactload"
)

// BenchmarkReplay replays n records of the impactload workload, cycling
// through a pool of distinct ones (decoding and evaluating cost the same
// whether a record repeats or not; the caches are keyed by identity and
// set, which the pool covers in full). ns/record is the figure; the 1M
// case is the target's (under 60 s on one core):
//
//	GOMAXPROCS=1 go test -run '^$' -bench 'Replay/records=1000000' -benchtime 1x ./internal/impact
func BenchmarkReplay(b *testing.B) {
	const poolSize = 20_000
	start := time.Now().Add(-time.Hour)
	pool := make([][]byte, poolSize)
	for i := range pool {
		pool[i] = impactload.Record(i, start)
	}
	for _, n := range []int{10_000, 1_000_000} {
		b.Run("records="+strconv.Itoa(n), func(b *testing.B) {
			scan := func(yield func([]byte) bool) error {
				for i := range n {
					if !yield(pool[i%poolSize]) {
						return nil
					}
				}
				return nil
			}
			b.ReportAllocs()
			var resp any
			for b.Loop() {
				r, err := Replay(b.Context(), Options{}, scan, impactload.Sets)
				if err != nil {
					b.Fatal(err)
				}
				if r.Scanned != uint64(n) || r.CutOff {
					b.Fatalf("scanned %d of %d, cut off %v", r.Scanned, n, r.CutOff)
				}
				checkSums(b, r)
				resp = r
			}
			_ = resp
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/record")
		})
	}
}
