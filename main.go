// Command policyd is the policy control plane: `policyd serve` runs a node;
// the other subcommands are clients of a node's admin REST API.
//
// main only maps errors to exit codes; the work lives in run.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
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

// run executes one CLI invocation; ctx ends on SIGINT/SIGTERM.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := &cobra.Command{
		Use:           "policyd",
		Short:         "Replicated policy control plane for sidecars and agent proxies",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })

	cl := &adminClient{}
	cl.registerFlags(root)
	root.AddCommand(
		serveCommand(),
		policyCommand(cl),
		employeeCommand(cl),
		eventsCommand(cl),
		clusterCommand(cl),
		watchCommand(),
		snapshotCommand(cl),
		recoverCommand(),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "policyd", version) },
		},
	)
	err := root.ExecuteContext(ctx)
	if re := (*reportedError)(nil); err != nil && !errors.As(err, &re) {
		fmt.Fprintln(stderr, "policyd:", err)
	}
	return err
}
