package cli

import (
	"fmt"
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.ErrOrStderr(), "policyd: \"rollout\" without a subcommand is deprecated and will be removed in the next release; use \"proxy-status\"")
			api, err := c.client()
			if err != nil {
				return err
			}
			st, err := api.Rollout(cmd.Context(), wait) //nolint:staticcheck // the deprecated path, on purpose: nodes of the last release serve only it
			if err != nil {
				return err
			}
			return printProxyStatus(cmd, c, st)
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long (at most 5m) for every client to answer")
	cmd.AddCommand(stagedRolloutCommands(c)...)
	return cmd
}
