package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// rolloutAlias runs "policyd rollout" without a subcommand, proxy-status's
// name before "rollout" came to mean staged rollouts only: it says so on
// stderr and asks GET /v1/rollout, which nodes of the last release serve.
func rolloutAlias(c *adminClient, wait *time.Duration) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		fmt.Fprintln(cmd.ErrOrStderr(), "policyd: \"rollout\" without a subcommand is deprecated and will be removed in the next release; use \"proxy-status\"")
		api, err := c.client()
		if err != nil {
			return err
		}
		st, err := api.Rollout(cmd.Context(), *wait) //nolint:staticcheck // the deprecated path, on purpose: nodes of the last release serve only it
		if err != nil {
			return err
		}
		return printProxyStatus(cmd, c, st)
	}
}
