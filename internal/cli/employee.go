package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// employeeCommand is `policyd employee`: the shared resource commands and
// the revision history.
func employeeCommand(c *adminClient) *cobra.Command {
	r := resource{
		noun: "employee", plural: "employees", key: "id",
		listFlags: []string{"org", "team"},
		list: func(api *adminclient.Client, ctx context.Context, f map[string]string, consistent bool) (any, func(io.Writer) error, error) {
			out, err := api.Employees(ctx, adminclient.EmployeeFilter{Org: f["org"], Team: f["team"], Consistent: consistent})
			if err != nil {
				return nil, nil, err
			}
			return out, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "ID\tORG\tTEAM\tSTATUS\tREVISION")
				for _, e := range out.Employees {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", e.ID, e.Org, e.Team, e.Status, e.Revision)
				}
				return tw.Flush()
			}, nil
		},
		get: func(api *adminclient.Client, ctx context.Context, key string) (any, error) {
			return api.Employee(ctx, key)
		},
		put: (*adminclient.Client).PutEmployee,
		del: (*adminclient.Client).DeleteEmployee,
	}
	cmd := resourceCommand(c, r)
	cmd.AddCommand(historyCommands(c, r)...)
	return cmd
}
