package cli

import (
	"time"

	"github.com/spf13/cobra"
)

func rolloutCommand(c *adminClient) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Start and steer staged rollouts (alone: the deprecated name of proxy-status)",
		Long: `rollout's subcommands start and steer staged rollouts (docs/rollouts.md).

Alone, rollout [--wait D] is the name proxy-status had before "rollout"
came to mean staged rollouts only; it still works for one release, says so
on stderr, and asks GET /v1/rollout, which nodes of the last release serve.

Exit codes: as proxy-status's.`,
		Args: cobra.NoArgs,
		RunE: rolloutAlias(c, &wait),
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long (at most 5m) for every client to answer")
	cmd.AddCommand(stagedRolloutCommands(c)...)
	return cmd
}
