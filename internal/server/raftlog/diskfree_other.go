//go:build !unix

package raftlog

// diskFree is not known here: the message then leaves the free space out.
func diskFree(string) (uint64, bool) { return 0, false }
