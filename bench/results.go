package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// results is the document -results writes (bench/results/latest.json for
// `make bench`): the machine, every figure in order, and the issue targets
// the figures carry, so that docs/performance.md's table can be checked
// against it.
type results struct {
	Machine   machineInfo       `json:"machine"`
	Command   string            `json:"command"`
	Started   string            `json:"started"` // RFC 3339, UTC
	DurationS float64           `json:"duration_s"`
	Error     string            `json:"error,omitempty"` // the run failed: the figures are partial
	Targets   []targetResult    `json:"targets"`
	Figures   []json.RawMessage `json:"figures"`
}

// machineInfo is where the figures were measured. Only figures of one run
// compare: the nodes, the load generator and etcd share these CPUs.
type machineInfo struct {
	CPUModel  string `json:"cpu_model"`
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Kernel    string `json:"kernel,omitempty"`
	GitCommit string `json:"git_commit,omitempty"`
	GitDirty  bool   `json:"git_dirty"`
	// LoadAvg is /proc/loadavg when the run started: anything well above
	// 0 means other work shared the CPUs.
	LoadAvg string `json:"load_avg_at_start,omitempty"`
	// NodeCPUs and LoadCPUs are the run's -node-cpus and -load-cpus: the
	// CPUs the nodes and bench were pinned to ("": shared). A suite step
	// pinned on its own says so in its figures instead.
	NodeCPUs string `json:"node_cpus,omitempty"`
	LoadCPUs string `json:"load_cpus,omitempty"`
}

// targetResult is one issue target as a figure measured it.
type targetResult struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// targeted is a figure that is held to issue targets.
type targeted interface {
	targets() []targetResult
}

// collectMachine describes this machine; what cannot be read is left empty.
func collectMachine(ctx context.Context, root string) machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPUModel = cpuModel(b)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.TrimSpace(string(b))
	}
	git := func(args ...string) (string, bool) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err == nil
	}
	if c, ok := git("rev-parse", "HEAD"); ok {
		m.GitCommit = c
		if st, ok := git("status", "--porcelain", "--untracked-files=no"); ok {
			m.GitDirty = st != ""
		}
	}
	return m
}

// cpuModel returns the first "model name" of a /proc/cpuinfo.
func cpuModel(cpuinfo []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// buildResults assembles the document from the figures of a run.
func buildResults(m machineInfo, command string, started time.Time, elapsed time.Duration, figs []figure, runErr error) (*results, error) {
	r := &results{Machine: m, Command: command, Started: started.UTC().Format(time.RFC3339),
		DurationS: round2(elapsed.Seconds()), Targets: []targetResult{}, Figures: []json.RawMessage{}}
	if runErr != nil {
		r.Error = runErr.Error()
	}
	for _, f := range figs {
		b, err := json.Marshal(f)
		if err != nil {
			return nil, fmt.Errorf("encode figure: %w", err)
		}
		r.Figures = append(r.Figures, b)
		if t, ok := f.(targeted); ok {
			r.Targets = append(r.Targets, t.targets()...)
		}
	}
	return r, nil
}

// writeResults writes r to path as indented JSON, through a temp file, so
// that an interrupted write leaves the previous results in place.
func writeResults(path string, r *results) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("-results: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("-results: %w", err)
	}
	return nil
}

func (f *compareFigure) targets() []targetResult {
	m := fmt.Sprintf("%g writes/s vs etcd %g (×%g), p99 %g ms", f.PolicydWritesPerS, f.EtcdWritesPerS, f.ThroughputRatio, f.PolicydP99Ms)
	if f.Writers == 1 {
		m = fmt.Sprintf("p50 %g ms vs etcd %g ms", f.PolicydP50Ms, f.EtcdP50Ms)
	}
	return []targetResult{{Target: fmt.Sprintf("writes, %d B, %d writer(s): %s", f.ValueSize, f.Writers, f.Target), Measured: m, Met: f.TargetMet}}
}

func (f *failoverFigure) targets() []targetResult {
	return []targetResult{{
		Target: "failover: " + f.Target,
		Measured: fmt.Sprintf("%d rounds: new leader max %g ms, all current max %g ms, %d lost of %d acknowledged",
			f.Rounds, f.NewLeaderMaxMs, f.AllCurrentMaxMs, f.LostWrites, f.Acked),
		Met: f.TargetMet,
	}}
}

func (f *propagationFigure) targets() []targetResult {
	return []targetResult{{
		Target: fmt.Sprintf("propagation %s (measured: %d %s conns on %d node(s)%s): %s",
			f.Transport, f.Conns, f.Sidecars, f.Nodes, f.pinning(), f.Target),
		Measured: fmt.Sprintf("p99 %g ms, %d of %d writes complete", f.P99Ms, f.Complete, f.Writes),
		Met:      f.TargetMet,
	}}
}

func (f *idleMemFigure) targets() []targetResult {
	return []targetResult{{
		Target: fmt.Sprintf("idle memory per %s connection ≤ %d KiB", f.Transport, f.TargetBytes>>10),
		Measured: fmt.Sprintf("RSS %.1f KiB, heap+stack %.1f KiB (%d conns, %d per TCP connection)", float64(f.RSSPerConn)/1024,
			float64(f.HeapInusePerConn+f.StackPerConn)/1024, f.Conns, max(f.StreamsPerConn, 1)),
		Met: f.TargetMetRSS,
	}}
}
