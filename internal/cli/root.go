// Package cli is the policyd command line: the cobra command tree that
// cmd/policyd runs. `policyd serve` runs a node; watch and authz are
// sidecars built on the client SDK; snapshot restore and recover work
// offline on a data directory; every other command is a client of a node's
// admin REST API through adminclient.
//
// Each top-level command lives in the file of its name (policy.go, watch.go,
// ...); root.go holds Run, the exit codes and the one list of commands.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// ExitCode is the process exit code for Run's error: 0 for nil, 2 for a
// usage error, 1 for any other failure.
func ExitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

// reportedError is a failure the command has already reported (serve logs
// a damaged or full data directory as its last line): exit code 1, printed
// once.
type reportedError struct{ err error }

func (e *reportedError) Error() string { return e.err.Error() }
func (e *reportedError) Unwrap() error { return e.err }

// usageError marks command-line mistakes (exit code 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// Run executes one CLI invocation with args (without the program name);
// ctx ends on SIGINT/SIGTERM. Errors are printed to stderr, once.
//
// Exit codes (ExitCode): 0 success; 1 a failure (an error answer, no server
// reachable, some documents of an apply failed, a rollout not complete);
// 2 a usage error (an unknown command or flag, a wrong argument count).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if re := (*reportedError)(nil); err != nil && !errors.As(err, &re) {
		fmt.Fprintln(stderr, "policyd:", oneLine(err))
	}
	return err
}

// rootCommand is the whole command tree. Every top-level command is listed
// here, and each is built in the file of its name.
func rootCommand() *cobra.Command {
	root := groupCommand("policyd", "Replicated policy control plane for sidecars and agent proxies")
	root.SilenceErrors = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })

	cl := &adminClient{}
	cl.registerFlags(root)
	root.AddCommand(
		serveCommand(),
		policyCommand(cl),
		employeeCommand(cl),
		eventsCommand(cl),
		clusterCommand(cl),
		clientsCommand(cl),
		decisionsCommand(cl),
		proxyStatusCommand(cl),
		rolloutCommand(cl),
		reloadCommand(cl),
		sourcesCommand(cl),
		driftCommand(cl),
		watchCommand(),
		authzCommand(),
		snapshotCommand(cl),
		recoverCommand(),
		versionCommand(cl),
	)
	usageArgs(root)
	return root
}

// groupCommand is a command that only holds subcommands. Run alone it
// prints its help; with an argument that names no subcommand it is a usage
// error (cobra would print the help and exit 0).
func groupCommand(use, short string) *cobra.Command {
	return &cobra.Command{
		Use: use, Short: short, SilenceUsage: true,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if cmd.SuggestionsMinimumDistance <= 0 {
				cmd.SuggestionsMinimumDistance = 2
			}
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return &usageError{errors.New(msg + " (see --help)")}
		},
	}
}

// usageArgs makes every argument-count error of the tree a usage error
// (exit code 2), and silences the usage dump on run-time errors.
func usageArgs(cmd *cobra.Command) {
	cmd.SilenceUsage = true
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return &usageError{err}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		usageArgs(sub)
	}
}

// oneLine keeps an error on one line, as scripts read the last line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " ")), " ")
}
