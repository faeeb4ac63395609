package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func reloadCommand(c *adminClient) *cobra.Command {
	root := groupCommand("reload", "Inspect the ConfigMap reload controller")
	status := &cobra.Command{
		Use: "status", Short: "Show the controller, its hash cache, queue, last restarts and errors", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			v, err := api.Reload(cmd.Context())
			if err != nil {
				return err
			}
			return c.print(cmd, v, func(w io.Writer) error {
				ct := v.Controller
				fmt.Fprintf(w, "controller %s", ct.State)
				if ct.Reason != "" {
					fmt.Fprintf(w, " (%s)", ct.Reason)
				}
				fmt.Fprintf(w, ", synced %v, namespace %q, selector %q, debounce %s\napplied index %d\n\n", ct.Synced, ct.Namespace, ct.Selector, ct.Debounce, v.AppliedIndex)
				tw := newTable(w)
				fmt.Fprintln(tw, "WHAT\tSCOPE\tCONFIGMAP\tHASH\tAT\tDETAIL")
				for _, h := range v.Cache {
					fmt.Fprintf(tw, "cache\t%s\t%s\t%s\t%s\t\n", h.Scope, h.ConfigMap, short(h.Hash), h.UpdatedAt.Format(time.RFC3339))
				}
				for _, p := range v.Queue {
					fmt.Fprintf(tw, "queued\t%s\t%s\t%s\t%s\t%s, %d attempts %s\n", p.Scope, p.ConfigMap, short(p.Hash), p.DueAt.Format(time.RFC3339), p.Reason, p.Attempts, p.LastError)
				}
				for _, r := range v.Restarts {
					fmt.Fprintf(tw, "restart\t%s\t%s\t%s\t%s\t%s: %s\n", r.Scope, r.ConfigMap, short(r.Hash), r.RestartedAt.Format(time.RFC3339), r.Reason, strings.Join(r.Patched, ","))
				}
				for _, e := range v.Errors {
					fmt.Fprintf(tw, "error\t%s\t%s\t%s\t%s\t%s\n", e.Scope, e.ConfigMap, short(e.Hash), e.FailedAt.Format(time.RFC3339), e.Error)
				}
				return tw.Flush()
			})
		},
	}
	root.AddCommand(status)
	return root
}
