package main

import (
	"math"
	"slices"
	"time"
)

// percentile returns the p-th percentile (0 ≤ p ≤ 100) of sorted, which must
// be in ascending order, by the nearest-rank method: the smallest sample
// such that at least p% of the samples are less than or equal to it. It
// never interpolates, so the result is always an observed latency. p ≤ 0
// gives the minimum, p ≥ 100 the maximum, and no samples give 0.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// p*n first: exact for integer p, so that e.g. p99 of 100 samples is rank
	// 99, not 100 through a rounding error in p/100.
	rank := int(math.Ceil(p * float64(n) / 100)) // 1-based
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// latencySummary describes a set of latency samples.
type latencySummary struct {
	count int
	mean  time.Duration
	p50   time.Duration
	p90   time.Duration
	p99   time.Duration
	max   time.Duration
}

// summarize sorts samples in place and summarizes them.
func summarize(samples []time.Duration) latencySummary {
	slices.Sort(samples)
	s := latencySummary{count: len(samples)}
	if s.count == 0 {
		return s
	}
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	s.mean = sum / time.Duration(s.count)
	s.p50 = percentile(samples, 50)
	s.p90 = percentile(samples, 90)
	s.p99 = percentile(samples, 99)
	s.max = samples[s.count-1]
	return s
}

// ms converts d to milliseconds, rounded to microseconds, for JSON output.
func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// round2 rounds x to two decimals.
func round2(x float64) float64 { return math.Round(x*100) / 100 }
