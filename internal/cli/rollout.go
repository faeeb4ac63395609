package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
)

// errRolloutNotDone fails rollout when a NACK is pending or clients have
// not answered.
var errRolloutNotDone = errors.New("rollout not complete")

func rolloutCommand(c *adminClient) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Show which discovery clients acknowledged each policy-set version",
		Long: `rollout shows, per policy-set version, the discovery (gRPC) clients that
ACKed it, NACKed it (with the error) or have not answered. --wait D (up to
5m) waits until every client has answered. Its subcommands start and steer
staged rollouts (docs/rollouts.md).

Exit codes: 0 every client ACKed its version; 1 a NACK is pending or clients
had not answered when the wait ran out; 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ro, err := api.Rollout(cmd.Context(), wait)
			if err != nil {
				return err
			}
			var nacked, pending int
			for _, v := range ro.Versions {
				nacked += len(v.Nacked)
				pending += len(v.Pending)
			}
			err = c.print(cmd, ro, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "VERSION\tDONE\tACKED\tNACKED\tPENDING")
				for _, v := range ro.Versions {
					fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\n", short(v.Version), v.Done, len(v.Acked), len(v.Nacked), len(v.Pending))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				for _, v := range ro.Versions {
					for _, n := range v.Nacked {
						fmt.Fprintf(w, "NACK %s on %s (%s), kept %s: %s\n", n.Client, n.Node, n.Scope, short(n.LastGoodVersion), n.Message)
					}
				}
				return printUnreachable(w, ro.Unreachable)
			})
			if err != nil {
				return err
			}
			switch {
			case nacked > 0:
				return fmt.Errorf("%w: %d NACK(s) pending", errRolloutNotDone, nacked)
			case !ro.Done || pending > 0:
				return fmt.Errorf("%w: %d client(s) have not answered", errRolloutNotDone, pending)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long (at most 5m) for every client to answer")
	cmd.AddCommand(stagedRolloutCommands(c)...)
	return cmd
}
