// Package e2e runs the built policyd binary as its users do: daemons
// started with `policyd serve` on loopback, and the CLI and sidecars as
// processes against them, exit codes and output included.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/server/servertest"
)

// repoRoot is the module root, where the tests build the binary and read
// examples/, deploy/ and the Makefile.
var repoRoot = filepath.Join("..", "..")

var (
	buildOnce sync.Once
	binPath   string
	errBuild  error
)

// policydBinary builds the binary once per test run.
func policydBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary: not in -short (make check)")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "policyd-bin-")
		if err != nil {
			errBuild = err
			return
		}
		binPath = filepath.Join(dir, "policyd")
		build := exec.Command("go", "build", "-o", binPath, "./cmd/policyd")
		build.Dir = repoRoot
		out, err := build.CombinedOutput()
		if err != nil {
			errBuild = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	return binPath
}

// daemon is a running `policyd serve`.
type daemon struct {
	cmd  *exec.Cmd
	logs *servertest.LogBuffer
	done chan error
}

func startDaemon(t *testing.T, dir string, args ...string) *daemon {
	t.Helper()
	return startDaemonEnv(t, dir, nil, args...)
}

// startDaemonEnv runs `policyd serve args...` with extra environment.
func startDaemonEnv(t *testing.T, dir string, env []string, args ...string) *daemon {
	t.Helper()
	return startBinary(t, policydBinary(t), dir, env, args...)
}

// startBinary runs `bin serve args...`, bin being a policyd binary.
func startBinary(t *testing.T, bin, dir string, env []string, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(servertest.CleanEnv(), env...)
	d := &daemon{cmd: cmd, logs: &servertest.LogBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = d.logs, d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
		d.done <- waitErr
	}()
	t.Cleanup(func() {
		// exited, not cmd.ProcessState, which Wait writes concurrently.
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			if <-exited; waitErr == nil {
				t.Logf("daemon %v exited cleanly before it was killed", args)
			}
		}
		if t.Failed() {
			t.Logf("daemon %v logs:\n%s", args, d.logs)
		}
	})
	return d
}

// kill is kill -9.
func (d *daemon) kill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-d.done; err == nil {
		t.Fatal("a killed daemon exited cleanly")
	}
}

// interrupt sends Ctrl-C and waits for a clean exit within a few seconds.
func (d *daemon) interrupt(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("daemon exited with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not stop within 10s of SIGINT")
	}
	return time.Since(start)
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	poll.Eventually(t, base+"/readyz to answer 200", func() error {
		resp, err := http.Get(base + "/readyz") //nolint:noctx // a local daemon, bounded by the client's default dial
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}, poll.Within(30*time.Second), poll.Every(50*time.Millisecond))
}

// cli runs the CLI and returns stdout, failing on a non-zero exit.
func cli(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := cliErr(t, dir, args...)
	if err != nil {
		t.Fatalf("policyd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func cliErr(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	return cliInput(t, dir, "", args...)
}

// cliInput runs the CLI with stdin (for `apply -f -`).
func cliInput(t *testing.T, dir, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, policydBinary(t), args...)
	cmd.Dir = dir
	cmd.Env = servertest.CleanEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// cliStdout runs the CLI and returns only what it wrote to stdout, the
// stream a script pipes into jq; notes on stderr stay out of it.
func cliStdout(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, policydBinary(t), args...)
	cmd.Dir = dir
	cmd.Env = servertest.CleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("policyd %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
