//go:build linux

package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/policyd/policyd/internal/server/peer"
)

// These tests show that the suite's checks can fail: the model rejects the
// anomalies the chaos run looks for, and the proxy tells senders apart.

func op(client int, in kvInput, out kvOutput, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
}

func TestKVModel(t *testing.T) {
	put := func(k, w string) kvInput { return kvInput{Op: opPut, Key: k, Write: w} }
	get := func(k string) kvInput { return kvInput{Op: opGet, Key: k} }
	ok, read := kvOutput{Result: resOK}, func(w string) kvOutput { return kvOutput{Result: resOK, Value: w} }
	const never = 1 << 62
	tests := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"read your write", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10), op(1, get("k0"), read("a"), 11, 20),
		}, porcupine.Ok},
		{"stale read after an acknowledged write", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10), op(0, put("k0", "b"), ok, 11, 20), op(1, get("k0"), read("a"), 21, 30),
		}, porcupine.Illegal},
		{"read of a write that was never issued", []porcupine.Operation{
			op(1, get("k0"), read("ghost"), 0, 10),
		}, porcupine.Illegal},
		{"unknown write may apply late", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10), op(2, put("k0", "b"), kvOutput{Result: resUnknown}, 5, never),
			op(1, get("k0"), read("a"), 20, 30), op(1, get("k0"), read("b"), 40, 50),
		}, porcupine.Ok},
		{"unknown write cannot apply before it was sent", []porcupine.Operation{
			op(1, get("k0"), read("b"), 0, 10), op(2, put("k0", "b"), kvOutput{Result: resUnknown}, 20, never),
		}, porcupine.Illegal},
		{"cas succeeds only on its expected write", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10), op(0, put("k0", "b"), ok, 11, 20),
			op(1, kvInput{Op: opCAS, Key: "k0", Write: "c", Expect: "a"}, ok, 21, 30),
		}, porcupine.Illegal},
		{"cas conflict when the expected write holds", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10),
			op(1, kvInput{Op: opCAS, Key: "k0", Write: "c", Expect: "a"}, kvOutput{Result: resConflict}, 11, 20),
		}, porcupine.Illegal},
		{"conditional delete of a superseded write", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10), op(0, put("k0", "b"), ok, 11, 20),
			op(1, kvInput{Op: opDel, Key: "k0", Expect: "a", IfMatch: 3}, ok, 21, 30),
		}, porcupine.Illegal},
		{"delete then a read of the deleted value", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10), op(0, kvInput{Op: opDel, Key: "k0"}, ok, 11, 20),
			op(1, get("k0"), read("a"), 21, 30),
		}, porcupine.Illegal},
		{"keys are independent", []porcupine.Operation{
			op(0, put("k0", "a"), ok, 0, 10), op(1, get("k1"), kvOutput{Result: resNotFound}, 11, 20),
		}, porcupine.Ok},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(kvModel, tc.ops, 10*time.Second); got != tc.want {
				t.Fatalf("check = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOperationsResolveUnknownWrites(t *testing.T) {
	log := mustLog(t, []policyEvent{putEvent(5, "k0", "applied")})
	recs := []record{
		{In: kvInput{Op: opPut, Key: "k0", Write: "applied"}, Out: kvOutput{Result: resUnknown}},
		{In: kvInput{Op: opPut, Key: "k0", Write: "lost-in-flight"}, Out: kvOutput{Result: resUnknown}},
		{In: kvInput{Op: opGet, Key: "k0"}, Out: kvOutput{Result: resUnknown}},
		{In: kvInput{Op: opDel, Key: "k0"}, Out: kvOutput{Result: resNotSent}},
		{In: kvInput{Op: opDel, Key: "k0", Expect: "applied", IfMatch: 5}, Out: kvOutput{Result: resUnknown}},
	}
	ops := operations(recs, log)
	if len(ops) != 1 || ops[0].Input.(kvInput).Write != "applied" || ops[0].Output.(kvOutput).Result != resOK {
		t.Fatalf("operations = %+v, want only the applied write, as ok with no known return (the conditional delete of a revision nothing deleted is dropped)", ops)
	}
}

func TestOperationsBoundUnknownWrites(t *testing.T) {
	log := mustLog(t, []policyEvent{putEvent(5, "k0", "u"), putEvent(7, "k0", "v"), delEvent(9, "k0", 7, "v"), putEvent(11, "k1", "w")})
	unknownPut := record{In: kvInput{Op: opPut, Key: "k0", Write: "u"}, Out: kvOutput{Result: resUnknown}, Call: 10, Return: 20}
	unknownDel := record{In: kvInput{Op: opDel, Key: "k0", Expect: "v", IfMatch: 7}, Out: kvOutput{Result: resUnknown}, Call: 30, Return: 40}
	readAt := func(rev uint64, key, val string, call, ret time.Duration) record {
		return record{In: kvInput{Op: opGet, Key: key}, Out: kvOutput{Result: resOK, Value: val, Revision: rev}, Call: call, Return: ret}
	}
	tests := []struct {
		name    string
		recs    []record
		wantPut int64 // the unknown put's return time
		wantDel int64 // the unknown delete's return time
	}{
		{"no later answer: unbounded", []record{unknownPut, unknownDel}, math.MaxInt64, math.MaxInt64},
		{"earliest later answer bounds", []record{
			unknownPut, unknownDel,
			readAt(7, "k0", "v", 50, 300), readAt(5, "k0", "u", 60, 200), readAt(11, "k0", "z", 70, 250),
		}, 200, 250},
		{"an older revision does not bound", []record{unknownPut, readAt(3, "k0", "a", 50, 60)}, math.MaxInt64, 0},
		{"another key does not bound", []record{unknownPut, readAt(11, "k1", "w", 50, 60)}, math.MaxInt64, 0},
		{"an answer before the call does not bound", []record{unknownPut, readAt(5, "k0", "u", 1, 5)}, math.MaxInt64, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, bound := range []bool{true, false} {
				for _, op := range buildOperations(tc.recs, log, bound) {
					in := op.Input.(kvInput)
					var want int64
					switch in.Op {
					case opPut:
						want = tc.wantPut
					case opDel:
						want = tc.wantDel
					default:
						continue
					}
					if !bound {
						want = math.MaxInt64
					}
					if op.Return != want {
						t.Errorf("bound=%v: %s return = %d, want %d", bound, in.Op, op.Return, want)
					}
				}
			}
		})
	}
}

