// Package chaos holds the chaos suite: three real `policyd serve`
// processes on loopback behind fault-injecting Raft proxies, concurrent REST
// and SDK clients, one fault at a time (kill, pause, partition, leadership
// transfer, membership change), and a linearizability check of the recorded
// history with porcupine. It has no non-test code; run it with
//
//	go test ./tests/chaos        # short form, about 2 minutes
//
// The flags, faults and checks are in docs/design.md.
package chaos
