package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// clientsCommand lists the connected sidecars, filtered on the client side:
// --scope matches a prefix, which the server's exact org/team/employee
// filters do not, and a server older than them would ignore them.
func clientsCommand(c *adminClient) *cobra.Command {
	var node, scope, state string
	cmd := &cobra.Command{
		Use:   "clients",
		Short: "List the sidecars connected to every node",
		Long: `clients lists every connected sidecar, cluster-wide. --scope is
org[/team[/employee]] and matches that identity and those under it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			all, err := api.Clients(cmd.Context())
			if err != nil {
				return err
			}
			out := &adminclient.ClientList{Clients: []adminclient.ClientInfo{}, Unreachable: all.Unreachable}
			for _, cl := range all.Clients {
				if (node == "" || cl.Node == node) && (state == "" || cl.State == state) && inScope(cl, scope) {
					out.Clients = append(out.Clients, cl)
				}
			}
			return c.print(cmd, out, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "NODE\tCLIENT\tTRANSPORT\tSCOPE\tVERSION\tSTATE\tLAST_HEALTH_CHECK")
				for _, cl := range out.Clients {
					st := cl.State
					if cl.NackMessage != "" {
						st += ": " + cl.NackMessage
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s/%s\t%s\t%s\t%s\n", cl.Node, cl.ClientAddress, cl.Transport,
						cl.Org, cl.Team, cl.Employee, short(cl.Version), st, cl.LastActive.Format(time.RFC3339))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				return printUnreachable(w, out.Unreachable)
			})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "only clients of this node")
	cmd.Flags().StringVar(&scope, "scope", "", "only clients of org[/team[/employee]]")
	cmd.Flags().StringVar(&state, "state", "", "only clients in this state: pending, acked or nacked")
	return cmd
}

// inScope matches a client against org[/team[/employee]].
func inScope(cl adminclient.ClientInfo, scope string) bool {
	if scope == "" {
		return true
	}
	have := []string{cl.Org, cl.Team, cl.Employee}
	for i, want := range strings.SplitN(scope, "/", 3) {
		if want != "" && have[i] != want {
			return false
		}
	}
	return true
}
