package e2e

import (
	"context"
	debugbuildinfo "debug/buildinfo"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/internal/buildinfo"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// builtInfo is what the binary at path must report: its build information
// as the toolchain recorded it, with stamped as the version its -ldflags
// stamped ("" for none). The toolchain does not record -ldflags under
// -trimpath, so the caller says what it stamped.
func builtInfo(t *testing.T, path, stamped string) buildinfo.Info {
	t.Helper()
	bi, err := debugbuildinfo.ReadFile(path)
	if err != nil {
		t.Fatalf("read the build information of %s: %v", path, err)
	}
	return buildinfo.FromBuild(bi, stamped)
}

// TestBuildVersionAgrees builds the binary as the tests do (go build) and as
// a user does (make build), and checks that `policyd version`, GET
// /v1/version and policyd_build_info all report what the build carries;
// make build's version is git describe's.
func TestBuildVersionAgrees(t *testing.T) {
	made := filepath.Join(t.TempDir(), "policyd")
	if out, err := exec.Command("make", "-C", repoRoot, "build", "BIN="+made).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	// The Makefile stamps git describe's version, or "dev" outside a git
	// checkout.
	described := "dev"
	if out, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output(); err == nil {
		described = strings.TrimSpace(string(out))
	}
	for _, tc := range []struct{ name, bin, stamped string }{
		{"go build", policydBinary(t), ""},
		{"make build", made, described},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := builtInfo(t, tc.bin, tc.stamped)
			dir := t.TempDir()
			d := startBinary(t, tc.bin, dir, nil, "--data-dir", filepath.Join(dir, "data"), "--node-id", "n1", "--bootstrap",
				"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0")
			base := "http://" + daemonHTTPAddr(t, d)
			waitReady(t, base)

			series := scrape(t, base+"/metrics")["policyd_build_info"]
			if len(series) != 1 {
				t.Fatalf("policyd_build_info has %d series, want 1", len(series))
			}
			got := map[string]buildinfo.Info{
				"policyd_build_info": {Version: series[0]["version"], GoVersion: series[0]["goversion"], Commit: series[0]["commit"]},
			}

			resp, err := http.Get(base + "/v1/version") //nolint:noctx // a test against a local daemon
			if err != nil {
				t.Fatal(err)
			}
			var api buildinfo.Info
			err = json.NewDecoder(resp.Body).Decode(&api)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("GET /v1/version: %v", err)
			}
			got["GET /v1/version"] = api

			// The CLI asks every member at the HTTP address it registered,
			// which a new node does shortly after it is ready.
			var out []byte
			if poll.Until(context.Background(), 10*time.Second, poll.Holds(func() bool {
				cmd := exec.CommandContext(context.Background(), tc.bin, "version", "-o", "json", "--server", base)
				cmd.Env = servertest.CleanEnv()
				out, err = cmd.Output()
				return err == nil
			})) !=
				nil {
				t.Fatalf("policyd version: %v\n%s", err, out)
			}
			var rep struct {
				Client  buildinfo.Info `json:"client"`
				Servers []struct {
					Build *buildinfo.Info `json:"build"`
				} `json:"servers"`
			}
			if err := json.Unmarshal(out, &rep); err != nil || len(rep.Servers) != 1 || rep.Servers[0].Build == nil {
				t.Fatalf("policyd version -o json: %s (%v)", out, err)
			}
			got["policyd version (client)"], got["policyd version (server)"] = rep.Client, *rep.Servers[0].Build

			for where, info := range got {
				if diff := cmp.Diff(want, info); diff != "" {
					t.Errorf("%s differs from the build (-build +reported):\n%s", where, diff)
				}
			}
			d.interrupt(t)
		})
	}
}
