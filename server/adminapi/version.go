package adminapi

import (
	"net/http"
	"runtime/debug"
)

// VersionInfo is GET /v1/version: the build of the serving node.
type VersionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goversion"`
	Commit    string `json:"commit"`
}

// Build reads the running binary's module version, Go version and VCS
// commit from its embedded build info; "unknown" where it has none.
func Build() VersionInfo {
	v := VersionInfo{Version: "unknown", GoVersion: "unknown", Commit: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.GoVersion = bi.GoVersion
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			v.Commit = s.Value
		}
	}
	return v
}

func (a *API) version(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, Build())
	return nil
}
