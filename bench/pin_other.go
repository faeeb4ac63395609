//go:build !linux

package main

import "errors"

// errNoPinning: bench pins with Linux's sched_setaffinity and taskset.
var errNoPinning = errors.New("CPU pinning is implemented on Linux only")

// allowedCPUs is not implemented outside Linux.
func allowedCPUs() ([]int, error) { return nil, errNoPinning }

// pinProcess is not implemented outside Linux.
func pinProcess([]int) (func() error, error) { return nil, errNoPinning }
