package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// suiteConfig holds the suite scenario's flags.
type suiteConfig struct {
	duration time.Duration
	rounds   int
	etcdBin  string
	skip     string
}

// suiteStep is one scenario of the suite with its arguments. name is what
// -skip and the log call it; scenario is the scenario it runs.
type suiteStep struct {
	name     string
	scenario string
	args     []string
}

// suiteScenario runs the standard set, each scenario with its own cluster
// (and temp subdirectory), one after the other: writes with -writers and 1
// writer against policyd and then etcd (the etcd scenario), propagation
// with 1,000 gRPC streams and 1,000 WebSocket connections on 3 nodes, the
// same with 10,000 of each on one node (the mixed propagation target; it
// needs an open-files limit of about 10,500 for bench and for the node),
// with SDK sidecars, again with the node and bench pinned to a CPU each and
// then with simulated sidecars, idle-memory with
// 1,000 of each on one node (100 gRPC streams per connection) and again
// with 1,000 gRPC streams that have a connection each, failover, a staged
// rollout's halt and rollback with 1,000 + 1,000 SDK sidecars, one round
// of the shadow reports' cost with 1,000 SDK sidecars, and the authz
// sidecar's decisions. It is sized to finish in well under 10
// minutes on a 2-core machine (about 5 minutes).
// A failing step does not stop the others; the run fails at the end.
func suiteScenario() scenario {
	return scenario{
		name:    "suite",
		summary: "the standard set: etcd (writes 100 + 1 writer, both systems), propagation 1k+1k and 10k+10k (SDK sidecars; 10k+10k also pinned and simulated), idle-memory (100 and 1 stream per connection), failover, rollout, shadow, authz",
		setup: func(fs *flag.FlagSet) runner {
			c := &suiteConfig{}
			fs.DurationVar(&c.duration, "duration", 20*time.Second, "measured time of each writes run (policyd and etcd, 100 and 1 writer)")
			fs.IntVar(&c.rounds, "rounds", 3, "failover rounds")
			fs.StringVar(&c.etcdBin, "etcd-bin", "", "etcd binary; empty: the one hack/kube-bins.sh builds")
			fs.StringVar(&c.skip, "skip", "", "comma-separated steps to leave out (etcd, propagation, propagation-10k,\npropagation-10k-pinned, propagation-10k-simulated, idle-memory, idle-memory-conn, failover, rollout, shadow, authz)")
			return c
		},
	}
}

func (c *suiteConfig) validate() error {
	var errs []error
	if c.duration <= 0 {
		errs = append(errs, fmt.Errorf("-duration must be positive, got %v", c.duration))
	}
	if c.rounds < 1 {
		errs = append(errs, fmt.Errorf("-rounds must be at least 1, got %d", c.rounds))
	}
	var known []string
	for _, st := range c.all() {
		known = append(known, st.name)
	}
	for _, s := range c.skipped() {
		if !slices.Contains(known, s) {
			errs = append(errs, fmt.Errorf("-skip: unknown step %q (want some of %s)", s, strings.Join(known, ", ")))
		}
	}
	return errors.Join(errs...)
}

