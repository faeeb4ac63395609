// Command bench is policyd's load and latency harness. It starts a real
// policyd cluster on loopback, as separate processes of the policyd binary,
// drives a workload (writes, propagation, idle-memory, etcd, failover,
// rollout, shadow, authz, or the whole suite) and prints one JSON line per
// measured figure on stdout, followed by a readable summary table on
// stderr, so that stdout stays machine-readable.
//
//	go run ./bench <scenario> [flags]    # -h lists a scenario's flags
//	go run ./bench suite -results bench/results/latest.json   (make bench)
//
// The scenarios, targets and last figures are in docs/performance.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// defaultBinary is the -binary default, relative to the working directory.
// When it does not exist, bench builds policyd into its temp dir.
const defaultBinary = "bin/policyd"

// modulePath identifies the repository root (its go.mod).
const modulePath = "github.com/policyd/policyd"

// scenario is one workload that bench can run.
type scenario struct {
	name    string
	summary string
	// setup registers the scenario's flags on fs and returns the runner
	// that those flags configure.
	setup func(fs *flag.FlagSet) runner
}

// runner is a scenario configured by its flags.
type runner interface {
	// validate checks the flag values; it runs before anything is built
	// or started.
	validate() error
	// run runs the scenario in env until it is done or ctx ends.
	run(ctx context.Context, env *runEnv) error
}

// scenarios lists every scenario. Adding one is a new file defining a
// scenario value, which registers its own flags next to the common ones
// and reports its figures through runEnv.emit, plus a line here.
func scenarios() []scenario {
	return []scenario{
		writesScenario(),
		propagationScenario(),
		idleMemoryScenario(),
		etcdScenario(),
		failoverScenario(),
		rolloutScenario(),
		shadowScenario(),
		authzScenario(),
		decisionsScenario(),
		sourcesScenario(),
		consoleScenario(),
		impactScenario(),
		suiteScenario(),
	}
}

// commonFlags are the flags every scenario accepts.
type commonFlags struct {
	binary       string
	keep         bool
	out          string
	results      string
	readyTimeout time.Duration
	nodeLogLevel string
	nodeEnv      envList
	pin          pinFlags
}

// envList is a repeatable -node-env flag: POLICYD_KEY=value settings, or
// one of the Go runtime's own variables (runtimeEnv), so that a runtime
// setting such as GOGC can be tried on the nodes alone: setting it in
// bench's environment would change the load generator as well.
type envList []string

// runtimeEnv are the Go runtime variables -node-env accepts.
var runtimeEnv = []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK"}

func (e *envList) String() string { return strings.Join(*e, " ") }

func (e *envList) Set(v string) error {
	k, _, ok := strings.Cut(v, "=")
	policyd := strings.HasPrefix(k, "POLICYD_") && k != "POLICYD_"
	if !ok || !policyd && !slices.Contains(runtimeEnv, k) {
		return fmt.Errorf("want POLICYD_KEY=value or one of %s=value, got %q", strings.Join(runtimeEnv, ", "), v)
	}
	*e = append(*e, v)
	return nil
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.binary, "binary", defaultBinary, "policyd binary to run; when the default is missing, bench builds one into its temp dir")
	fs.BoolVar(&c.keep, "keep", false, "keep the temp dir (configs, data dirs, node logs) after the run")
	fs.StringVar(&c.out, "out", "", "also write the JSON lines to this file")
	fs.StringVar(&c.results, "results", "", "write every figure, the targets they carry and the machine (CPU, Go, git commit)\nto this JSON file (make bench: bench/results/latest.json)")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 60*time.Second, "how long to wait for the cluster to become ready")
	fs.StringVar(&c.nodeLogLevel, "node-log-level", "warn", "log.level of the policyd nodes (debug|info|warn|error)")
	fs.Var(&c.nodeEnv, "node-env", "POLICYD_KEY=value setting for every node, overriding its config file, or a Go runtime\nvariable for the policyd nodes alone, not bench or etcd ("+strings.Join(runtimeEnv, ", ")+"); repeatable,\ne.g. -node-env POLICYD_RAFT_COMMIT_TIMEOUT=5ms -node-env GOGC=200")
	c.pin.register(fs)
}

