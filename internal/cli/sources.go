package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

func sourcesCommand(c *adminClient) *cobra.Command {
	root := groupCommand("sources", "Inspect and sync the policy sources (Kubernetes resources, Git)")
	status := &cobra.Command{
		Use: "status", Short: "Show each source's last sync, the policies it owns, a pending prune refusal and the last error", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			v, err := api.Sources(cmd.Context())
			if err != nil {
				return err
			}
			return c.print(cmd, v, func(w io.Writer) error { return printSources(w, v) })
		},
	}
	var allowPrune bool
	syncCmd := &cobra.Command{
		Use:   "sync NAME",
		Short: "Ask the leader to sync a source now",
		Long: `sync asks the leader's reconciler of source NAME (kubernetes or git:NAME) to
read it and sync at once. --allow-prune lets that one sync delete more than
sources.max_prune_ratio of the source's policies: use it after checking the
refusal that sources status shows.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			res, err := api.SyncSource(cmd.Context(), args[0], allowPrune)
			if err != nil {
				return err
			}
			return c.print(cmd, res, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "sync of %s requested at index %d\n", res.Source, res.RequestIndex)
				return err
			})
		},
	}
	syncCmd.Flags().BoolVar(&allowPrune, "allow-prune", false, "let this sync delete beyond sources.max_prune_ratio")
	root.AddCommand(status, syncCmd)
	return root
}

func printSources(w io.Writer, v *adminclient.SourceList) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "SOURCE\tPOLICIES\tSYNCED\tAT\tLAST\tOBSERVED\tDETAIL")
	for _, s := range v.Sources {
		at := "-"
		if !s.SyncedAt.IsZero() {
			at = s.SyncedAt.Format(time.RFC3339)
		}
		last, observed, detail := "-", "-", ""
		if r := s.Reconciler; r != nil {
			last, observed, detail = r.LastResult, short(r.ObservedRevision), r.LastError
			if r.Note != "" {
				detail = r.Note + "; " + detail
			}
			if r.PruneRefused != nil {
				detail = fmt.Sprintf("prune refused: %d of %d policies; %s", r.PruneRefused.Deletes, r.PruneRefused.Owned, detail)
			}
		} else if v.Leader != "" {
			detail = "reconciler status: ask the leader at " + v.Leader
		}
		if s.PruneAllowed {
			detail = "prune allowed for the next sync; " + detail
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Policies, short(s.SyncedRevision), at, last, observed, detail)
	}
	return tw.Flush()
}