// all is the standard set.
func (c *suiteConfig) all() []suiteStep {
	etcdArgs := []string{"-writers", "100", "-duration", c.duration.String()}
	if c.etcdBin != "" {
		etcdArgs = append(etcdArgs, "-etcd-bin", c.etcdBin)
	}
	return []suiteStep{
		{"etcd", "etcd", etcdArgs},
		// Propagation runs through the client SDK, as the issue asks: every
		// message decoded in full and compiled, as in a real sidecar. At
		// 1k + 1k each gRPC sidecar has its own connection, as a real one;
		// at 10k + 10k one node cannot hold 20,000 connections under this
		// machine's 20,000-descriptor limit, so gRPC sidecars share a
		// connection per 100 (client.Config.GRPCConn).
		{"propagation", "propagation", []string{"-streams", "1000", "-ws", "1000", "-nodes", "3", "-writes", "50", "-streams-per-conn", "1"}},
		{"propagation-10k", "propagation", []string{"-streams", "10000", "-ws", "10000", "-nodes", "1", "-writes", "20"}},
		// The same with the node on CPU 0 and bench on CPU 1: a
		// figure that neither side's bursts can blur by taking the other's
		// core. Next to propagation-10k, so the summary shows their p99s
		// one above the other.
		{"propagation-10k-pinned", "propagation", []string{"-streams", "10000", "-ws", "10000", "-nodes", "1", "-writes", "20",
			"-node-cpus", "0", "-load-cpus", "1"}},
		// The same with bench's lighter simulated sidecars: what the node
		// does when the load generator leaves it more of the shared CPUs.
		{"propagation-10k-simulated", "propagation", []string{"-streams", "10000", "-ws", "10000", "-nodes", "1", "-writes", "20", "-sdk=false"}},
		{"idle-memory", "idle-memory", []string{"-streams", "1000", "-ws", "1000"}},
		// Real sidecars have a connection each, which costs the node
		// grpc-go's per-connection goroutines and buffers on top of the
		// stream's: the harder case for the 48 KB target.
		{"idle-memory-conn", "idle-memory", []string{"-streams", "1000", "-ws", "0", "-streams-per-conn", "1"}},
		{"failover", "failover", []string{"-rounds", strconv.Itoa(c.rounds), "-writers", "20", "-grpc", "200", "-ws", "200"}},
		// 3 rollouts that 1,000 + 1,000 SDK sidecars reject,
		// halted and rolled back (about 5 s).
		{"rollout", "rollout", nil},
		// The node's CPU per 1,000 shadow reports of 1,000 SDK
		// sidecars; one round of the scenario's five (about 35 s): enough
		// to check that no report is rejected and the counts add up, but
		// one round's figure is noisy (35–160 ms per 1,000 reports where
		// five rounds' medians were 70–90 ms).
		{"shadow", "shadow", []string{"-rounds", "1"}},
		// About 40 s: the sidecar pinned to CPU 1 (its own -authz-cpus
		// default), bench on the other.
		{"authz", "authz", nil},
	}
}

// steps is the standard set, minus -skip.
func (c *suiteConfig) steps() []suiteStep {
	skip := c.skipped()
	var out []suiteStep
	for _, st := range c.all() {
		if !slices.Contains(skip, st.name) {
			out = append(out, st)
		}
	}
	return out
}

// skipped is the step names -skip lists, spaces around them trimmed.
func (c *suiteConfig) skipped() []string {
	var out []string
	for s := range strings.SplitSeq(c.skip, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (c *suiteConfig) run(ctx context.Context, env *runEnv) error {
	byName := map[string]scenario{}
	for _, sc := range scenarios() {
		byName[sc.name] = sc
	}
	var errs []error
	for _, st := range c.steps() {
		if ctx.Err() != nil {
			return errors.Join(append(errs, ctx.Err())...)
		}
		r, pins, err := suiteRunner(byName[st.scenario], st.args, env.stderr)
		if err != nil {
			return err // a bug in steps, not a measurement
		}
		sub := *env
		sub.workDir = filepath.Join(env.workDir, st.name)
		if err := os.MkdirAll(sub.workDir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", sub.workDir, err)
		}
		start := time.Now()
		env.logf("suite: %s %s", st.name, strings.Join(st.args, " "))
		// A machine without the step's CPUs fails the step, not the suite.
		unpin, err := applyPins(&sub, pins)
		if err != nil {
			env.logf("suite: %s failed: %v", st.name, err)
			errs = append(errs, fmt.Errorf("%s: %w", st.name, err))
			continue
		}
		err = r.run(ctx, &sub)
		if uerr := unpin(); uerr != nil {
			// The later steps would run pinned.
			return errors.Join(append(errs, fmt.Errorf("%s: unpin bench: %w", st.name, uerr))...)
		}
		if err != nil {
			env.logf("suite: %s failed after %v: %v", st.name, time.Since(start).Round(time.Second), err)
			errs = append(errs, fmt.Errorf("%s: %w", st.name, err))
			continue
		}
		env.logf("suite: %s done in %v", st.name, time.Since(start).Round(time.Second))
	}
	return errors.Join(errs...)
}

// suiteRunner configures sc from args, as the command line would, and
// returns the step's -node-cpus and -load-cpus too.
func suiteRunner(sc scenario, args []string, stderr io.Writer) (runner, pinFlags, error) {
	fs := flag.NewFlagSet(sc.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	r := sc.setup(fs)
	var pins pinFlags
	pins.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, pinFlags{}, fmt.Errorf("suite step %s: %w", sc.name, err)
	}
	if err := r.validate(); err != nil {
		return nil, pinFlags{}, fmt.Errorf("suite step %s: %w", sc.name, err)
	}
	return r, pins, nil
}