func putEvent(id uint64, key, write string) policyEvent {
	data, _ := json.Marshal(map[string]any{"name": key, "revision": id, "spec": map[string]string{"reason": write}})
	return policyEvent{ID: id, Action: "UPDATE", EntityID: key, Data: data}
}

// delEvent is a DELETE event: its data is the deleted policy.
func delEvent(id uint64, key string, rev uint64, write string) policyEvent {
	ev := putEvent(rev, key, write)
	ev.ID, ev.Action = id, "DELETE"
	return ev
}

func mustLog(t *testing.T, evs []policyEvent) *writeLog {
	t.Helper()
	w, err := newWriteLog(evs)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestCheckSidecar(t *testing.T) {
	log := mustLog(t, []policyEvent{
		putEvent(3, "k0", "a"), putEvent(4, "k1", "b"),
		delEvent(6, "k0", 3, "a"), putEvent(7, "k0", "c"),
	})
	tests := []struct {
		name string
		grpc bool
		ups  []sidecarUpdate
		want string // "" = accepted; else part of the error
		torn int    // whole gRPC sets that never existed, when accepted
	}{
		{"in order", true, []sidecarUpdate{{Set: state{}}, {Set: state{"k0": 3}}, {Set: state{"k0": 3, "k1": 4}}, {Set: state{"k1": 4}}, {Set: state{"k0": 7, "k1": 4}}}, "", 0},
		{"skips are fine", true, []sidecarUpdate{{Set: state{"k0": 7, "k1": 4}}}, "", 0},
		{"back in time", true, []sidecarUpdate{{Set: state{"k0": 7, "k1": 4}}, {Set: state{"k0": 3, "k1": 4}}}, "went back", 0},
		{"deleted policy reappears", false, []sidecarUpdate{{Set: state{"k0": 3}}, {Set: state{}}, {Set: state{"k0": 3}}}, "went back", 0},
		{"revision never written", false, []sidecarUpdate{{Set: state{"k0": 5}}}, "never written", 0},
		{"torn whole set over gRPC is counted (TestChaos fails on it)", true, []sidecarUpdate{{Set: state{"k0": 7}}}, "", 1},
		{"mixed set between feed deltas", false, []sidecarUpdate{{Set: state{"k0": 7}}, {Set: state{"k0": 7, "k1": 4}}}, "", 0},
		{"feed index goes back", false, []sidecarUpdate{{Index: 7, Set: state{"k0": 7, "k1": 4}}, {Index: 6, Set: state{"k0": 7, "k1": 4}}}, "raft index", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			torn, err := checkSidecar(tc.ups, log, tc.grpc)
			if err == nil && torn != tc.torn {
				t.Errorf("torn = %d, want %d", torn, tc.torn)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestIdentify: the proxy reads the sender from the peer handshake's hello
// that opens every connection, for Raft and the node-to-node API alike, and
// refuses what it cannot attribute.
func TestIdentify(t *testing.T) {
	ids := map[string]int{"node1": 0, "node2": 1}
	hello := func(kind peer.Kind, id string) []byte {
		t.Helper()
		// What a dialling node writes first: its hello (the rest of its
		// handshake waits for the answer, which nobody gives here).
		client, server := net.Pipe()
		defer server.Close()
		go func() {
			cfg := &peer.Config{NodeID: id, HandshakeTimeout: time.Second}
			_, _, _ = cfg.Client(client, "127.0.0.1:1", kind)
			_ = client.Close()
		}()
		b := make([]byte, 512)
		n, _ := io.ReadAtLeast(server, b, 1)
		return b[:n]
	}
	tests := []struct {
		name string
		wire []byte
		want int // -1: error
	}{
		{"raft", hello(peer.KindRaft, "node2"), 1},
		{"node-to-node API", hello(peer.KindAPI, "node1"), 0},
		{"unknown server", hello(peer.KindRaft, "node9"), -1},
		{"raft without a handshake", []byte{0, 0x80}, -1},
		{"garbage", []byte("PDP1\xff"), -1},
		{"empty", nil, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := identify(bufio.NewReader(bytes.NewReader(tc.wire)), ids)
			if tc.want < 0 {
				if err == nil {
					t.Fatalf("identified node %d, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("identify = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestOperationsPlainDeletes(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ev policyEvent, d time.Duration) policyEvent { ev.ProcessedAt = start.Add(d); return ev }
	// The acknowledged put of "a" (called at 10s, answered at 11s, stamped
	// at 10.5s) relates the history's clock to the events'.
	events := []policyEvent{
		at(putEvent(5, "k0", "a"), 10500*time.Millisecond),
		at(delEvent(6, "k0", 5, "a"), 30*time.Second),
	}
	ackedPut := record{In: kvInput{Op: opPut, Key: "k0", Write: "a"}, Out: kvOutput{Result: resOK, Value: "a", Revision: 5}, Call: 10 * time.Second, Return: 11 * time.Second}
	laterRead := record{In: kvInput{Op: opGet, Key: "k1"}, Out: kvOutput{Result: resOK, Value: "x", Revision: 9}, Call: 40 * time.Second, Return: 41 * time.Second}
	del := func(call, ret time.Duration) record {
		return record{In: kvInput{Op: opDel, Key: "k0"}, Out: kvOutput{Result: resUnknown}, Call: call, Return: ret}
	}
	tests := []struct {
		name   string
		events []policyEvent
		del    record
		want   int // deletes kept
	}{
		{"a DELETE while it was open: kept", events, del(29*time.Second, 31*time.Second), 1},
		{"stamped soon after it gave up: kept", events, del(20*time.Second, 25*time.Second), 1},
		{"no DELETE near it: dropped", events, del(50*time.Second, 52*time.Second), 0},
		{"the DELETE came before it: dropped", events, del(31*time.Second, 33*time.Second), 0},
		{"clocks unrelated: kept", []policyEvent{putEvent(5, "k0", "a"), delEvent(6, "k0", 5, "a")}, del(50*time.Second, 52*time.Second), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := mustLog(t, tc.events)
			kept := 0
			for _, op := range operations([]record{ackedPut, laterRead, tc.del}, log) {
				if op.Input.(kvInput).Op == opDel {
					kept++
				}
			}
			if kept != tc.want {
				t.Errorf("deletes kept = %d, want %d", kept, tc.want)
			}
		})
	}
	t.Run("the last candidate was seen before it began: dropped", func(t *testing.T) {
		log := mustLog(t, append(events[:2:2], at(putEvent(8, "k0", "b"), 30100*time.Millisecond)))
		putB := record{In: kvInput{Op: opPut, Key: "k0", Write: "b"}, Out: kvOutput{Result: resOK, Value: "b", Revision: 8}, Call: 30050 * time.Millisecond, Return: 30150 * time.Millisecond}
		for _, op := range operations([]record{ackedPut, putB, del(30200*time.Millisecond, 30300*time.Millisecond)}, log) {
			if op.Input.(kvInput).Op == opDel {
				t.Errorf("kept %+v", op)
			}
		}
	})
}

func TestStaleReads(t *testing.T) {
	log := mustLog(t, []policyEvent{putEvent(3, "k0", "a"), putEvent(5, "k0", "b"), putEvent(7, "k1", "c")})
	put := record{In: kvInput{Op: opPut, Key: "k0", Write: "b"}, Out: kvOutput{Result: resOK, Value: "b", Revision: 5}, Call: 10, Return: 20}
	read := func(rev uint64, val string, call time.Duration) record {
		return record{In: kvInput{Op: opGet, Key: "k0"}, Out: kvOutput{Result: resOK, Value: val, Revision: rev}, Call: call, Return: call + 5}
	}
	tests := []struct {
		name string
		recs []record
		want int
	}{
		{"old revision after the acknowledgement", []record{put, read(3, "a", 25)}, 1},
		{"old revision while the write was open", []record{put, read(3, "a", 15)}, 0},
		{"new revision", []record{put, read(5, "b", 25)}, 0},
		{"another key's write", []record{{In: kvInput{Op: opPut, Key: "k1", Write: "c"}, Out: kvOutput{Result: resOK, Value: "c", Revision: 7}, Call: 1, Return: 2}, read(3, "a", 25)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := staleReads(tc.recs, log); len(got) != tc.want {
				t.Errorf("staleReads = %q, want %d", got, tc.want)
			}
		})
	}
}
