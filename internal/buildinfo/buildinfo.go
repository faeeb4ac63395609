// Package buildinfo is the running binary's version, Go version and commit,
// read in one place so that `policyd version`, GET /v1/version and the
// build-info metrics all show the same three.
package buildinfo

import "runtime/debug"

// version is stamped at build time (the Makefile's
// -ldflags "-X github.com/policyd/policyd/internal/buildinfo.version=..."). A linker
// stamp is the one way to carry it; nothing writes it at run time.
var version = ""

// Info is one binary's build.
type Info struct {
	Version   string `json:"version"`
	GoVersion string `json:"goversion"`
	Commit    string `json:"commit"`
}

// Read returns the running binary's build (see FromBuild).
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return FromBuild(bi, version)
}

// FromBuild is the Info of a binary with build information bi (nil: none)
// and linker stamp stamped: the stamped version, else the module's, else
// "dev"; the Go version; and the VCS commit, "unknown" when the build
// recorded none (a build outside a git checkout, or -buildvcs=false).
// Tests read a built binary's bi with debug/buildinfo to know what it must
// report.
func FromBuild(bi *debug.BuildInfo, stamped string) Info {
	in := Info{Version: stamped, GoVersion: "unknown", Commit: "unknown"}
	if bi != nil {
		in.GoVersion = bi.GoVersion
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				in.Commit = s.Value
			}
		}
	}
	if in.Version == "" {
		in.Version = "dev"
	}
	return in
}
