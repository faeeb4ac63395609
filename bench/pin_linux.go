package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// allowedCPUs returns the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	return cpusOf(&set), nil
}

// cpusOf lists the CPUs in set, ascending.
func cpusOf(set *unix.CPUSet) []int {
	var cpus []int
	for c := 0; c <= maxCPU; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// pinProcess sets the affinity of every thread of this process to cpus and
// returns a function that gives every thread the affinity the calling
// thread had before. Threads the runtime starts later inherit the affinity
// of the thread that starts them.
func pinProcess(cpus []int) (restore func() error, err error) {
	var before, pinned unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	for _, c := range cpus {
		pinned.Set(c)
	}
	if err := setThreadsAffinity(&pinned); err != nil {
		return nil, errors.Join(err, setThreadsAffinity(&before))
	}
	return func() error { return setThreadsAffinity(&before) }, nil
}

// setThreadsAffinity sets the affinity of every thread in /proc/self/task,
// listing them again until a pass finds none it has not set: a thread that
// still had the old affinity may have started another meanwhile.
func setThreadsAffinity(set *unix.CPUSet) error {
	done := map[int]bool{}
	for {
		entries, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("list threads: %w", err)
		}
		fresh := 0
		for _, e := range entries {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh++
			// ESRCH: the thread ended after the listing.
			if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("sched_setaffinity(thread %d): %w", tid, err)
			}
			done[tid] = true
		}
		if fresh == 0 {
			return nil
		}
	}
}
