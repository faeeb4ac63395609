package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

func driftCommand(c *adminClient) *cobra.Command {
	root := groupCommand("drift", "Read the drift reports")
	var f adminclient.DriftFilter
	table := func(reports []adminclient.DriftReport) func(io.Writer) error {
		return func(w io.Writer) error {
			tw := newTable(w)
			fmt.Fprintln(tw, "ID\tPHASE\tPAIR\tDELIVERY\tOBSERVATIONS\tLAST_SEEN")
			for _, r := range reports {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.Phase, r.PairID, r.Delivery, r.Observations, r.LastSeen.Format(time.RFC3339))
			}
			return tw.Flush()
		}
	}
	list := &cobra.Command{
		Use: "list", Short: "List drift reports, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			out, err := api.Drift(cmd.Context(), f)
			if err != nil {
				return err
			}
			return c.print(cmd, out, table(out.Reports))
		},
	}
	list.Flags().StringVar(&f.Phase, "phase", "", "Detected or Resolved")
	list.Flags().StringVar(&f.Delivery, "delivery", "", "pending, retrying, delivered, failed, suppressed or none")
	list.Flags().IntVar(&f.Limit, "limit", 0, "at most this many (default 100, at most 1000)")
	list.Flags().BoolVar(&f.Consistent, "consistent", false, "linearizable read through the leader")
	get := &cobra.Command{
		Use: "get ID", Short: "Show one drift report (JSON unless -o yaml)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			r, err := api.DriftReport(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return c.print(cmd, r, nil)
		},
	}
	root.AddCommand(list, get)
	return root
}
