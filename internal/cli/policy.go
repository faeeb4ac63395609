package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// policyCommand is `policyd policy`: the shared resource commands, the
// revision history, the shadow counts and impact analysis.
func policyCommand(c *adminClient) *cobra.Command {
	r := resource{
		noun: "policy", plural: "policies", key: "name",
		listFlags: []string{"org", "team", "employee", "kind"},
		list: func(api *adminclient.Client, ctx context.Context, f map[string]string, consistent bool) (any, func(io.Writer) error, error) {
			out, err := api.Policies(ctx, adminclient.PolicyFilter{Org: f["org"], Team: f["team"], Employee: f["employee"], Kind: f["kind"], Consistent: consistent})
			if err != nil {
				return nil, nil, err
			}
			return out, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "NAME\tKIND\tSCOPE\tREVISION\tSOURCE")
				for _, p := range out.Policies {
					src := p.Source
					if src == "" {
						src = "api"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", p.Name, p.Kind, scopeString(p.Scope), p.Revision, src)
				}
				return tw.Flush()
			}, nil
		},
		get: func(api *adminclient.Client, ctx context.Context, key string) (any, error) {
			return api.Policy(ctx, key)
		},
		put: (*adminclient.Client).PutPolicy,
		del: (*adminclient.Client).DeletePolicy,
	}
	cmd := resourceCommand(c, r)
	cmd.AddCommand(historyCommands(c, r)...)
	cmd.AddCommand(shadowCommand(c), impactCommand(c))
	return cmd
}

// scopeString renders a scope for tables: "global", or its set fields
// ("org=acme,team=red").
func scopeString(s adminclient.Scope) string {
	if s == (adminclient.Scope{}) {
		return "global"
	}
	var parts []string
	for _, f := range [][2]string{{"org", s.Org}, {"team", s.Team}, {"employee", s.Employee}} {
		if f[1] != "" {
			parts = append(parts, f[0]+"="+f[1])
		}
	}
	return strings.Join(parts, ",")
}
