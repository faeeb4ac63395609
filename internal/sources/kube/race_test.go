//go:build race

package kube

// raceEnabled: the race detector slows the driver and its client several
// times over, so the 10 s bound on 1,000 statuses holds without it;
// hack/test.sh runs that test again without -race.
const raceEnabled = true
