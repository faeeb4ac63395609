//go:build linux

package chaos

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

var flagCheckDir = flag.String("chaos.check-dir", "", "TestRecheck: check a kept run directory again (its history.jsonl against its events.jsonl)")

// TestRecheck checks a kept run's history again, without running anything:
//
//	go test ./tests/chaos -run TestRecheck -v -timeout 60m -chaos.check-dir=/tmp/policyd-chaos-TestChaos-XXX -chaos.check-timeout=30m
func TestRecheck(t *testing.T) {
	dir := *flagCheckDir
	if dir == "" {
		t.Skip("no -chaos.check-dir")
	}
	recs := loadJSONL[record](t, filepath.Join(dir, "history.jsonl"))
	events := loadJSONL[policyEvent](t, filepath.Join(dir, "events.jsonl"))
	log, err := newWriteLog(events)
	if err != nil {
		t.Fatal(err)
	}
	totals := tally(recs, log)
	checkWrites(t, recs, log, totals)
	ops := operations(recs, log)
	t.Logf("operations: %d recorded, %d checked; %s", len(recs), len(ops), totals.byKind())
	t.Logf("writes: %d acknowledged, %d of unknown outcome (%d applied), lost %d, applied twice %d",
		totals.acked, totals.unknownWrites, totals.unknownApplied, totals.lost, totals.duplicated)
	unbounded := 0
	for _, op := range ops {
		if op.Return == math.MaxInt64 {
			unbounded++
			if unbounded <= 20 {
				t.Logf("  no known return: client %d at %v: %s", op.ClientId, time.Duration(op.Call), kvModel.DescribeOperation(op.Input, op.Output))
			}
		}
	}
	t.Logf("operations with no known return: %d", unbounded)
	// The longest-open operations are what make a search hard.
	wide := slices.Clone(ops)
	slices.SortFunc(wide, func(a, b porcupine.Operation) int { return cmp.Compare(b.Return-b.Call, a.Return-a.Call) })
	for _, op := range wide[:min(10, len(wide))] {
		t.Logf("  open %v: client %d at %v: %s", time.Duration(op.Return-op.Call), op.ClientId, time.Duration(op.Call), kvModel.DescribeOperation(op.Input, op.Output))
	}
	for _, s := range staleReads(recs, log) {
		t.Errorf("stale read: %s", s)
	}
	start := time.Now()
	res, _ := checkLinearizable(t, ops, *flagCheckTimeout)
	t.Logf("linearizability: %s (porcupine %v)", resultName(res), time.Since(start).Round(time.Millisecond))
	if res != porcupine.Ok {
		t.Errorf("history is %s", resultName(res))
	}
}

func loadJSONL[T any](t *testing.T, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(fmt.Errorf("read %s: %w", path, err))
	}
	return out
}

// checkLinearizable checks ops one key at a time, within timeout in all.
// porcupine checks a model's partitions concurrently, and on a long history
// five searches at once ran out of memory (a 20-minute run's 377,000
// operations grew past 15 GB in 6 minutes). It returns the first failing
// key's verdict and the information to visualise it.
func checkLinearizable(t *testing.T, ops []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	verdict := porcupine.Ok
	var info porcupine.LinearizationInfo
	for _, part := range kvModel.Partition(ops) {
		left := time.Until(deadline)
		if left <= 0 {
			return porcupine.Unknown, info
		}
		start := time.Now()
		res, inf := porcupine.CheckOperationsVerbose(kvModel, part, left)
		t.Logf("  key %s: %d operations, %s in %v", part[0].Input.(kvInput).Key, len(part), resultName(res), time.Since(start).Round(time.Millisecond))
		switch res {
		case porcupine.Illegal:
			return res, inf
		case porcupine.Unknown:
			verdict, info = res, inf
		}
	}
	return verdict, info
}
