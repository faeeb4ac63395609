package main

import (
	"fmt"
	"os"
	"syscall"
)

// procAttr puts a node in its own process group, so that a terminal's
// Ctrl-C reaches only bench (which then stops the nodes in order), and asks
// the kernel to SIGKILL the node if bench itself dies without cleaning up.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup sends sig to p's process group (see procAttr).
func signalGroup(p *os.Process, sig syscall.Signal) error {
	if err := syscall.Kill(-p.Pid, sig); err != nil {
		return fmt.Errorf("signal process group %d: %w", p.Pid, err)
	}
	return nil
}

// raiseFileLimit raises the soft RLIMIT_NOFILE to the hard limit and returns
// the new soft limit: each writer holds a connection. The nodes, started
// afterwards, inherit the raised limit.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Cur == lim.Max {
		return lim.Cur, nil
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("setrlimit(%d): %w", lim.Max, err)
	}
	return lim.Cur, nil
}
