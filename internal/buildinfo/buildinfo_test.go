package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFromBuild: the stamp wins, then the module's version, then "dev"; the
// commit is the VCS revision or "unknown".
func TestFromBuild(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}}
	tests := []struct {
		name    string
		bi      *debug.BuildInfo
		stamped string
		want    Info
	}{
		{"no build information", nil, "", Info{Version: "dev", GoVersion: "unknown", Commit: "unknown"}},
		{"a devel build without VCS", &debug.BuildInfo{GoVersion: "go1.26", Main: debug.Module{Version: "(devel)"}}, "",
			Info{Version: "dev", GoVersion: "go1.26", Commit: "unknown"}},
		{"VCS stamping: the pseudo-version", &debug.BuildInfo{GoVersion: "go1.26", Main: debug.Module{Version: "v0.0.0-20261202-abc123"}, Settings: vcs}, "",
			Info{Version: "v0.0.0-20261202-abc123", GoVersion: "go1.26", Commit: "abc123"}},
		{"the linker stamp wins", &debug.BuildInfo{GoVersion: "go1.26", Main: debug.Module{Version: "v0.0.0-20261202-abc123"}, Settings: vcs}, "v1.2.3",
			Info{Version: "v1.2.3", GoVersion: "go1.26", Commit: "abc123"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, FromBuild(tc.bi, tc.stamped)); diff != "" {
				t.Errorf("FromBuild (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRead: the running binary reports what its own build information and
// stamp say, whether or not the toolchain stamped VCS information.
func TestRead(t *testing.T) {
	bi, _ := debug.ReadBuildInfo()
	if diff := cmp.Diff(FromBuild(bi, version), Read()); diff != "" {
		t.Errorf("Read (-build +read):\n%s", diff)
	}
}
