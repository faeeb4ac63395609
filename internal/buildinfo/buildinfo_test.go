package buildinfo

import (
	"runtime"
	"testing"
)

// TestRead: a test binary carries no stamp and no module version, so the
// version falls back to "dev", and the Go version is the runtime's.
func TestRead(t *testing.T) {
	tests := []struct {
		name    string
		stamped string
		want    string
	}{
		{"not stamped", "", "dev"},
		{"stamped", "v1.2.3", "v1.2.3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old := version
			version = tc.stamped
			t.Cleanup(func() { version = old })
			in := Read()
			if in.Version != tc.want {
				t.Errorf("Version = %q, want %q", in.Version, tc.want)
			}
			if in.GoVersion != runtime.Version() {
				t.Errorf("GoVersion = %q, want %q", in.GoVersion, runtime.Version())
			}
			if in.Commit == "" {
				t.Error("Commit is empty, want a revision or \"unknown\"")
			}
		})
	}
}
