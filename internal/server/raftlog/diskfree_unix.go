//go:build unix

package raftlog

import "syscall"

// diskFree is the space an unprivileged writer has left on dir's file
// system.
func diskFree(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true //nolint:gosec,unconvert // Bsize is positive; its type differs by OS
}
