// Command policyd is the policy control plane: `policyd serve` runs a node,
// and the other subcommands (internal/cli) are its clients and sidecars.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/policyd/policyd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.ExitCode(err))
}
