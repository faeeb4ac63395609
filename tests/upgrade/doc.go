// Package upgrade holds the rolling-upgrade test: a cluster of the last
// release's binaries is upgraded node by node to this tree's binary with no
// write lost and no stop. It proves log and peer-plane compatibility with
// the release it names; a failure means the new binary cannot replace that
// release in place. The package has no non-test code; run it with
//
//	go test -count=1 -v ./tests/upgrade/
//
// What it checks is in docs/operations.md.
package upgrade
