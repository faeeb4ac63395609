package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// errNotAllAnswered fails proxy-status when a NACK is pending or clients
// have not answered.
var errNotAllAnswered = errors.New("rollout not complete")

func proxyStatusCommand(c *adminClient) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "proxy-status",
		Short: "Show which discovery clients acknowledged each policy-set version",
		Long: `proxy-status shows, per policy-set version, the discovery (gRPC) clients
that ACKed it, NACKed it (with the error) or have not answered
(GET /v1/proxy-status). --wait D (up to 5m) waits until every client has
answered.

Exit codes: 0 every client ACKed its version; 1 a NACK is pending or clients
had not answered when the wait ran out; 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			st, err := api.ProxyStatus(cmd.Context(), wait)
			if err != nil {
				return err
			}
			return printProxyStatus(cmd, c, st)
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long (at most 5m) for every client to answer")
	return cmd
}

// printProxyStatus prints st and fails unless every client ACKed.
func printProxyStatus(cmd *cobra.Command, c *adminClient, st *adminclient.ProxyStatus) error {
	var nacked, pending int
	for _, v := range st.Versions {
		nacked += len(v.Nacked)
		pending += len(v.Pending)
	}
	err := c.print(cmd, st, func(w io.Writer) error {
		tw := newTable(w)
		fmt.Fprintln(tw, "VERSION\tDONE\tACKED\tNACKED\tPENDING")
		for _, v := range st.Versions {
			fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\n", short(v.Version), v.Done, len(v.Acked), len(v.Nacked), len(v.Pending))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, v := range st.Versions {
			for _, n := range v.Nacked {
				fmt.Fprintf(w, "NACK %s on %s (%s), kept %s: %s\n", n.Client, n.Node, n.Scope, short(n.LastGoodVersion), n.Message)
			}
		}
		return printUnreachable(w, st.Unreachable)
	})
	if err != nil {
		return err
	}
	switch {
	case nacked > 0:
		return fmt.Errorf("%w: %d NACK(s) pending", errNotAllAnswered, nacked)
	case !st.Done || pending > 0:
		return fmt.Errorf("%w: %d client(s) have not answered", errNotAllAnswered, pending)
	}
	return nil
}
