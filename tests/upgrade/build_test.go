//go:build linux

package upgrade

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// releaseCommit is the last landed release, the binary a cluster is upgraded
// from. Move it to each release's commit when that release lands.
const releaseCommit = "43b5d7e4de54116370aa737150e4ed8d42ea86cc" // one node ID check: config.ValidNodeID

// releaseVersion is the command version releaseCommit reads.
const releaseVersion = 1

// typedCommit is the last commit of command version 2 (typed payloads,
// no audit fields in the envelope): its nodes drop the actor unread, so an
// upgrade from it checks that no replica records what another dropped.
const typedCommit = "b3273734b7872a2a91378017c6137447faebe1bf" // docs: the stored-form fast path went with the policy heads

// binaries are the two policyd builds under test.
type binaries struct {
	old, new string
}

// buildBinaries builds the release from git and the working tree, both
// static and trimmed as `make build` does.
func buildBinaries(t *testing.T, releaseCommit string) binaries {
	t.Helper()
	root, err := run("", "git", "rev-parse", "--show-toplevel")
	if err != nil {
		t.Fatalf("the upgrade test builds the release %s from git, and needs this tree's git repository: %v", releaseCommit, err)
	}
	if _, err := run(root, "git", "rev-parse", "--verify", "--quiet", releaseCommit+"^{commit}"); err != nil {
		t.Fatalf("release commit %s is not in the repository at %s (a shallow clone? run git fetch --unshallow): %v",
			releaseCommit, root, err)
	}
	start := time.Now()
	dir := t.TempDir()
	src := filepath.Join(dir, "release-src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := extract(root, releaseCommit, src); err != nil {
		t.Fatal(err)
	}
	bins := binaries{old: filepath.Join(dir, "old", "policyd"), new: filepath.Join(dir, "new", "policyd")}
	if err := goBuild(src, bins.old); err != nil {
		t.Fatalf("build release %s: %v", releaseCommit, err)
	}
	if err := goBuild(root, bins.new); err != nil {
		t.Fatalf("build the working tree: %v", err)
	}
	t.Logf("built the release %.7s and the working tree in %v", releaseCommit, time.Since(start).Round(time.Millisecond))
	return bins
}

// extract writes commit's tree into dir: git archive | tar -x.
func extract(root, commit, dir string) error {
	archive := exec.Command("git", "archive", "--format=tar", commit)
	archive.Dir = root
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return fmt.Errorf("git archive %s: %w", commit, err)
	}
	untar.Stdin = pipe
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return fmt.Errorf("tar -x: %w", err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return fmt.Errorf("git archive %s: %w: %s", commit, err, archiveErr.Bytes())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("tar -x of %s: %w: %s", commit, err, untarErr.Bytes())
	}
	return nil
}

// goBuild builds the policyd main package in dir to out. Both builds use
// -trimpath, so the release's packages that did not change come from the
// build cache.
func goBuild(dir, out string) error {
	// The main package is cmd/policyd; a release from before the CLI left
	// the module root has it at the root.
	pkg := "./cmd/policyd"
	if _, err := os.Stat(filepath.Join(dir, "cmd", "policyd")); errors.Is(err, fs.ErrNotExist) {
		pkg = "."
	}
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build in %s: %w\n%s", dir, err, b)
	}
	return nil
}

// run runs a command in dir and returns its trimmed standard output.
func run(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return strings.TrimSpace(string(out)), nil
}
