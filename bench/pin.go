package main

import (
	"errors"
	"flag"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// maxCPU bounds the CPU numbers a list may name: the kernel's affinity mask
// that bench reads and writes holds 1,024 CPUs.
const maxCPU = 1023

// cpuList is a taskset-style CPU list ("1", "0-2,5") given to -node-cpus or
// -load-cpus; the zero value means not pinned.
type cpuList struct {
	cpus []int // sorted, distinct
}

// parseCPUList parses comma-separated CPU numbers and ranges (lo-hi).
func parseCPUList(s string) (cpuList, error) {
	if s == "" {
		return cpuList{}, errors.New("empty CPU list")
	}
	num := func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxCPU || v != strconv.Itoa(n) {
			return 0, fmt.Errorf("%q is not a CPU number (0 to %d)", v, maxCPU)
		}
		return n, nil
	}
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		loText, hiText, isRange := strings.Cut(part, "-")
		lo, err := num(loText)
		if err != nil {
			return cpuList{}, fmt.Errorf("CPU list %q: %w", s, err)
		}
		hi := lo
		if isRange {
			if hi, err = num(hiText); err != nil {
				return cpuList{}, fmt.Errorf("CPU list %q: %w", s, err)
			}
			if hi < lo {
				return cpuList{}, fmt.Errorf("CPU list %q: range %s ends before it starts", s, part)
			}
		}
		for c := lo; c <= hi; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return cpuList{cpus: slices.Compact(cpus)}, nil
}

// String is the list in the kernel's canonical form (as Cpus_allowed_list
// in /proc/<pid>/status shows it): ascending, runs as ranges.
func (l *cpuList) String() string { return formatCPUs(l.cpus) }

// Set parses a flag value.
func (l *cpuList) Set(s string) error {
	parsed, err := parseCPUList(s)
	if err != nil {
		return err
	}
	*l = parsed
	return nil
}

// isSet reports whether the list names any CPU.
func (l *cpuList) isSet() bool { return len(l.cpus) > 0 }

// formatCPUs writes ascending, distinct CPU numbers as a CPU list.
func formatCPUs(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, strconv.Itoa(cpus[i])+"-"+strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// pinFlags are -node-cpus and -load-cpus: every scenario accepts them, and so
// does a suite step (its args).
type pinFlags struct {
	node cpuList
	load cpuList
}

func (p *pinFlags) register(fs *flag.FlagSet) {
	fs.Var(&p.node, "node-cpus", "pin every node bench starts (policyd, and etcd in the etcd scenario) to this CPU\n"+
		"list, e.g. 0 or 0-1,3 (taskset -c; needs util-linux's taskset); default: not pinned")
	fs.Var(&p.load, "load-cpus", "pin bench itself, the load generator (all its threads, so every in-process\n"+
		"sidecar and writer), to this CPU list, e.g. 1; nodes without -node-cpus keep the CPUs\n"+
		"bench started with; default: not pinned")
}

// check refuses CPUs outside allowed (the CPUs bench was started with, or
// allowedErr when they could not be read) and a -node-cpus without taskset.
func (p *pinFlags) check(allowed []int, allowedErr error) error {
	if !p.node.isSet() && !p.load.isSet() {
		return nil
	}
	if allowedErr != nil {
		return fmt.Errorf("-node-cpus/-load-cpus: %w", allowedErr)
	}
	var errs []error
	for _, f := range []struct {
		name string
		list *cpuList
	}{{"-node-cpus", &p.node}, {"-load-cpus", &p.load}} {
		var missing []int
		for _, c := range f.list.cpus {
			if !slices.Contains(allowed, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			errs = append(errs, fmt.Errorf("%s %s: CPU(s) %s do not exist or are not available to bench (it may use CPUs %s)",
				f.name, f.list, formatCPUs(missing), formatCPUs(allowed)))
		}
	}
	if p.node.isSet() {
		if _, err := exec.LookPath("taskset"); err != nil {
			errs = append(errs, fmt.Errorf("-node-cpus needs taskset (util-linux) on PATH: %w", err))
		}
	}
	return errors.Join(errs...)
}

// applyPins checks p against env's CPUs, records the pinning in env (which
// the nodes it starts and its figures then carry) and pins bench's own
// threads for -load-cpus. restore gives bench back the CPUs it had; call it
// once the run that p configures is over.
func applyPins(env *runEnv, p pinFlags) (restore func() error, err error) {
	if err := p.check(env.allowedCPUs, env.allowedErr); err != nil {
		return nil, err
	}
	if p.node.isSet() {
		env.nodeCPUs = p.node.String()
	}
	if !p.load.isSet() {
		return func() error { return nil }, nil
	}
	if env.nodeCPUs == "" {
		// A child inherits the affinity of the thread that forks it: left
		// alone, the nodes would share the load generator's CPUs.
		env.nodeCPUs = formatCPUs(env.allowedCPUs)
	}
	if restore, err = pinProcess(p.load.cpus); err != nil {
		return nil, fmt.Errorf("-load-cpus %s: %w", &p.load, err)
	}
	env.loadCPUs = p.load.String()
	env.logf("pinned: bench (the load generator) to CPU(s) %s, the nodes to CPU(s) %s", env.loadCPUs, env.nodeCPUs)
	return restore, nil
}
