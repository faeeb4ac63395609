//go:build !linux

package main

import (
	"errors"
	"os"
	"syscall"
)

// procAttr is a no-op outside Linux: bench targets Linux (process groups and
// parent-death signals); elsewhere the nodes are signalled individually.
func procAttr() *syscall.SysProcAttr { return nil }

// signalGroup signals p itself outside Linux.
func signalGroup(p *os.Process, sig syscall.Signal) error { return p.Signal(sig) }

// raiseFileLimit is not implemented outside Linux; the limit stays as it is.
func raiseFileLimit() (uint64, error) {
	return 0, errors.New("not implemented on this platform")
}
