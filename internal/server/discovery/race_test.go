//go:build race

package discovery

// raceEnabled: the race detector randomises which runnable goroutine runs
// next, which blunts tests that measure what the scheduler's hand-off
// does; they skip, and hack/test.sh runs them again without -race.
const raceEnabled = true
