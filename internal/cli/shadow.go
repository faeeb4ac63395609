package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// shadowCommand is `policy shadow NAME`: a shadow policy's counts from
// the sidecars that evaluate it, summed across nodes (docs/rollouts.md).
func shadowCommand(c *adminClient) *cobra.Command {
	return &cobra.Command{
		Use:   "shadow NAME",
		Short: "Show where a shadow policy would have decided otherwise than the enforced policies",
		Long: "Show a shadow policy's counts reported by the sidecars, summed across nodes: would_block " +
			"(it would have denied what the enforced policies allowed), would_allow (the reverse) and evaluated, " +
			"in total and per sidecar scope (org/team/employee). Each node counts since it started.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			v, err := api.PolicyShadow(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printValue(cmd.OutOrStdout(), c.output, v, func(w io.Writer) error { return shadowTable(w, v) })
		},
	}
}

func shadowTable(w io.Writer, v *adminclient.ShadowView) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "SCOPE\tWOULD BLOCK\tWOULD ALLOW\tEVALUATED")
	for _, s := range v.ByScope {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", s.Scope, s.WouldBlock, s.WouldAllow, s.Evaluated)
	}
	fmt.Fprintf(tw, "TOTAL\t%d\t%d\t%d\n", v.Totals.WouldBlock, v.Totals.WouldAllow, v.Totals.Evaluated)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Unreachable) > 0 {
		_, err := fmt.Fprintf(w, "unreachable nodes (their sidecars' counts are missing): %s\n", strings.Join(v.Unreachable, ", "))
		return err
	}
	return nil
}
