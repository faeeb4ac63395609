//go:build linux

package chaos

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

var (
	flagDuration     = flag.Duration("chaos.duration", 75*time.Second, "how long clients run and faults are injected")
	flagSeed         = flag.Int64("chaos.seed", 0, "random seed of the fault schedule and the operation mix (0: from the clock)")
	flagClients      = flag.Int("chaos.clients", 6, "concurrent REST clients")
	flagCheckTimeout = flag.Duration("chaos.check-timeout", 5*time.Minute, "longest porcupine may search; a search that does not finish fails the run as inconclusive")
	flagFaults       = flag.String("chaos.faults", "kill,pause,partition,transfer,membership", "fault kinds to inject, comma-separated")
	flagBinary       = flag.String("chaos.binary", "", "policyd binary to test instead of building this module")
	flagLogStore     = flag.String("chaos.log-store", "", "raft.log_store of the nodes (wal|boltdb; empty: the default, wal); make test runs both")
	flagKeep         = flag.Bool("chaos.keep", false, "keep the run directory (logs, history) even when the run passes")
)

// policydBin is the binary under test, built by TestMain.
var policydBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("chaos: skipped under -short (make check): it runs clusters of real processes")
		os.Exit(0)
	}
	if *flagBinary != "" {
		policydBin = *flagBinary
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "policyd-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
	policydBin = filepath.Join(dir, "policyd")
	build := exec.Command("go", "build", "-o", policydBin, "github.com/policyd/policyd/cmd/policyd")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: go build: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