func main() {
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, restore the default behaviour so that a
		// second Ctrl-C kills bench at once; the nodes then die with it
		// (see procAttr).
		<-ctx.Done()
		stopSignals()
	}()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stopSignals()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, new(*usageError)):
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// usageError is a command-line mistake (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// run parses args (scenario name, then flags) and runs the scenario.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	all := scenarios()
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		printUsage(stderr, all)
		if len(args) == 0 {
			return &usageError{"no scenario given"}
		}
		return flag.ErrHelp
	}
	var sc *scenario
	for i := range all {
		if all[i].name == args[0] {
			sc = &all[i]
		}
	}
	if sc == nil {
		printUsage(stderr, all)
		return &usageError{fmt.Sprintf("unknown scenario %q", args[0])}
	}

	fs := flag.NewFlagSet(sc.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common commonFlags
	common.register(fs)
	scenarioRunner := sc.setup(fs)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
	}
	if err := scenarioRunner.validate(); err != nil {
		return &usageError{err.Error()}
	}
	// The CPUs bench starts with: what -node-cpus and -load-cpus may name,
	// here and in every suite step, even after a step has pinned bench.
	allowed, allowedErr := allowedCPUs()
	if err := common.pin.check(allowed, allowedErr); err != nil {
		return &usageError{err.Error()}
	}
	binarySet := false
	fs.Visit(func(f *flag.Flag) { binarySet = binarySet || f.Name == "binary" })

	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "bench: "+format+"\n", a...)
	}
	limit, err := raiseFileLimit()
	if err != nil {
		logf("warning: raising the open-files limit: %v", err)
	} else {
		logf("open-files limit: %d", limit)
	}

	root, err := repoRoot()
	if err != nil {
		return err
	}
	workDir, err := os.MkdirTemp("", "policyd-bench-")
	if err != nil {
		return fmt.Errorf("create temp dir: %w", err)
	}
	defer func() {
		if common.keep {
			logf("kept %s", workDir)
			return
		}
		if err := os.RemoveAll(workDir); err != nil {
			logf("warning: removing %s: %v", workDir, err)
		}
	}()

	binary, err := resolveBinary(ctx, common.binary, binarySet, root, workDir, stderr)
	if err != nil {
		return err
	}
	logf("policyd binary: %s", binary)

	rep, err := newReporter(stdout, common.out)
	if err != nil {
		return err
	}
	env := &runEnv{
		binary:       binary,
		workDir:      workDir,
		readyTimeout: common.readyTimeout,
		nodeLogLevel: common.nodeLogLevel,
		nodeEnv:      common.nodeEnv,
		allowedCPUs:  allowed,
		allowedErr:   allowedErr,
		fileLimit:    limit,
		stderr:       stderr,
		logf:         logf,
		emit:         rep.emit,
	}
	unpin, err := applyPins(env, common.pin)
	if err != nil {
		return err
	}
	// The machine is described before the run: its load average is the
	// other sessions' load, which the figures are read against.
	var machine machineInfo
	if common.results != "" {
		machine = collectMachine(ctx, root)
	}
	started := time.Now()
	runErr := scenarioRunner.run(ctx, env)
	if err := unpin(); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("unpin bench: %w", err))
	}
	rep.printSummary(stderr)
	if common.results != "" {
		m := machine
		m.NodeCPUs, m.LoadCPUs = env.nodeCPUs, env.loadCPUs
		doc, err := buildResults(m, "go run ./bench "+strings.Join(args, " "),
			started, time.Since(started), rep.figures, runErr)
		if err == nil {
			err = writeResults(common.results, doc)
		}
		if err != nil {
			runErr = errors.Join(runErr, err)
		} else {
			logf("results written to %s", common.results)
		}
	}
	if err := rep.close(); err != nil && runErr == nil {
		runErr = err
	}
	if runErr != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", runErr)
	}
	return runErr
}

func printUsage(w io.Writer, all []scenario) {
	fmt.Fprintln(w, "usage: go run ./bench <scenario> [flags]   (go run ./bench <scenario> -h for its flags)")
	fmt.Fprintln(w, "scenarios:")
	for _, s := range all {
		fmt.Fprintf(w, "  %-12s %s\n", s.name, s.summary)
	}
}

// runEnv is what a scenario gets to work with.
type runEnv struct {
	binary       string        // absolute path of the policyd binary
	workDir      string        // temp dir for this run, removed afterwards unless -keep
	readyTimeout time.Duration // bound on waiting for a cluster to become ready
	nodeLogLevel string        // log.level of the nodes
	nodeEnv      []string      // extra POLICYD_*=value settings for the nodes
	allowedCPUs  []int         // the CPUs bench started with
	allowedErr   error         // why allowedCPUs could not be read, if so
	nodeCPUs     string        // CPU list every node is pinned to (taskset -c); "" not pinned
	loadCPUs     string        // CPU list bench's own threads are pinned to; "" not pinned
	fileLimit    uint64        // open-files limit of bench and the nodes; 0 if unknown
	stderr       io.Writer     // progress, warnings and node logs on failure
	logf         func(format string, a ...any)
	emit         func(figure) error // reports one measured figure
}

// repoRoot finds the policyd repository root: the nearest directory at or
// above the working directory whose go.mod declares modulePath.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && declaresModule(string(b), modulePath) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod for %s at or above the working directory; run bench from the policyd repository", modulePath)
		}
		dir = parent
	}
}

func declaresModule(gomod, path string) bool {
	for line := range strings.SplitSeq(gomod, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == path {
			return true
		}
	}
	return false
}

// resolveBinary returns the absolute path of the policyd binary to run. A
// missing default binary is built into workDir; a missing binary given
// explicitly is an error, since it is most likely a typo.
func resolveBinary(ctx context.Context, binary string, explicit bool, root, workDir string, stderr io.Writer) (string, error) {
	abs, err := filepath.Abs(binary)
	if err != nil {
		return "", fmt.Errorf("-binary %q: %w", binary, err)
	}
	st, err := os.Stat(abs)
	switch {
	case err == nil && st.Mode().IsRegular():
		return abs, nil
	case err == nil:
		return "", fmt.Errorf("-binary %q: not a regular file", binary)
	case !errors.Is(err, os.ErrNotExist) || explicit:
		return "", fmt.Errorf("-binary: %w", err)
	}
	out := filepath.Join(workDir, "policyd")
	fmt.Fprintf(stderr, "bench: %s not found; building %s (go build -o %s ./cmd/policyd)\n", binary, out, out)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/policyd")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build -o %s ./cmd/policyd in %s: %w", out, root, err)
	}
	return out, nil
}
