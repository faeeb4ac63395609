package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/policyd/policyd/internal/decisions"
	"github.com/policyd/policyd/internal/impact"
	"github.com/policyd/policyd/internal/impact/impactload"
)

// impactTarget is the target for a replay of 1M records on one core.
const impactTarget = 60 * time.Second

// impactConfig holds the impact scenario's flags.
type impactConfig struct {
	records int
	procs   int
}

// impactScenario measures an impact replay as a node runs it, in process:
// -records records of the impactload workload are written to a decision
// store in the temp dir, then replayed from it under the workload's change
// set with GOMAXPROCS set to -procs, scan and decode included. No cluster
// is started: the replay reads only the node's own store.
func impactScenario() scenario {
	return scenario{
		name:    "impact",
		summary: "an impact replay of a node's decision log (1M records, one core): scan, decode, evaluate twice, count",
		setup: func(fs *flag.FlagSet) runner {
			c := &impactConfig{}
			fs.IntVar(&c.records, "records", 1_000_000, "decision records written, then replayed")
			fs.IntVar(&c.procs, "procs", 1, "GOMAXPROCS during the replay")
			return c
		},
	}
}

func (c *impactConfig) validate() error {
	var errs []error
	if c.records < 1 {
		errs = append(errs, fmt.Errorf("-records must be at least 1, got %d", c.records))
	}
	if c.procs < 1 {
		errs = append(errs, fmt.Errorf("-procs must be at least 1, got %d", c.procs))
	}
	return errors.Join(errs...)
}

func (c *impactConfig) run(ctx context.Context, env *runEnv) error {
	st, err := decisions.Open(filepath.Join(env.workDir, "decisions"), decisions.Config{FlushInterval: -1}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer st.Close()
	f := &impactFigure{Scenario: "impact", Records: c.records, Procs: c.procs}
	// Within the store's default retention, so nothing is pruned.
	start := time.Now().Add(-time.Hour)
	began := time.Now()
	batch := make([]decisions.Record, 0, decisions.MaxBatchRecords)
	for i := range c.records {
		batch = append(batch, decisions.Record{Time: start.Add(time.Duration(i) * time.Millisecond), Data: impactload.Record(i, start)})
		if len(batch) == cap(batch) || i == c.records-1 {
			if err := st.Append(batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
		if i%100_000 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if err := st.Sync(); err != nil {
		return err
	}
	f.WriteS = round2(time.Since(began).Seconds())
	env.logf("impact: %d records written in %.1f s; replaying on %d core(s)", c.records, f.WriteS, c.procs)

	prev := runtime.GOMAXPROCS(c.procs)
	defer runtime.GOMAXPROCS(prev)
	runtime.GC() // the writes' garbage is not the replay's
	cpu0, err := procCPU("self")
	if err != nil {
		return err
	}
	began = time.Now()
	scan := func(yield func([]byte) bool) error {
		return st.Scan(time.Time{}, time.Time{}, func(r decisions.Record) bool { return yield(r.Data) })
	}
	resp, err := impact.Replay(ctx, impact.Options{NodeID: "bench"}, scan, impactload.Sets)
	elapsed := time.Since(began)
	if err != nil {
		return err
	}
	cpu1, err := procCPU("self")
	if err != nil {
		return err
	}
	if resp.CutOff {
		return fmt.Errorf("replay cut off after %d records", resp.Scanned)
	}
	if resp.Scanned != uint64(c.records) {
		return fmt.Errorf("replay scanned %d of %d records", resp.Scanned, c.records)
	}
	f.ReplayS = round2(elapsed.Seconds())
	f.CPUS = round2((cpu1 - cpu0).Seconds())
	f.NsPerRecord = elapsed.Nanoseconds() / int64(c.records)
	for _, t := range resp.Teams {
		f.Evaluated += t.Evaluated
		f.AllowToDeny += t.AllowToDeny
		f.DenyToAllow += t.DenyToAllow
		f.Errors += t.Errors
	}
	f.Unrecorded = resp.Unrecorded
	if c.records == 1_000_000 && c.procs == 1 {
		f.Target = "< " + impactTarget.String()
		f.TargetMet = elapsed < impactTarget
	}
	return env.emit(f)
}

// impactFigure is one replay.
type impactFigure struct {
	Scenario string `json:"scenario"`
	Records  int    `json:"records"`
	Procs    int    `json:"procs"`
	// WriteS is how long writing the records to the store took (not the
	// figure; the replay's input).
	WriteS      float64 `json:"write_s"`
	ReplayS     float64 `json:"replay_s"`
	CPUS        float64 `json:"cpu_s"`
	NsPerRecord int64   `json:"ns_per_record"`
	Evaluated   uint64  `json:"evaluated"`
	AllowToDeny uint64  `json:"allow_to_deny"`
	DenyToAllow uint64  `json:"deny_to_allow"`
	Errors      uint64  `json:"errors"`
	Unrecorded  uint64  `json:"unrecorded"`
	// Target: 1M records on one core.
	Target    string `json:"target,omitempty"`
	TargetMet bool   `json:"target_met,omitempty"`
}

func (f *impactFigure) columns() []string {
	return []string{"scenario", "records", "procs", "replay s", "cpu s", "ns/record", "evaluated", "allow→deny", "deny→allow", "errors", "target"}
}

func (f *impactFigure) row() []string {
	u := func(n uint64) string { return strconv.FormatUint(n, 10) }
	fl := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	target := "-"
	if f.Target != "" {
		target = "no"
		if f.TargetMet {
			target = "yes"
		}
	}
	return []string{f.Scenario, strconv.Itoa(f.Records), strconv.Itoa(f.Procs), fl(f.ReplayS), fl(f.CPUS),
		strconv.FormatInt(f.NsPerRecord, 10), u(f.Evaluated), u(f.AllowToDeny), u(f.DenyToAllow), u(f.Errors), target}
}

func (f *impactFigure) targets() []targetResult {
	if f.Target == "" {
		return nil
	}
	return []targetResult{{
		Target:   "impact replay of 1,000,000 logged decisions on one core (GOMAXPROCS=1): " + f.Target,
		Measured: fmt.Sprintf("%g s (%d ns/record, %g CPU-s)", f.ReplayS, f.NsPerRecord, f.CPUS),
		Met:      f.TargetMet,
	}}
}
