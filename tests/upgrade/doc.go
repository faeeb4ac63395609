// Package upgrade holds the rolling-upgrade test: a cluster of
// the last release's binaries is upgraded node by node to this tree's
// binary with no write lost and no stop. The package has no non-test code;
// run it with
//
//	go test -count=1 -v ./tests/upgrade/
//
// TestRollingUpgrade builds two binaries: the last release from its git
// commit (releaseCommit, via git archive) and this working tree. It starts
// three release nodes on loopback, writes policies of every kind, employees
// and deletes (with If-Match), then replaces one node at a time with the new
// binary on the same data dir and config. After each step it writes through
// every node, so followers of either version forward to a leader of either
// version, and checks that every node serves the same policies, employees
// and policy-set versions as the writes acknowledged. At one step a new node
// leads while a release node still follows: the release node then applies
// entries the new binary proposed. At the end a new node loses its state.db
// and rebuilds it from the Raft log, which holds entries both versions
// wrote. Once every node runs the new binary, every node holds the same
// events with the same actors.
//
// TestRollingUpgradeFromTyped runs the same scenario from typedCommit, the
// last commit of command version 2, whose nodes drop the envelope's audit
// fields (actor, request id): it fails if any replica records an actor
// another dropped.
//
// They prove log and peer-plane compatibility with the release it names; a
// failure means the new binary cannot replace that release in place.
package upgrade
