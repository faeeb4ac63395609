package main

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestCPUModel(t *testing.T) {
	in := "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n"
	if got := cpuModel([]byte(in)); got != "AMD EPYC 7B13" {
		t.Errorf("cpuModel = %q", got)
	}
	if got := cpuModel([]byte("processor : 0\n")); got != "" {
		t.Errorf("cpuModel without model name = %q, want empty", got)
	}
}

func TestCompareWrites(t *testing.T) {
	pd := []*writesFigure{
		{Scenario: "writes", Writers: 100, ValueSize: 4096, Writes: 3000, WritesPerS: 3000, P50Ms: 30, P99Ms: 90},
		{Scenario: "writes", Writers: 1, ValueSize: 4096, Writes: 200, WritesPerS: 200, P50Ms: 2.5, P99Ms: 9},
	}
	ed := []*writesFigure{
		{Scenario: "etcd", Writers: 100, ValueSize: 4096, Writes: 1000, WritesPerS: 1000, P50Ms: 80, P99Ms: 200},
		{Scenario: "etcd", Writers: 1, ValueSize: 4096, Writes: 300, WritesPerS: 300, P50Ms: 2, P99Ms: 5},
	}
	got := compareWrites(pd, ed, 100)
	if len(got) != 2 {
		t.Fatalf("got %d figures, want 2", len(got))
	}
	many, one := got[0], got[1]
	if many.ThroughputRatio != 3 || !many.TargetMet {
		t.Errorf("100 writers: ratio %v met %v, want 3 true", many.ThroughputRatio, many.TargetMet)
	}
	if one.P50Ratio != 1.25 || one.TargetMet {
		t.Errorf("1 writer: p50 ratio %v met %v, want 1.25 false", one.P50Ratio, one.TargetMet)
	}

	// p99 over 100 ms misses the target even at a high ratio; errors too.
	pd[0].P99Ms = 101
	if compareWrites(pd, ed, 100)[0].TargetMet {
		t.Error("p99 101 ms: target met")
	}
	pd[0].P99Ms, pd[0].Errors = 90, 1
	if compareWrites(pd, ed, 100)[0].TargetMet {
		t.Error("a write error: target met")
	}
	// Without etcd figures there is nothing to compare.
	if got := compareWrites(pd, nil, 100); len(got) != 0 {
		t.Errorf("no etcd: %d figures", len(got))
	}
	if ratio(1, 0) != 0 {
		t.Error("ratio(1, 0) != 0")
	}
}

func TestBuildAndWriteResults(t *testing.T) {
	figs := []figure{
		&writesFigure{Scenario: "writes", Writers: 1, WritesPerS: 10},
		&compareFigure{Scenario: "policyd-vs-etcd", Writers: 100, ValueSize: 4096, TargetMet: true, Target: "t"},
		&failoverFigure{Scenario: "failover", Rounds: 3, Target: "f"},
	}
	m := machineInfo{CPUModel: "cpu", CPUs: 2, GoVersion: "go1.x", OS: "linux/amd64"}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	doc, err := buildResults(m, "go run ./bench suite", start, 90*time.Second, figs, errors.New("failover: boom"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "latest.json")
	if err := writeResults(path, doc); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Machine   machineInfo      `json:"machine"`
		Started   string           `json:"started"`
		DurationS float64          `json:"duration_s"`
		Error     string           `json:"error"`
		Targets   []targetResult   `json:"targets"`
		Figures   []map[string]any `json:"figures"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("results are not JSON: %v\n%s", err, b)
	}
	if diff := cmp.Diff(m, got.Machine); diff != "" {
		t.Errorf("machine (-want +got):\n%s", diff)
	}
	if got.Started != "2026-01-02T03:04:05Z" || got.DurationS != 90 || got.Error != "failover: boom" {
		t.Errorf("started %q duration %v error %q", got.Started, got.DurationS, got.Error)
	}
	if len(got.Figures) != 3 || got.Figures[2]["scenario"] != "failover" {
		t.Errorf("figures = %v", got.Figures)
	}
	if len(got.Targets) != 2 || !got.Targets[0].Met || got.Targets[1].Met ||
		!strings.HasPrefix(got.Targets[1].Target, "failover: ") {
		t.Errorf("targets = %+v", got.Targets)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temp file left behind: %v", err)
	}
}

func TestSuiteSteps(t *testing.T) {
	c := suiteConfig{duration: 20 * time.Second, rounds: 3}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	names := func(steps []suiteStep) []string {
		var out []string
		for _, s := range steps {
			out = append(out, s.name)
		}
		return out
	}
	if diff := cmp.Diff([]string{"etcd", "propagation", "propagation-10k", "propagation-10k-pinned", "propagation-10k-simulated", "idle-memory", "idle-memory-conn", "failover", "rollout", "shadow", "authz"}, names(c.steps())); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	c.skip = "etcd, failover ,propagation-10k,propagation-10k-pinned,propagation-10k-simulated,idle-memory-conn,rollout,shadow,authz"
	if diff := cmp.Diff([]string{"propagation", "idle-memory"}, names(c.steps())); diff != "" {
		t.Errorf("steps with -skip (-want +got):\n%s", diff)
	}
	// Every step's arguments must parse and validate as its scenario's.
	c.skip = ""
	byName := map[string]scenario{}
	for _, sc := range scenarios() {
		byName[sc.name] = sc
	}
	args := map[string][]string{}
	for _, st := range c.steps() {
		args[st.name] = st.args
		_, pins, err := suiteRunner(byName[st.scenario], st.args, io.Discard)
		if err != nil {
			t.Errorf("step %s: %v", st.name, err)
		}
		if got := pins.node.String() + "/" + pins.load.String(); st.name == "propagation-10k-pinned" && got != "0/1" {
			t.Errorf("step %s: -node-cpus/-load-cpus %s, want 0/1", st.name, got)
		}
	}
	// The pinned step is the unpinned one plus the pinning, nothing else.
	if diff := cmp.Diff(append(args["propagation-10k"], "-node-cpus", "0", "-load-cpus", "1"), args["propagation-10k-pinned"]); diff != "" {
		t.Errorf("propagation-10k-pinned args (-want +got):\n%s", diff)
	}
	for _, bad := range []suiteConfig{
		{duration: 0, rounds: 3},
		{duration: time.Second, rounds: 0},
		{duration: time.Second, rounds: 1, skip: "writes"},
	} {
		if err := bad.validate(); err == nil {
			t.Errorf("validate(%+v) = nil", bad)
		}
	}
}
