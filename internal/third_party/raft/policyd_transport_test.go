// policyd: not upstream. A transport that shuts down while a peer's RPC is
// in flight must not log that as an error (see README.md, change 3).

package raft

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestShutdownWithRPCInFlightIsNotAnError closes a transport while an
// AppendEntries it received waits for raft's answer, as happens to every
// follower stopped on purpose: the leader's next heartbeat or entries are
// usually on their way. Upstream logged that at error level.
func TestShutdownWithRPCInFlightIsNotAnError(t *testing.T) {
	var logs lockedBytesBuffer // upstream's, in raft_test.go
	trans1, err := NewTCPTransportWithConfig("localhost:0", nil, &NetworkTransportConfig{
		MaxPool: 2,
		Timeout: time.Second,
		Logger:  hclog.New(&hclog.LoggerOptions{Name: "trans1", Output: &logs, Level: hclog.Debug}),
	})
	if err != nil {
		t.Fatalf("transport: %v", err)
	}
	defer trans1.Close()
	trans2, err := makeTransport(t, false, "")
	if err != nil {
		t.Fatalf("transport: %v", err)
	}
	defer trans2.Close()

	sent := make(chan error, 1)
	go func() {
		args := makeAppendRPC()
		var resp AppendEntriesResponse
		sent <- trans2.AppendEntries("id1", trans1.LocalAddr(), &args, &resp)
	}()
	// Once the RPC is taken from the consumer, its connection handler
	// waits for the answer, which never comes.
	select {
	case <-trans1.Consumer():
	case <-time.After(5 * time.Second):
		t.Fatal("the RPC did not arrive")
	}
	if err := trans1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	// The handler logs before it closes the connection, which is what
	// ends the call.
	select {
	case err := <-sent:
		if err == nil {
			t.Fatal("AppendEntries succeeded against a transport that shut down")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AppendEntries did not return")
	}

	out := logs.String()
	if strings.Contains(out, "[ERROR]") {
		t.Errorf("shutting down with an RPC in flight logged an error:\n%s", out)
	}
	if !strings.Contains(out, "transport shut down with an RPC in flight") {
		t.Errorf("the ended RPC was not logged at debug level:\n%s", out)
	}
}
